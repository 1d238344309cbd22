"""`python -m tests.differential [--examples N] [--no-scenarios]`: compare kbroker with Apache Kafka 3.9 request by
request and print the table per API and version (exit 1 when an answer differs for a reason known.py does not
give; rows "API (known: reason)" hold the answers that differ for one of its reasons)."""

from __future__ import annotations

import argparse
import sys

from tests.differential import known
from tests.differential.harness import Pair, Tally
from tests.differential.normalisation import RULES
from tests.differential.session import brokers, run_all


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.differential", description=__doc__)
    parser.add_argument("--examples", type=int, default=20, help="generated requests per API and version")
    parser.add_argument("--no-scenarios", action="store_true", help="only the generated requests")
    parser.add_argument("--examples-shown", type=int, default=3, help="differences shown per API and version")
    parser.add_argument(
        "--by-api", action="store_true", help="also the table with the versions of an API summed"
    )
    parser.add_argument(
        "--dump", type=argparse.FileType("w"), help="write every difference in full to this file"
    )
    args = parser.parse_args(argv)
    from bench.peers.maven import ArtifactUnavailable

    try:
        with brokers() as (kbroker, kafka):
            pair = Pair(
                kbroker, kafka, Tally(args.examples_shown, args.dump), classify=known.GeneratedReasons()
            )
            try:
                tally, versions = run_all(pair, args.examples, scenarios=not args.no_scenarios)
            finally:
                pair.close()
    except ArtifactUnavailable as e:
        print(f"Kafka 3.9 is unavailable here: {e}", file=sys.stderr)
        return 2
    print("ApiVersions differences (kbroker vs Kafka 3.9):")
    print("\n".join(f"  {line}" for line in versions) or "  none")
    print(f"\nNormalised fields ({len(RULES)}): " + ", ".join(r.field for r in RULES))
    print(tally.table())
    if args.by_api:
        print("\nPer API (all versions):")
        print(tally.by_api().table(examples=False).replace("  -1", "   "))
    print(f"\n{tally.unexplained()} differences without a reason in tests/differential/known.py")
    return 1 if tally.unexplained() else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

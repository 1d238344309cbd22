"""`python -m tests.differential [--examples N] [--no-scenarios]`: compare kbroker with Apache Kafka 3.9 request by
request and print the table per API and version (exit 1 when any answer differs)."""

from __future__ import annotations

import argparse
import sys

from tests.differential.harness import Pair
from tests.differential.normalisation import RULES
from tests.differential.session import brokers, run_all


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.differential", description=__doc__)
    parser.add_argument("--examples", type=int, default=20, help="generated requests per API and version")
    parser.add_argument("--no-scenarios", action="store_true", help="only the generated requests")
    parser.add_argument("--examples-shown", type=int, default=3, help="differences shown per API and version")
    args = parser.parse_args(argv)
    from bench.peers.maven import ArtifactUnavailable

    try:
        with brokers() as (kbroker, kafka):
            pair = Pair(kbroker, kafka)
            pair.tally.keep = args.examples_shown
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
    return 1 if tally.total_different() else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

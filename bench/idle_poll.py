"""fetch_sessions' idle long-poll row alone, with kbroker from several checkouts and the mock in one run.

    python -m bench.idle_poll [--root CHECKOUT ...] [--env-b KEY=VALUE ...] [--consumers 100] [--window 15]
        [--reps 3] [--no-mock] [--profile out.raw] [--client java]

The row of bench.fetch_sessions (b) without its loading and Java runs: `--consumers` confluent-kafka consumers in one
group (round-robin) long-poll topics of 4 partitions, 10 partitions each (so `--consumers` x 10 / 4 topics, one
message in each partition), fetch.wait.max.ms at librdkafka's default 500 ms. Once the group is stable, a broker's
CPU over `--window` seconds divided by the Fetch requests the clients sent (librdkafka's statistics): CPU per idle
Fetch of 10 partitions. Each repetition runs every kbroker (each --root, each environment) and the mock in turn,
each freshly started, so the ratios compare runs minutes apart on this shared machine. `--profile` records py-spy
(raw, --gil), or for `*.perf` `perf record -g`, of the first kbroker's window in the first repetition. `--client java`:
the Java consumers of fetch_sessions' Java row instead (one fetch session each, incremental Fetches; their Fetch
count from the client's metrics), kbroker only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from bench import clients
from bench.fetch_sessions import idle_consumers, java_classpath
from bench.harness import ROOT, Ctx, KBroker, Peer, Perf, PySpy, Target, free_port, workdir


class RootBroker(KBroker):
    """A KBroker run from another checkout (cwd and module path), in an environment of its own."""

    def __init__(self, base: Path, root: Path, env: dict[str, str], overrides: dict[str, str]) -> None:
        super().__init__(base, overrides)
        self.root, self.env = root, env

    def start(self, timeout: float = 120.0) -> float:
        old = dict(os.environ)
        os.environ.update(self.env)
        try:
            return _start_from(self, timeout)
        finally:
            os.environ.clear()
            os.environ.update(old)


def _start_from(b: RootBroker, timeout: float) -> float:
    import bench.harness as harness

    saved = harness.ROOT
    harness.ROOT = b.root
    try:
        return KBroker.start(b, timeout)
    finally:
        harness.ROOT = saved


def one(
    ctx: Ctx,
    t: Target,
    nconsumers: int,
    window: float,
    tag: str,
    mport: int | None,
    profile: Path | None,
    client: str = "confluent-kafka",
) -> dict[str, Any]:
    topics = [f"idle_{k}" for k in range(max(1, nconsumers * 10 // 4))]
    t.create_topics(topics)
    clients.produce(
        t.bootstrap, clients.partitions_of(topics), 4 * len(topics), [b"x" * 100], {}, timeout=120
    )
    cp = java_classpath(ctx) if client == "java" else ""
    if profile is None:
        return idle_consumers(ctx, client, cp, t, topics, nconsumers, window, tag, mport)
    sampler = Perf if profile.suffix == ".perf" else PySpy
    return idle_consumers(
        ctx,
        client,
        cp,
        t,
        topics,
        nconsumers,
        window,
        tag,
        mport,
        during=lambda: sampler(t.pid, profile),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", action="append", type=Path, help="checkout(s) to run kbroker from (repeatable)")
    ap.add_argument(
        "--env-b", action="append", default=[], help="KEY=VALUE: also run each root with this environment"
    )
    ap.add_argument("--consumers", type=int, default=100)
    ap.add_argument("--window", type=float, default=15.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-mock", action="store_true")
    ap.add_argument("--profile", type=Path)
    ap.add_argument("--client", choices=["confluent-kafka", "java"], default="confluent-kafka")
    args = ap.parse_args()
    roots = [r.resolve() for r in (args.root or [ROOT])]
    envs: list[dict[str, str]] = [{}]
    if args.env_b:
        envs.append(dict(kv.split("=", 1) for kv in args.env_b))
    base = workdir(Path(os.environ.get("TMPDIR", "/tmp")), "idle-poll")
    ctx = Ctx(base=base, reps=args.reps, quick=False, scale=1.0, profile=False)
    results: dict[str, list[float]] = {}
    for rep in range(args.reps):
        runs: list[tuple[str, Any]] = [
            (f"{r}{' ' + ' '.join(e) if e else ''}", (r, e)) for r in roots for e in envs
        ]
        if not args.no_mock and args.client != "java":
            runs.append(("mock", None))
        for label, spec in runs:
            mport = None
            if spec is None:
                t: Target = Peer()
            else:
                mport = free_port()
                t = RootBroker(base, spec[0], spec[1], {"metrics.port": str(mport)})
            try:
                t.start()
                prof = args.profile if args.profile and rep == 0 and spec == (roots[0], envs[0]) else None
                r = one(
                    ctx, t, args.consumers, args.window, f"{rep}-{len(results)}", mport, prof, args.client
                )
            finally:
                t.stop()
            fetch_s = r["client_fetch_per_s"]
            us = r["cpu_per_s"] * 1e6 / fetch_s if fetch_s > 0 else float("nan")
            results.setdefault(label, []).append(us)
            extra = "; REBALANCED" if r["rebalanced"] else ""
            if spec is not None:
                rates = ", ".join(
                    f"{v:.0f} {k}" for k, v in sorted(r["rates"].items(), key=lambda kv: -kv[1]) if v >= 0.5
                )
                extra += f"; kbroker answered {rates} requests/s"
            print(
                f"rep {rep + 1} {label}: {100 * r['cpu_per_s']:.2f}% of a core, {fetch_s:.0f} Fetch/s, "
                f"{us:.0f} us per Fetch{extra}",
                flush=True,
            )
    mock = statistics.median(results["mock"]) if "mock" in results else None
    print("\nCPU per idle Fetch (10 partitions), median (range) over", args.reps, "reps:")
    for label, xs in results.items():
        m = statistics.median(xs)
        ratio = f", {m / mock:.2f}x the mock" if mock and label != "mock" else ""
        print(f"  {label}: {m:.0f} us ({min(xs):.0f}-{max(xs):.0f}){ratio}")


if __name__ == "__main__":
    sys.exit(main())

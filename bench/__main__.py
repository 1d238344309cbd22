"""python -m bench [WORKLOAD ...] [--quick] [--reps N] ... : kbroker vs librdkafka's mock cluster.

Workloads: produce, consume, transactions, authz, tls, latency, replication, failover, sizes, scale, restart,
fetch_sessions, rebalance, schema_registry, share_groups, footprint (default: all). Results go to bench/RESULTS.md
(with --quick: printed, and written only if --out is given).
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
import tempfile
import time
import traceback
from pathlib import Path

from bench import harness, page_cache, report, round_trip

WORKLOADS = ["produce", "consume", "transactions", "authz", "tls", "latency", "replication", "failover", "sizes",
             "scale", "restart", "fetch_sessions", "rebalance", "schema_registry", "share_groups", "footprint"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                    help=f"any of {', '.join(WORKLOADS)} (default: all)")
    ap.add_argument("--quick", action="store_true", help="smoke scale: ~1/10 of the messages, 1 repetition")
    ap.add_argument("--reps", type=int, default=None, help="repetitions per measurement (default 3, quick 1)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply message counts (default 1)")
    ap.add_argument("--restart-gb", type=float, default=None,
                    help="size of the log for the restart workload in GB (default 10, quick 0.2)")
    ap.add_argument("--latency-seconds", type=float, default=None,
                    help="duration of each end-to-end latency run (default 5, quick 2)")
    ap.add_argument("--budget", type=float, default=540,
                    help="seconds after which remaining repetitions/workloads are skipped (default 540)")
    ap.add_argument("--no-profile", dest="profile", action="store_false",
                    help="skip the py-spy runs against kbroker during produce and consume")
    ap.add_argument("--workdir", type=Path, default=Path(os.environ.get("KBROKER_BENCH_DIR", tempfile.gettempdir())),
                    help="where broker data directories are created (removed at exit)")
    ap.add_argument("--peers", default="kafka3.9,kafka4,tansu",
                    help="peers run beside kbroker and the mock where a workload supports them: any of "
                         "kafka3.9, kafka4, tansu, comma-separated, or 'none' (default: all three)")
    ap.add_argument("--kafka-heap", default="1g", help="Apache Kafka's -Xmx/-Xms (default 1g, as its start script)")
    ap.add_argument("--out", type=Path, default=None, help="markdown output (default bench/RESULTS.md unless --quick)")
    args = ap.parse_args(argv)

    workloads = args.workloads or WORKLOADS
    reps = args.reps or (1 if args.quick else 3)
    out = args.out or (None if args.quick else harness.ROOT / "bench" / "RESULTS.md")
    base = Path(tempfile.mkdtemp(prefix="kbroker-bench-", dir=args.workdir))
    harness._dirs.append(base)
    harness.install_signal_handlers()
    started, t0 = time.time(), time.monotonic()
    ctx = harness.Ctx(base=base, reps=reps, quick=args.quick, scale=args.scale, profile=args.profile,
                      deadline=t0 + args.budget,
                      log=lambda s: print(s, flush=True))
    ctx.extra["restart_gb"] = args.restart_gb if args.restart_gb is not None else (0.2 if args.quick else 10.0)
    ctx.extra["peers"] = [] if args.peers == "none" else [p for p in args.peers.split(",") if p]
    unknown = [p for p in ctx.extra["peers"] if p not in harness.PEERS]
    if unknown:
        ap.error(f"--peers: unknown {', '.join(unknown)} (known: {', '.join(harness.PEERS)})")
    ctx.extra["kafka_heap"] = args.kafka_heap
    ctx.extra["latency_seconds"] = args.latency_seconds or (2.0 if args.quick else 5.0)
    info = harness.machine_info()
    # Before any broker writes: what each new MiB of log costs on this machine, against rewriting cached pages.
    info["page_cache"] = page_cache.describe(base)
    # And what a loopback request costs any server that sleeps and wakes for it: the floor under CPU per request.
    info["round_trip"] = round_trip.describe()
    if info["record_walk"] != "compiled":
        print(f"warning: produce record walk in {info['record_walk']}", flush=True)
    command = "python -m bench " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    rows: list[harness.Row] = []
    rc = 0
    try:
        for w in workloads:
            if ctx.out_of_time(w):
                continue
            print(f"== {w}", flush=True)
            ws = time.monotonic()
            mod = importlib.import_module(f"bench.{w}")
            try:
                rows += mod.run(ctx)
            except KeyboardInterrupt:
                raise
            except Exception as e:  # noqa: BLE001 - one broken workload must not lose the others' results
                traceback.print_exc()
                logs = harness.save_logs(Path(tempfile.gettempdir()) / f"kbroker-bench-failed-{w}-{int(time.time())}")
                rows.append(harness.Row(w, "-", note=f"workload failed: {type(e).__name__}: {e} "
                                                     f"(kbroker logs kept in {logs[0].rsplit('/', 1)[0] if logs else '-'})"))
                rc = 1
            finally:
                harness.KBroker.instances.clear()
                harness.cleanup_children()
            print(f"   ({time.monotonic() - ws:.0f} s)", flush=True)
    except KeyboardInterrupt:
        print("interrupted: writing partial results", flush=True)
        rc = 130
    finally:
        harness.cleanup_children()
        text = report.render(rows, command, started, time.monotonic() - t0, info,
                             " ".join(f"{x:.2f}" for x in os.getloadavg()), ctx.profiles, ctx.skipped,
                             args.quick, reps, ctx.extra.get("unavailable"),
                             f"Apache Kafka: official jars (bench.peers.kafka), -Xmx{args.kafka_heap} "
                             f"-Xms{args.kafka_heap} and the G1 flags of its start script, log on disk in the "
                             "benchmark's temporary directory; 3.x on its own ZooKeeper, 4.x a KRaft "
                             "broker+controller node. Tansu: memory:// storage engine. "
                             "A '-' cell: that broker did not run the row.")
        print()
        print(text)
        if out is not None:
            report.write(out, text)
            print(f"\nwritten to {out}")
        harness.cleanup_all()
    return rc


if __name__ == "__main__":
    sys.exit(main())

"""Replication-round micro-benchmark: CPU of a 3-broker cluster per acks=all Produce request, for before/after
comparisons of the replication path (issue 34).

    python -m bench.replication_round [--root CHECKOUT ...] [--requests N] [--pipeline K] [--reps R]

Starts ZooKeeper and three `python -m kbroker.broker` processes from each CHECKOUT (default: this one), creates topic
`bench` with one partition, replicas [1, 2, 3] (broker 1 leads) and min.insync.replicas=2, and sends N Produce v9
requests (acks=all, one 10-record batch of 100-byte values) to the leader over one connection with K in flight
(default 1). With one in flight every request is one whole replication round: the append, both followers' parked
fetches answered, their appends, their next fetches moving the high watermark, the answer. Reports each broker's CPU
(its CPU-time clock, which other load disturbs far less than wall time) per request: the leader's and the
followers'. Checkouts alternate repetition by repetition; compare medians.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness import ROOT

_CHILD = r"""
import os, socket, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, os.getcwd())
from bench import harness
from bench.harness import KBroker, workdir
from bench.peers.zookeeper import ZooKeeperServer
from bench.produce_path import recv_response
from kbroker.protocol import codec
from kbroker.protocol.messages import ProduceRequest, RequestHeader
from kbroker.protocol.records import build_batch

n, k = int(sys.argv[1]), int(sys.argv[2])
base = Path(tempfile.mkdtemp(prefix="kbroker-bench-round-"))
harness._dirs.append(base)
zk = ZooKeeperServer(workdir(base, "zookeeper")).start()
brokers = [KBroker(base, {"zookeeper.connect": zk.connect, "broker.id": str(i)}) for i in (1, 2, 3)]
try:
    for b in brokers:
        b.start()
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": brokers[0].bootstrap, "log_level": 3})
    deadline = time.monotonic() + 120
    while len(admin.list_topics(timeout=10).brokers) < 3:
        if time.monotonic() > deadline:
            raise RuntimeError("three brokers did not register")
        time.sleep(0.25)
    for f in admin.create_topics([NewTopic("bench", num_partitions=1, replication_factor=-1,
                                           replica_assignment=[[1, 2, 3]],
                                           config={"min.insync.replicas": "2"})]).values():
        f.result(60)
    while True:
        p = admin.list_topics("bench", timeout=10).topics["bench"].partitions.get(0)
        if p is not None and p.leader == 1 and len(p.isrs) == 3:
            break
        if time.monotonic() > deadline:
            raise RuntimeError("bench-0 without its full ISR")
        time.sleep(0.1)
    sock = socket.create_connection(("127.0.0.1", brokers[0].port))
    batch = build_batch([(None, b"v" * 100, (), 1_700_000_000_000 + i) for i in range(10)])
    body = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=30000, topic_data=[
        ProduceRequest.TopicProduceData(name="bench", partition_data=[
            ProduceRequest.PartitionProduceData(index=0, records=batch)])])
    frame = bytes(codec.encode_request(RequestHeader(request_api_key=0, request_api_version=9, correlation_id=0,
                                                     client_id="bench"), body))

    def rounds(count):
        sent = received = 0
        while received < count:
            while sent < count and sent - received < k:
                sock.sendall(frame)
                sent += 1
            part = recv_response(sock, 0, 9).responses[0].partition_responses[0]
            if part.error_code:
                raise RuntimeError(f"Produce to bench-0: error {part.error_code}")
            received += 1

    rounds(500)  # code paths warm, fetch sessions open
    cpu0 = [b.cpu() for b in brokers]
    t0 = time.perf_counter()
    rounds(n)
    wall = time.perf_counter() - t0
    print(" ".join(f"{(b.cpu() - c) * 1e6 / n:.2f}" for b, c in zip(brokers, cpu0)), f"{wall * 1e6 / n:.1f}")
finally:
    for b in brokers:
        b.stop()
    zk.stop()
    harness.cleanup_all()
"""


def run_once(root: Path, requests: int, pipeline: int) -> tuple[float, float, float, float]:
    """(leader, follower, follower CPU us per request, wall us per request) for one cluster from `root`."""
    with tempfile.TemporaryDirectory(prefix="kbroker-bench-") as tmp:
        script = Path(tmp) / "round.py"
        script.write_text(_CHILD)
        out = subprocess.run(
            [sys.executable, str(script), str(requests), str(pipeline)],
            cwd=root,
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        ).stdout.split()
    leader, f1, f2, wall = (float(x) for x in out[-4:])
    return leader, f1, f2, wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.replication_round", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "--root", action="append", type=Path, help="checkout(s) to run the brokers from (repeatable)"
    )
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--pipeline", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    roots = [r.resolve() for r in (args.root or [ROOT])]
    results: dict[Path, list[tuple[float, float, float, float]]] = {r: [] for r in roots}
    for rep in range(args.reps):
        for root in roots:
            load = os.getloadavg()[0]
            r = run_once(root, args.requests, args.pipeline)
            results[root].append(r)
            print(
                f"rep {rep + 1} {root}: {sum(r[:3]):.1f} us CPU per acks=all request (leader {r[0]:.1f}, followers "
                f"{r[1]:.1f} {r[2]:.1f}), {r[3]:.0f} us wall; load {load:.2f}",
                flush=True,
            )
    for root, rs in results.items():
        total = [sum(r[:3]) for r in rs]
        print(
            f"{root}: median {statistics.median(total):.1f} us CPU per request ({min(total):.1f}-{max(total):.1f}), "
            f"leader {statistics.median(r[0] for r in rs):.1f}, followers "
            f"{statistics.median((r[1] + r[2]) / 2 for r in rs):.1f} each"
        )
    return 0


if __name__ == "__main__":
    socket.setdefaulttimeout(60)
    sys.exit(main())

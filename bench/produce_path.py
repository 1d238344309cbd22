"""Produce-path micro-benchmark: broker CPU per Produce request, for before/after comparisons of the request path.

    python -m bench.produce_path [--root CHECKOUT] [--requests N] [--pipeline K] [--records M] [--reps R]

Starts `python -m broker` from CHECKOUT (default: this one) on loopback, sends N ProduceRequests (acks=1, one
M-record batch, default 10, of 100-byte values to one partition) over one connection with K in flight, and reports
the broker process's CPU time (utime+stime from /proc, which other load on the machine disturbs far less than wall
time) per request. Run it for two checkouts in alternation and compare medians.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from protocol import codec
from protocol.messages import ProduceRequest, RequestHeader
from protocol.records import build_batch

CLK_TCK = os.sysconf("SC_CLK_TCK")
ROOT = Path(__file__).resolve().parent.parent


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return bytes(buf)


def run_once(root: Path, requests: int, pipeline: int, records: int = 10) -> float:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="kbroker-bench-") as data:
        props = Path(data) / "server.properties"
        props.write_text(f"listeners=PLAINTEXT://127.0.0.1:{port}\nlog.dirs={data}/logs\nnum.network.threads=1\n"
                         "num.partitions=1\n")
        proc = subprocess.Popen([sys.executable, "-m", "broker", str(props)], cwd=root,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            batch = build_batch([(None, b"v" * 100, (), 1_700_000_000_000 + i) for i in range(records)])
            body = ProduceRequest(transactional_id=None, acks=1, timeout_ms=30000, topic_data=[
                ProduceRequest.TopicProduceData(name="bench", partition_data=[
                    ProduceRequest.PartitionProduceData(index=0, records=batch)])])

            def frame(cid: int) -> bytes:
                header = RequestHeader(request_api_key=0, request_api_version=9, correlation_id=cid,
                                       client_id="bench")
                return bytes(codec.encode_request(header, body))

            def roundtrip(n: int, start_cid: int) -> None:
                sent = received = 0
                while received < n:
                    while sent < n and sent - received < pipeline:
                        sock.sendall(frame(start_cid + sent))
                        sent += 1
                    (size,) = struct.unpack(">i", recv_exact(sock, 4))
                    recv_exact(sock, size)
                    received += 1

            roundtrip(200, 1)  # topic auto-created, code paths warm
            cpu0 = cpu_seconds(proc.pid)
            roundtrip(requests, 1000)
            cpu1 = cpu_seconds(proc.pid)
            sock.close()
            return (cpu1 - cpu0) / requests * 1e6
        finally:
            proc.terminate()
            proc.wait(30)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.produce_path", description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", action="append", type=Path, help="checkout(s) to run the broker from (repeatable)")
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--pipeline", type=int, default=8)
    ap.add_argument("--records", type=int, default=10, help="records per batch")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    roots = args.root or [ROOT]
    results: dict[Path, list[float]] = {r: [] for r in roots}
    for rep in range(args.reps):
        for r in roots:  # alternate, so drifting machine load hits every checkout alike
            us = run_once(r, args.requests, args.pipeline, args.records)
            results[r].append(us)
            print(f"rep {rep + 1} {r}: {us:.1f} us broker CPU per produce request", flush=True)
    for r, values in results.items():
        print(f"{r}: median {statistics.median(values):.1f} us/request (min {min(values):.1f}, "
              f"max {max(values):.1f}, {len(values)} runs of {args.requests} requests)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

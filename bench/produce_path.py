"""Produce-path micro-benchmark: broker CPU per Produce request, for before/after comparisons of the request path.

    python -m bench.produce_path [--root CHECKOUT] [--requests N] [--pipeline K] [--records M] [--partitions P]
                                 [--reps R]

Starts `python -m kbroker.broker` from CHECKOUT (default: this one) on loopback, creates topic `bench` with P partitions
(default 1), sends N ProduceRequests (acks=1, one M-record batch, default 10, of 100-byte values, to the partitions in
turn) over one connection with K in flight, and reports the broker process's CPU time (its CPU-time clock, which
other load on the machine disturbs far less than wall time) per request. Every answer is decoded and must carry no
error and the next offset, so what is measured is the append path (until 2026-11-26 the topic was never created and
every request was answered UNKNOWN_TOPIC_OR_PARTITION). Run it for two checkouts in alternation and compare medians.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kbroker.protocol import codec
from kbroker.protocol.messages import CreateTopicsRequest, ProduceRequest, RequestHeader
from kbroker.protocol.records import build_batch

from bench.harness import ROOT, cpu_seconds, free_port


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return bytes(buf)


def recv_response(sock: socket.socket, api_key: int, version: int) -> Any:
    (size,) = struct.unpack(">i", recv_exact(sock, 4))
    return codec.decode_response(api_key, version, recv_exact(sock, size))[1]


def create_topic(sock: socket.socket, partitions: int) -> None:
    req = CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
        name="bench", num_partitions=partitions, replication_factor=1)], timeout_ms=30000)
    header = RequestHeader(request_api_key=19, request_api_version=7, correlation_id=1, client_id="bench")
    sock.sendall(bytes(codec.encode_request(header, req)))
    code = recv_response(sock, 19, 7).topics[0].error_code
    if code:
        raise RuntimeError(f"CreateTopics bench: error {code}")


def run_once(root: Path, requests: int, pipeline: int, records: int = 10, partitions: int = 1) -> float:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="kbroker-bench-") as data:
        props = Path(data) / "server.properties"
        props.write_text(f"listeners=PLAINTEXT://127.0.0.1:{port}\nlog.dirs={data}/logs\nnum.network.threads=1\n")
        proc = subprocess.Popen([sys.executable, "-m", "kbroker.broker", str(props)], cwd=root,
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
            create_topic(sock, partitions)
            batch = build_batch([(None, b"v" * 100, (), 1_700_000_000_000 + i) for i in range(records)])
            frames = []
            for part in range(partitions):
                body = ProduceRequest(transactional_id=None, acks=1, timeout_ms=30000, topic_data=[
                    ProduceRequest.TopicProduceData(name="bench", partition_data=[
                        ProduceRequest.PartitionProduceData(index=part, records=batch)])])
                header = RequestHeader(request_api_key=0, request_api_version=9, correlation_id=0, client_id="bench")
                frames.append(bytearray(codec.encode_request(header, body)))
            next_offset = [0] * partitions

            def roundtrip(n: int, start: int) -> None:
                sent = received = 0
                while received < n:
                    while sent < n and sent - received < pipeline:
                        i = start + sent
                        f = frames[i % partitions]
                        struct.pack_into(">i", f, 8, i)  # correlation id
                        sock.sendall(f)
                        sent += 1
                    part = recv_response(sock, 0, 9).responses[0].partition_responses[0]
                    expected = next_offset[part.index]
                    if part.error_code or part.base_offset != expected:
                        raise RuntimeError(f"Produce to bench-{part.index}: error {part.error_code}, base offset "
                                           f"{part.base_offset}, expected {expected}")
                    next_offset[part.index] = expected + records
                    received += 1

            roundtrip(200, 0)  # code paths warm
            cpu0 = cpu_seconds(proc.pid)
            roundtrip(requests, 200)
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
    ap.add_argument("--partitions", type=int, default=1, help="partitions of topic bench, written in turn")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    roots = args.root or [ROOT]
    results: dict[Path, list[float]] = {r: [] for r in roots}
    for rep in range(args.reps):
        for r in roots:  # alternate, so drifting machine load hits every checkout alike
            us = run_once(r, args.requests, args.pipeline, args.records, args.partitions)
            results[r].append(us)
            print(f"rep {rep + 1} {r}: {us:.1f} us broker CPU per produce request", flush=True)
    for r, values in results.items():
        print(f"{r}: median {statistics.median(values):.1f} us/request (min {min(values):.1f}, "
              f"max {max(values):.1f}, {len(values)} runs of {args.requests} requests)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

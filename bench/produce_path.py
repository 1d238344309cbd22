"""Produce-path micro-benchmark: broker CPU per Produce request, for before/after comparisons of the request path.

    python -m bench.produce_path [--root CHECKOUT] [--requests N] [--pipeline K] [--records M] [--partitions P]
                                 [--reps R] [--idempotent] [--codec C] [--floor] [--env K=V] [--profile OUT]

Starts `python -m kbroker.broker` from CHECKOUT (default: this one) on loopback, creates topic `bench` with P partitions
(default 1), sends N ProduceRequests (acks=1, one M-record batch, default 10, of 100-byte values, to the partitions in
turn) over one connection with K in flight, and reports the broker process's CPU time (its CPU-time clock, which
other load on the machine disturbs far less than wall time) per request. Every answer is decoded and must carry no
error and the next offset, so what is measured is the append path (until 2026-11-26 the topic was never created and
every request was answered UNKNOWN_TOPIC_OR_PARTITION). Run it for two checkouts in alternation and compare medians.

--codec compresses the batch (librdkafka's lz4 and zstd as in bench.produce). --idempotent gets a producer id
(InitProducerId) and sends bench.produce's shape: every batch carries the id, its epoch and the next sequence (the
broker checks and records them). --pipeline 1 makes the broker sleep and wake for
every request, as librdkafka's one request per partition does; --floor measures `python -m bench.round_trip`'s
floor in the same run, between the repetitions, and prints issue 34's ratio (broker CPU per Produce request / the
floor). --env KBROKER_PURE_PYTHON=1 runs the Python request path; --profile OUT records the broker with py-spy
(--gil, raw stacks) into OUT.N per repetition, or perf (native and kernel stacks) for OUT=*.perf.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import crc32c
from kbroker.protocol import codec
from kbroker.protocol.messages import (
    CreateTopicsRequest,
    InitProducerIdRequest,
    ProduceRequest,
    RequestHeader,
)
from kbroker.protocol.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    build_batch,
)

from bench.harness import ROOT, Perf, PySpy, cpu_seconds, free_port

# Offsets in a v2 batch (and so in a Produce frame, from where the batch starts) that an idempotent producer's
# next batch changes: the CRC and what it covers.
_CRC_AT, _CRC_FROM, _SEQUENCE_AT = 17, 21, 53
CODECS = {"none": COMPRESSION_NONE, "gzip": COMPRESSION_GZIP, "snappy": COMPRESSION_SNAPPY, "lz4": COMPRESSION_LZ4,
          "zstd": COMPRESSION_ZSTD}


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


def connect_when_listening(port: int, timeout: float = 30.0) -> socket.socket:
    """A connection to 127.0.0.1:port, retried while the broker starts."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def create_topic(sock: socket.socket, partitions: int) -> None:
    req = CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
        name="bench", num_partitions=partitions, replication_factor=1)], timeout_ms=30000)
    header = RequestHeader(request_api_key=19, request_api_version=7, correlation_id=1, client_id="bench")
    sock.sendall(bytes(codec.encode_request(header, req)))
    code = recv_response(sock, 19, 7).topics[0].error_code
    if code:
        raise RuntimeError(f"CreateTopics bench: error {code}")


def init_producer_id(sock: socket.socket) -> tuple[int, int]:
    header = RequestHeader(request_api_key=22, request_api_version=4, correlation_id=2, client_id="bench")
    req = InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000)
    sock.sendall(bytes(codec.encode_request(header, req)))
    resp = recv_response(sock, 22, 4)
    if resp.error_code:
        raise RuntimeError(f"InitProducerId: error {resp.error_code}")
    return resp.producer_id, resp.producer_epoch


def run_once(root: Path, requests: int, pipeline: int, records: int = 10, partitions: int = 1,
             idempotent: bool = False, env: dict[str, str] | None = None, profile: Path | None = None,
             codec_name: str = "none") -> float:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="kbroker-bench-") as data:
        props = Path(data) / "server.properties"
        props.write_text(f"listeners=PLAINTEXT://127.0.0.1:{port}\nlog.dirs={data}/logs\nnum.network.threads=1\n")
        proc = subprocess.Popen([sys.executable, "-m", "kbroker.broker", str(props)], cwd=root,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, **(env or {})})
        try:
            sock = connect_when_listening(port)
            create_topic(sock, partitions)
            pid, epoch = init_producer_id(sock) if idempotent else (-1, -1)
            batch = build_batch([(None, b"v" * 100, (), 1_700_000_000_000 + i) for i in range(records)],
                                producer_id=pid, producer_epoch=epoch, base_sequence=0 if idempotent else -1,
                                compression=CODECS[codec_name])
            frames = []
            for part in range(partitions):
                body = ProduceRequest(transactional_id=None, acks=1, timeout_ms=30000, topic_data=[
                    ProduceRequest.TopicProduceData(name="bench", partition_data=[
                        ProduceRequest.PartitionProduceData(index=part, records=batch)])])
                header = RequestHeader(request_api_key=0, request_api_version=9, correlation_id=0, client_id="bench")
                frames.append(bytearray(codec.encode_request(header, body)))
            next_offset = [0] * partitions
            batch_at = [bytes(f).index(batch) for f in frames]

            def roundtrip(n: int, start: int) -> None:
                sent = received = 0
                while received < n:
                    while sent < n and sent - received < pipeline:
                        i = start + sent
                        f = frames[i % partitions]
                        struct.pack_into(">i", f, 8, i)  # correlation id
                        if idempotent:
                            at = batch_at[i % partitions]
                            struct.pack_into(">i", f, at + _SEQUENCE_AT, i // partitions * records)
                            struct.pack_into(">I", f, at + _CRC_AT, crc32c.crc32c(memoryview(f)[at + _CRC_FROM:at + len(batch)]))
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
            sampler = Perf if profile and profile.suffix == ".perf" else PySpy
            with sampler(proc.pid, profile) if profile else contextlib.nullcontext():
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
    ap.add_argument("--idempotent", action="store_true", help="InitProducerId, then sequenced batches")
    ap.add_argument("--codec", choices=sorted(CODECS), default="none", help="the batches' compression")
    ap.add_argument("--floor", action="store_true", help="measure the round-trip floor too and print the ratio")
    ap.add_argument("--env", action="append", default=[], metavar="K=V", help="environment of the broker (repeatable)")
    ap.add_argument("--env-b", action="append", default=None, metavar="K=V",
                    help="a second broker environment, run alternately with --env (A/B of one checkout)")
    ap.add_argument("--profile", type=Path, help="py-spy raw stacks of the broker into PROFILE.<rep> (perf record "
                    "-g instead when PROFILE ends in .perf)")
    args = ap.parse_args(argv)
    from bench import round_trip  # it imports this module's recv_exact

    roots = args.root or [ROOT]
    envs = [dict(kv.split("=", 1) for kv in args.env)]
    if args.env_b is not None:
        envs.append(dict(kv.split("=", 1) for kv in args.env_b))
    runs = [(r, i) for r in roots for i in range(len(envs))]
    results: dict[tuple[Path, int], list[float]] = {run: [] for run in runs}
    floors: list[float] = []
    for rep in range(args.reps):
        for r, i in runs:  # alternate, so drifting machine load hits every checkout alike
            prof = args.profile.with_name(f"{args.profile.stem}.{rep + 1}{args.profile.suffix}") if args.profile else None
            us = run_once(r, args.requests, args.pipeline, args.records, args.partitions, args.idempotent,
                          envs[i], prof, args.codec)
            results[(r, i)].append(us)
            print(f"rep {rep + 1} {r} {envs[i] or ''}: {us:.1f} us broker CPU per produce request", flush=True)
        if args.floor:
            floors.append(round_trip.measure(args.requests, args.pipeline)[0])
            print(f"rep {rep + 1}: round-trip floor {floors[-1]:.1f} us per request", flush=True)
    floor = statistics.median(floors) if floors else None
    for (r, i), values in results.items():
        med = statistics.median(values)
        ratio = f", {med / floor:.2f}x the round-trip floor ({floor:.1f} us)" if floor else ""
        print(f"{r} {envs[i] or ''}: median {med:.1f} us/request (min {min(values):.1f}, "
              f"max {max(values):.1f}, {len(values)} runs of {args.requests} requests){ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

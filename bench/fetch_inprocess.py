"""The broker's own CPU per idle long-poll Fetch without sockets: what the request path costs in the interpreter.

    python -m bench.fetch_inprocess [--requests N] [--reps R] [--max-wait-ms 1]

As bench.produce_inprocess, for the idle row of bench.fetch_sessions / bench.idle_poll: a broker in this process,
topics `idle_0..2` (4 partitions each, one record in each), and librdkafka's idle Fetch (v16, read_committed,
10 partitions at their log end, the partition list rotated by one on every request as librdkafka does) fed to a
KafkaConnection with a stub transport on its network thread, one at a time: framing, header decode, the handler,
the long poll's wait (max wait `--max-wait-ms`, so the timer fires while the loop sleeps) and the empty answer's
encode and write. The thread's CPU time per request is printed per repetition; `--floor` prints what the harness's
own sleep per request costs (the loop's wake-ups), to subtract. `--session` feeds the Java client's idle Fetch
instead: a full Fetch creating a fetch session over the same partitions (KIP-227), then incremental Fetches naming
no partition, each at the session's next epoch. Run it from each checkout (cwd) alternately to compare them.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import statistics
import sys
import time
from pathlib import Path

from kbroker.broker.network import KafkaConnection
from kbroker.broker.server import KafkaServer
from kbroker.protocol import codec
from kbroker.protocol.messages import (
    CreateTopicsRequest,
    FetchRequest,
    MetadataRequest,
    ProduceRequest,
    RequestHeader,
)
from kbroker.protocol.records import build_batch

from bench.produce_inprocess import StubTransport, run_beside
from bench.produce_path import connect_when_listening, recv_response

WARM = 200
VERSION = 16
PARTS = [(t, p) for t in range(3) for p in range(4)][:10]


def _request(sock: object, api_key: int, version: int, body: object) -> object:
    header = RequestHeader(
        request_api_key=api_key, request_api_version=version, correlation_id=1, client_id="b"
    )
    sock.sendall(bytes(codec.encode_request(header, body)))  # type: ignore[attr-defined]
    return recv_response(sock, api_key, version)  # type: ignore[arg-type]


def _setup(port: int) -> dict[str, bytes]:
    with connect_when_listening(port) as sock:
        C = CreateTopicsRequest
        _request(
            sock,
            19,
            7,
            C(
                topics=[
                    C.CreatableTopic(name=f"idle_{t}", num_partitions=4, replication_factor=1)
                    for t in range(3)
                ],
                timeout_ms=15000,
            ),
        )
        batch = build_batch([(None, b"v" * 100, (), 1_700_000_000_000)])
        P = ProduceRequest
        _request(
            sock,
            0,
            9,
            P(
                transactional_id=None,
                acks=1,
                timeout_ms=5000,
                topic_data=[
                    P.TopicProduceData(
                        name=f"idle_{t}",
                        partition_data=[P.PartitionProduceData(index=p, records=batch) for p in range(4)],
                    )
                    for t in range(3)
                ],
            ),
        )
        meta = _request(sock, 3, 12, MetadataRequest(topics=None, allow_auto_topic_creation=False))
        return {t.name: t.topic_id for t in meta.topics}  # type: ignore[attr-defined]


def _session_frames(session_id: int, count: int, max_wait_ms: int) -> list[bytes]:
    """The Java client's idle incremental Fetches in a session: no partition, epochs 1, 2, ..."""
    out = []
    for i in range(count):
        body = FetchRequest(
            max_wait_ms=max_wait_ms,
            min_bytes=1,
            max_bytes=52428800,
            isolation_level=0,
            session_id=session_id,
            session_epoch=i + 1,
            topics=[],
            rack_id="",
        )
        header = RequestHeader(
            request_api_key=1, request_api_version=VERSION, correlation_id=i, client_id="b"
        )
        out.append(bytes(codec.encode_request(header, body)))
    return out


def _frames(ids: dict[str, bytes], count: int, max_wait_ms: int, session_epoch: int = -1) -> list[bytes]:
    out = []
    for i in range(count):
        k = i % len(PARTS)
        order = PARTS[k:] + PARTS[:k]
        topics: list[FetchRequest.FetchTopic] = []
        for t, p in order:
            entry = FetchRequest.FetchPartition(
                partition=p,
                current_leader_epoch=0,
                fetch_offset=1,
                last_fetched_epoch=-1,
                log_start_offset=-1,
                partition_max_bytes=1 << 20,
            )
            if topics and topics[-1].topic_id == ids[f"idle_{t}"]:
                topics[-1].partitions.append(entry)
            else:
                topics.append(FetchRequest.FetchTopic(topic_id=ids[f"idle_{t}"], partitions=[entry]))
        body = FetchRequest(
            max_wait_ms=max_wait_ms,
            min_bytes=1,
            max_bytes=52428800,
            isolation_level=1,
            session_id=0,
            session_epoch=session_epoch,
            topics=topics,
            rack_id="",
        )
        header = RequestHeader(
            request_api_key=1, request_api_version=VERSION, correlation_id=i, client_id="b"
        )
        out.append(bytes(codec.encode_request(header, body)))
    return out


def measure(
    requests: int,
    reps: int,
    max_wait_ms: int,
    profile: Path | None = None,
    floor: bool = False,
    session: bool = False,
) -> list[float]:
    results: list[float] = []

    def client(server: KafkaServer, port: int) -> None:
        async def feed_all(frames: list[bytes]) -> None:
            conn = KafkaConnection(server.socket_server.processors[0], "in-process")
            transport = StubTransport()
            conn.connection_made(transport)  # type: ignore[arg-type]
            pause = max_wait_ms / 1000 * 1.5 + 0.0005

            async def feed(frame: bytes) -> None:
                answers = transport.answers
                buf = conn.get_buffer(-1)
                buf[: len(frame)] = frame
                conn.buffer_updated(len(frame))
                while transport.answers == answers:
                    await asyncio.sleep(pause)

            if floor:
                # The harness alone: one sleep per request, as a request's wait takes.
                t0 = time.thread_time()
                for _ in range(requests):
                    await asyncio.sleep(pause)
                results.append((time.thread_time() - t0) / requests * 1e6)
                return
            if session:
                await feed(frames[0])  # the full Fetch (epoch 0) that creates the session
                created = codec.decode_response(1, VERSION, bytes(transport.last)[4:])[1]
                if not created.session_id:  # type: ignore[attr-defined]
                    raise RuntimeError(f"no session: {created}")
                frames = _session_frames(created.session_id, len(frames), max_wait_ms)  # type: ignore[attr-defined]
            for frame in frames[:WARM]:
                await feed(frame)
            for rep in range(reps):
                prof = cProfile.Profile() if profile is not None and rep == reps - 1 else None
                if prof is not None:
                    prof.enable()
                t0 = time.thread_time()
                for frame in frames[WARM + rep * requests : WARM + (rep + 1) * requests]:
                    await feed(frame)
                results.append((time.thread_time() - t0) / requests * 1e6)
                if prof is not None:
                    prof.disable()
                    prof.dump_stats(str(profile))
            resp = codec.decode_response(1, VERSION, bytes(transport.last)[4:])[1]
            if (
                resp.error_code
                or (len(resp.responses) == 0) != session
                or any(  # type: ignore[attr-defined]
                    p.error_code or p.records
                    for t in resp.responses
                    for p in t.partitions  # type: ignore[attr-defined]
                )
            ):
                raise RuntimeError(f"not the idle answer: {resp}")

        frames = _frames(_setup(port), WARM + reps * requests, max_wait_ms, 0 if session else -1)
        asyncio.run_coroutine_threadsafe(feed_all(frames), server.socket_server.processors[0].loop).result()

    run_beside("kbroker-fetch-inprocess-", client)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fetch_inprocess", description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-wait-ms", type=int, default=1)
    ap.add_argument("--profile", type=Path, help="cProfile stats of the last repetition into this file")
    ap.add_argument(
        "--floor", action="store_true", help="the harness's own CPU per request (its sleeps), no Fetch"
    )
    ap.add_argument(
        "--session", action="store_true", help="the Java client's idle incremental Fetch in a fetch session"
    )
    args = ap.parse_args(argv)
    results = measure(args.requests, args.reps, args.max_wait_ms, args.profile, args.floor, args.session)
    print(
        "in-process broker CPU per idle Fetch (us): "
        + " ".join(f"{r:.1f}" for r in results)
        + f"; median {statistics.median(results):.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The broker's own CPU per Produce request without sockets: what the request path costs in the interpreter.

    python -m bench.produce_inprocess [--requests N] [--reps R] [--profile OUT.prof] [--authorizer]

Starts a broker in this process (topic `bench`, one partition), gets a producer id over a real connection, then
feeds bench.produce_path's idempotent requests (acks=1, one 10-record batch of 100-byte values, the next sequence
each) to a KafkaConnection whose transport is a stub, on the connection's own network thread: framing, header
decode, dispatch, the Produce handler, the log append (segment write included) and the answer's encode, without
the kernel's socket work or the wake-ups. Its thread CPU time per request is printed per repetition. The socket
bench (bench.produce_path) measures the whole; this one resolves changes of a microsecond on a loaded machine,
where the socket figures move by 20-40% from run to run. --profile writes cProfile stats of the last repetition.
--authorizer: the broker has kbroker's ACL authorizer and bench.authz's 200 ACLs (the topic's Write through a
prefixed ACL among literal ones for other users), created in-process before the first request.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crc32c
import uvloop
from kbroker.broker.config import KafkaConfig
from kbroker.broker.network import KafkaConnection
from kbroker.broker.server import KafkaServer
from kbroker.protocol import codec
from kbroker.protocol.messages import ProduceRequest, RequestHeader
from kbroker.protocol.records import build_batch

from bench.harness import free_port
from bench.produce_path import (
    _CRC_AT,
    _CRC_FROM,
    _SEQUENCE_AT,
    connect_when_listening,
    create_topic,
    init_producer_id,
)

RECORDS = 10
WARM = 200


class StubTransport:
    """What KafkaConnection asks of a transport; answers are counted and the last one kept."""

    def __init__(self) -> None:
        self.answers = 0
        self.last: Any = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def set_write_buffer_limits(self, high: int = 0, low: int = 0) -> None:
        pass

    def write(self, data: Any) -> None:
        self.answers += 1
        self.last = data

    def writelines(self, parts: list[Any]) -> None:
        for data in parts:
            self.write(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


AUTHORIZER_PROPS = "authorizer.class.name=kafka.security.authorizer.AclAuthorizer\nallow.everyone.if.no.acl.found=true\n"


def grant(server: KafkaServer) -> None:
    """bench.authz's ACLs: ANONYMOUS may write, read and create topics prefixed "bench" and do anything on the
    cluster; 196 literal Read ACLs for other users beside them."""
    from kbroker.broker.security.acls import (
        AccessControlEntry,
        AclOperation,
        AclPermissionType,
        PatternType,
        ResourcePattern,
        ResourceType,
    )

    def entry(principal: str, op: AclOperation) -> AccessControlEntry:
        return AccessControlEntry(principal, "*", op, AclPermissionType.ALLOW)

    prefixed = ResourcePattern(ResourceType.TOPIC, "bench", PatternType.PREFIXED)
    bindings = [(prefixed, entry("User:ANONYMOUS", op)) for op in (AclOperation.WRITE, AclOperation.READ,
                                                                  AclOperation.CREATE)]
    bindings.append((ResourcePattern(ResourceType.CLUSTER, "kafka-cluster", PatternType.LITERAL),
                     entry("User:ANONYMOUS", AclOperation.ALL)))
    bindings += [(ResourcePattern(ResourceType.TOPIC, f"other-{i}", PatternType.LITERAL),
                  entry(f"User:user-{i % 20}", AclOperation.READ)) for i in range(196)]
    assert server.authorizer is not None
    failed = {p: e for p, e in server.authorizer.create_acls(bindings).items() if e is not None}
    assert not failed, failed


def run_beside(prefix: str, client: Callable[[KafkaServer, int], None], extra_props: str = "") -> None:
    """A broker in this process (one network thread, a temporary log dir, a free port) run on this thread until
    `client(server, port)`, on a thread of its own, returns; what the client raised is raised here."""
    port = free_port()
    failure: list[BaseException] = []
    with tempfile.TemporaryDirectory(prefix=prefix) as data:
        props = Path(data) / "server.properties"
        props.write_text(
            f"listeners=PLAINTEXT://127.0.0.1:{port}\nlog.dirs={data}/logs\nnum.network.threads=1\n" + extra_props
        )
        server = KafkaServer(KafkaConfig.from_file(str(props), []))
        loop = uvloop.new_event_loop()

        def run() -> None:
            try:
                client(server, port)
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                failure.append(e)
            finally:
                loop.call_soon_threadsafe(server.request_stop)

        threading.Thread(target=run, daemon=True).start()
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.run_until_stopped())
    if failure:
        raise failure[0]


def on_processor(server: KafkaServer, fn: Callable[[], None]) -> None:
    """fn() on the broker's (first) network thread, waited for; what it raised is raised here."""
    done = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - raised on the caller's thread
            failure.append(e)
        finally:
            done.set()

    server.socket_server.processors[0].loop.call_soon_threadsafe(run)
    done.wait()
    if failure:
        raise failure[0]


def feed_timed(
    server: KafkaServer, frames: list[bytes], warm: int, requests: int, reps: int, profile: Path | None = None
) -> tuple[StubTransport, list[float]]:
    """On the processor's thread: a connection with a stub transport fed frames[:warm], then `reps` runs of
    `requests` frames each, timed: the thread CPU microseconds per request of each run, and the transport (its
    answers counted, the last kept). `profile`: cProfile stats of the last run into that file."""
    conn = KafkaConnection(server.socket_server.processors[0], "in-process")
    transport = StubTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]

    def feed(frame: bytes) -> None:
        buf = conn.get_buffer(-1)
        buf[: len(frame)] = frame
        conn.buffer_updated(len(frame))

    for frame in frames[:warm]:
        feed(frame)
    results: list[float] = []
    for rep in range(reps):
        chunk = frames[warm + rep * requests : warm + (rep + 1) * requests]
        prof = cProfile.Profile() if profile is not None and rep == reps - 1 else None
        if prof is not None:
            prof.enable()
        t0 = time.thread_time()
        for frame in chunk:
            feed(frame)
        t1 = time.thread_time()
        if prof is not None:
            prof.disable()
            prof.dump_stats(str(profile))
        results.append((t1 - t0) / requests * 1e6)
    return transport, results


def _frames(pid: int, epoch: int, count: int) -> list[bytes]:
    batch = build_batch(
        [(None, b"v" * 100, (), 1_700_000_000_000 + i) for i in range(RECORDS)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=0,
    )
    body = ProduceRequest(
        transactional_id=None,
        acks=1,
        timeout_ms=30000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name="bench", partition_data=[ProduceRequest.PartitionProduceData(index=0, records=batch)]
            )
        ],
    )
    header = RequestHeader(request_api_key=0, request_api_version=9, correlation_id=0, client_id="bench")
    f = bytearray(codec.encode_request(header, body))
    at = bytes(f).index(batch)
    out = []
    for i in range(count):
        struct.pack_into(">i", f, 8, i)
        struct.pack_into(">i", f, at + _SEQUENCE_AT, i * RECORDS)
        struct.pack_into(
            ">I", f, at + _CRC_AT, crc32c.crc32c(memoryview(f)[at + _CRC_FROM : at + len(batch)])
        )
        out.append(bytes(f))
    return out


def measure(requests: int, reps: int, profile: Path | None = None, authorizer: bool = False) -> list[float]:
    """Thread CPU microseconds per request, one figure per repetition."""
    results: list[float] = []

    def client(server: KafkaServer, port: int) -> None:
        sock = connect_when_listening(port)
        if authorizer:  # once the broker listens: its log dirs exist for the ACL store
            grant(server)
        with sock:
            create_topic(sock, 1)
            pid, epoch = init_producer_id(sock)
        frames = _frames(pid, epoch, WARM + reps * requests)

        def feed_all() -> None:
            transport, timed = feed_timed(server, frames, WARM, requests, reps, profile)
            results.extend(timed)
            part = (
                codec.decode_response(0, 9, bytes(transport.last)[4:])[1].responses[0].partition_responses[0]
            )
            expected = (len(frames) - 1) * RECORDS
            if transport.answers != len(frames) or part.error_code or part.base_offset != expected:
                raise RuntimeError(
                    f"{transport.answers} answers, the last {part}: expected offset {expected}"
                )

        on_processor(server, feed_all)

    run_beside("kbroker-inprocess-", client, AUTHORIZER_PROPS if authorizer else "")
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.produce_inprocess", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--profile", type=Path, help="cProfile stats of the last repetition into this file")
    ap.add_argument("--authorizer", action="store_true", help="kbroker's ACL authorizer with bench.authz's 200 ACLs")
    args = ap.parse_args(argv)
    results = measure(args.requests, args.reps, args.profile, args.authorizer)
    print(
        "in-process broker CPU per Produce request (us): "
        + " ".join(f"{r:.1f}" for r in results)
        + f"; median {statistics.median(results):.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

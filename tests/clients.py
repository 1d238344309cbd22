"""Client helpers shared by the broker tests: confluent-kafka, kafka-python, aiokafka, kcat and a raw protocol client.

Every helper talks to a real broker over TCP. Records are compared through the client-neutral `Rec` tuple, so a
test can produce with one client and read back with another.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

DEFAULT_TIMEOUT = 30.0


class Msg(NamedTuple):
    """A record to produce. partition None lets the client's partitioner choose."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp: int | None = None
    partition: int | None = None


class Rec(NamedTuple):
    """A record as a client saw it (delivery report or consumed record)."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int


def _headers(h: Iterable[tuple[str, bytes | None]] | None) -> tuple[tuple[str, bytes], ...]:
    return tuple((k, v if v is not None else b"") for k, v in (h or ()))


def wait_until(pred: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = pred()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def by_partition(recs: Iterable[Rec]) -> dict[int, list[Rec]]:
    out: dict[int, list[Rec]] = {}
    for r in recs:
        out.setdefault(r.partition, []).append(r)
    for v in out.values():
        v.sort(key=lambda r: r.offset)
    return out


# ---------------------------------------------------------------- confluent-kafka (librdkafka)


def ck_conf(bootstrap: str, **conf: Any) -> dict[str, Any]:
    base = {"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000, "api.version.request.timeout.ms": 10000}
    base.update({k.replace("_", "."): v for k, v in conf.items()})
    return base


class ProduceFailed(Exception):
    def __init__(self, errors: list[Any]) -> None:
        super().__init__(f"{len(errors)} deliveries failed, first: {errors[0]!r}")
        self.errors = errors


def ck_produce(bootstrap: str, topic: str, msgs: Sequence[Msg], timeout: float = DEFAULT_TIMEOUT,
               **conf: Any) -> list[Rec]:
    """Produce with librdkafka and wait for every delivery report; raises ProduceFailed on any error."""
    p = Producer(ck_conf(bootstrap, **{"enable.idempotence": False, "linger.ms": 5, **conf}))
    delivered: list[Rec] = []
    errors: list[Any] = []

    def reporter(sent: Msg) -> Callable[[Any, Any], None]:
        # Delivery reports do not carry the headers back: take them from what was sent.
        def on_delivery(err: Any, m: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                delivered.append(Rec(m.partition(), m.offset(), m.key(), m.value(), sent.headers, m.timestamp()[1]))

        return on_delivery

    for m in msgs:
        kw: dict[str, Any] = {"key": m.key, "value": m.value, "on_delivery": reporter(m)}
        if m.headers:
            kw["headers"] = list(m.headers)
        if m.timestamp is not None:
            kw["timestamp"] = m.timestamp
        if m.partition is not None:
            kw["partition"] = m.partition
        while True:
            try:
                p.produce(topic, **kw)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    left = p.flush(timeout)
    if errors:
        raise ProduceFailed(errors)
    assert left == 0, f"{left} messages still in the librdkafka queue after {timeout}s"
    return delivered


def ck_produce_waiting(p: Producer, topic: str, value: bytes, key: bytes | None = None,
                       on_delivery: Callable[..., None] | None = None) -> None:
    """Producer.produce that waits for room in librdkafka's queue instead of raising BufferError."""
    while True:
        try:
            p.produce(topic, value=value, key=key, on_delivery=on_delivery)
            break
        except BufferError:
            p.poll(0.05)
    p.poll(0)


def ck_consumer(bootstrap: str, **conf: Any) -> Consumer:
    # group.id is required by librdkafka even for assign(); nothing ever commits, so no coordinator is needed.
    return Consumer(ck_conf(bootstrap, **{"group.id": "kbroker-tests-nocommit", "enable.auto.commit": False,
                                          "enable.auto.offset.store": False, "auto.offset.reset": "earliest",
                                          "fetch.wait.max.ms": 100, **conf}))


def ck_consume(bootstrap: str, topic: str, partitions: Iterable[int], count: int,
               timeout: float = DEFAULT_TIMEOUT, offset: int = OFFSET_BEGINNING, **conf: Any) -> list[Rec]:
    """assign() the partitions from `offset` and read until `count` records arrived (errors raise)."""
    c = ck_consumer(bootstrap, **conf)
    try:
        c.assign([TopicPartition(topic, p, offset) for p in partitions])
        out: list[Rec] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            for m in c.consume(min(count - len(out), 10000), 0.5):
                if m.error():
                    raise KafkaException(m.error())
                out.append(Rec(m.partition(), m.offset(), m.key(), m.value(), _headers(m.headers()),
                               m.timestamp()[1]))
        return out
    finally:
        c.close()


def ck_read_committed(bootstrap: str, topic: str, timeout: float = 30.0) -> list[tuple[bytes | None, bytes | None]]:
    """Every committed (key, value) of a topic as a read_committed consumer sees it now, in offset order per
    partition; [] for a topic that does not exist yet."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "kbroker-tests-checker", "enable.auto.commit": False,
                  "isolation.level": "read_committed", "enable.partition.eof": True, "fetch.wait.max.ms": 50})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        c.assign([TopicPartition(topic, p, 0) for p in md.partitions])
        left, out = len(md.partitions), []
        deadline = time.monotonic() + timeout
        while left and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                left -= 1
                continue
            out.append((m.key(), m.value()))
        return out
    finally:
        c.close()


# ---------------------------------------------------------------- kafka-python


def kp_produce(bootstrap: str, topic: str, msgs: Sequence[Msg], timeout: float = DEFAULT_TIMEOUT,
               **kw: Any) -> list[Rec]:
    from kafka import KafkaProducer

    # kafka-python 3 turns idempotence on by default; kbroker has no InitProducerId yet.
    p = KafkaProducer(bootstrap_servers=bootstrap, **{"enable_idempotence": False, "linger_ms": 5, **kw})
    try:
        futures = [
            p.send(topic, key=m.key, value=m.value, headers=list(m.headers) or None, partition=m.partition,
                   timestamp_ms=m.timestamp)
            for m in msgs
        ]
        p.flush(timeout)
        out = []
        for m, f in zip(msgs, futures, strict=True):
            md = f.get(timeout)
            out.append(Rec(md.partition, md.offset, m.key, m.value, m.headers, md.timestamp))
        return out
    finally:
        p.close(timeout=5)


def kp_consume(bootstrap: str, topic: str, partitions: Iterable[int], count: int,
               timeout: float = DEFAULT_TIMEOUT, start: dict[int, int] | None = None, **kw: Any) -> list[Rec]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest", **{"fetch_max_wait_ms": 100, **kw})
    try:
        tps = [KTP(topic, p) for p in partitions]
        c.assign(tps)
        if start:
            for tp in tps:
                c.seek(tp, start[tp.partition])
        else:
            c.seek_to_beginning(*tps)
        out: list[Rec] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500, max_records=10000).values():
                out.extend(Rec(r.partition, r.offset, r.key, r.value, _headers(r.headers), r.timestamp)
                           for r in recs)
        return out
    finally:
        c.close()


class KpRaw:
    """kafka-python's own network client and protocol classes, for APIs its high-level clients do not expose."""

    def __init__(self, bootstrap: str) -> None:
        from kafka.net.compat import KafkaNetClient

        self.client = KafkaNetClient(bootstrap_servers=bootstrap)
        self.client.check_version()

    def send(self, request: Any, node_id: int = 0, timeout_ms: int = 10000) -> Any:
        return self.client.send_and_receive(node_id, request, timeout_ms=timeout_ms)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> KpRaw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------- aiokafka


def aio_produce(bootstrap: str, topic: str, msgs: Sequence[Msg], timeout: float = DEFAULT_TIMEOUT,
                **kw: Any) -> list[Rec]:
    from aiokafka import AIOKafkaProducer

    async def run() -> list[Rec]:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, **{"linger_ms": 5, **kw})
        await p.start()
        try:
            futs = [
                await p.send(topic, key=m.key, value=m.value, headers=list(m.headers) or None,
                             partition=m.partition, timestamp_ms=m.timestamp)
                for m in msgs
            ]
            mds = await asyncio.wait_for(asyncio.gather(*futs), timeout)
            # acks=0 resolves to None. aiokafka reports the batch's first CreateTime for every record of the
            # batch (its BatchBuilder.done overwrites the -1 marker), so trust the sent timestamp when there is one.
            return [Rec(md.partition, md.offset, m.key, m.value, m.headers,
                        m.timestamp if m.timestamp is not None else md.timestamp) if md is not None
                    else Rec(m.partition if m.partition is not None else -1, -1, m.key, m.value, m.headers, -1)
                    for m, md in zip(msgs, mds, strict=True)]
        finally:
            await p.stop()

    return asyncio.run(run())


def aio_consume(bootstrap: str, topic: str, partitions: Iterable[int], count: int,
                timeout: float = DEFAULT_TIMEOUT, **kw: Any) -> list[Rec]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as ATP

    async def run() -> list[Rec]:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", **{"fetch_max_wait_ms": 100, **kw})
        await c.start()
        try:
            tps = [ATP(topic, p) for p in partitions]
            c.assign(tps)
            await c.seek_to_beginning(*tps)
            out: list[Rec] = []
            deadline = time.monotonic() + timeout
            while len(out) < count and time.monotonic() < deadline:
                got = await c.getmany(timeout_ms=500, max_records=10000)
                for recs in got.values():
                    out.extend(Rec(r.partition, r.offset, r.key, r.value, _headers(r.headers), r.timestamp)
                               for r in recs)
            return out
        finally:
            await c.stop()

    return asyncio.run(run())


# ---------------------------------------------------------------- kcat


def kcat(bootstrap: str, *args: str, input: bytes | None = None, timeout: float = DEFAULT_TIMEOUT,
         check: bool = True) -> subprocess.CompletedProcess[bytes]:
    r = subprocess.run(["kcat", "-b", bootstrap, *args], input=input, capture_output=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"kcat {' '.join(args)} exited {r.returncode}: {r.stderr.decode(errors='replace')}")
    return r


# ---------------------------------------------------------------- raw protocol client (protocol.codec)


class RawClient:
    """A blocking socket speaking Kafka frames built with protocol.codec."""

    def __init__(self, bootstrap: str, timeout: float = 10.0) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.correlation_id = 0

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def recv_frame(self) -> bytes:
        (size,) = struct.unpack(">i", self.recv_exact(4))
        return self.recv_exact(size)

    def frame(self, api_key: int, version: int, body: Any, client_id: str = "kbroker-tests") -> bytes:
        from kbroker.protocol import codec
        from kbroker.protocol.messages import RequestHeader

        self.correlation_id += 1
        header = RequestHeader(request_api_key=api_key, request_api_version=version,
                               correlation_id=self.correlation_id, client_id=client_id)
        return bytes(codec.encode_request(header, body))

    def request(self, api_key: int, version: int, body: Any, response_version: int | None = None) -> Any:
        from kbroker.protocol import codec

        self.send_bytes(self.frame(api_key, version, body))
        cid, resp = codec.decode_response(api_key, version if response_version is None else response_version,
                                          self.recv_frame())
        assert cid == self.correlation_id
        return resp

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True when the broker closes the connection (EOF or reset) within `timeout`."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

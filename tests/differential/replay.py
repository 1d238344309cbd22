"""`python -m tests.differential.replay [--sessions a,b]`: record real client sessions (confluent-kafka) through a
proxy in front of Apache Kafka 3.9, replay the same request bytes on the same connection layout against kbroker, and
print the normalised comparison per API and version (exit 1 when any answer differs)."""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

from kbroker.protocol import codec

from tests.differential.harness import CLOSED, TIMEOUT, Tally
from tests.differential.proxy import Exchange, RecordingProxy

GENERATED_IDS = ("member_id", "leader")  # strings each coordinator generates; later requests name them


def idempotent_produce(bootstrap: str, tag: str) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "client.id": "replay-producer"})
    for i in range(20):
        p.produce(f"replay-{tag}", key=b"k%d" % (i % 3), value=b"v%d" % i)
    if p.flush(30) != 0:
        raise RuntimeError("idempotent produce did not complete")


def group_consume(bootstrap: str, tag: str) -> None:
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"replay-group-{tag}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "client.id": "replay-consumer",
        }
    )
    c.subscribe([f"replay-{tag}"])
    seen, deadline = 0, time.monotonic() + 30
    while seen < 20 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            seen += 1
    c.commit(asynchronous=False)
    c.close()
    if seen < 20:
        raise RuntimeError(f"the group consumed {seen} of 20 records")


def transaction(bootstrap: str, tag: str) -> None:
    from confluent_kafka import Producer

    p = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"replay-txn-{tag}", "client.id": "replay-txn"}
    )
    p.init_transactions(60)
    p.begin_transaction()
    for i in range(5):
        p.produce(f"replay-txn-{tag}", value=b"t%d" % i)
    p.commit_transaction(60)


SESSIONS: dict[str, Callable[[str, str], None]] = {
    "idempotent-produce": idempotent_produce,
    "group-consume": group_consume,
    "transaction": transaction,
}


def record(kafka: str, names: list[str], tag: str) -> list[Exchange]:
    """The sessions run one after another through one proxy: the group consumes what the producer wrote."""
    with RecordingProxy(kafka) as proxy:
        for name in names:
            SESSIONS[name](proxy.bootstrap, tag)
        time.sleep(0.5)  # the last answers reach the proxy after the client has returned
        return list(proxy.exchanges)


class _Connection:
    def __init__(self, address: tuple[str, int], timeout: float) -> None:
        self.sock: socket.socket | None = socket.create_connection(address, timeout=timeout)

    def exchange(self, ex: Exchange, frame: bytes) -> Any:
        if self.sock is None:
            return CLOSED
        try:
            self.sock.sendall(struct.pack(">i", len(frame)) + frame)
            if not ex.expects_answer:
                return None
            size = struct.unpack(">i", self._exact(4))[0]
            return codec.decode_response(ex.api_key, ex.version, self._exact(size))[1]
        except TimeoutError:
            self.close()
            return TIMEOUT
        except (ConnectionError, OSError):
            self.close()
            return CLOSED

    def _exact(self, n: int) -> bytes:
        assert self.sock is not None
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _generated(value: Any, out: dict[str, str]) -> None:
    for f in getattr(type(value), "FIELDS", ()):
        v = getattr(value, f.attr)
        if f.attr in GENERATED_IDS and isinstance(v, str):
            out.setdefault(f.attr, v)
        elif isinstance(v, list):
            for item in v:
                _generated(item, out)
        elif hasattr(type(v), "FIELDS"):
            _generated(v, out)


def replay(
    kbroker: str, exchanges: list[Exchange], tally: Tally | None = None, timeout: float = 15.0
) -> Tally:
    """Send each recorded frame to kbroker in the recorded order, each on its own recorded connection. Member ids
    Kafka generated are replaced in later frames by the ones kbroker generated (same length, so no length prefix
    changes)."""
    tally = tally or Tally()
    host, port = kbroker.rsplit(":", 1)
    connections: dict[int, _Connection] = {}
    ids: dict[bytes, bytes] = {}
    try:
        for ex in exchanges:
            conn = connections.get(ex.connection)
            if conn is None:
                conn = connections[ex.connection] = _Connection((host, int(port)), timeout)
            frame = ex.frame
            for theirs, ours in ids.items():
                frame = frame.replace(theirs, ours)
            answer = conn.exchange(ex, frame)
            if not ex.expects_answer:
                continue
            name = codec.REQUESTS[ex.api_key].__name__.removesuffix("Request")
            tally.record(name, ex.version, answer, ex.answer, _request(ex.api_key, frame))
            theirs_ids: dict[str, str] = {}
            ours_ids: dict[str, str] = {}
            _generated(ex.answer, theirs_ids)
            if not isinstance(answer, str) and answer is not None:
                _generated(answer, ours_ids)
            for attr, value in theirs_ids.items():
                mine = ours_ids.get(attr)
                if value and mine and len(value) == len(mine):
                    ids[value.encode()] = mine.encode()
    finally:
        for c in connections.values():
            c.close()
    return tally


def _request(api_key: int, frame: bytes) -> Any:
    header, pos = codec.decode_request_header(frame)
    return codec.decode(codec.REQUESTS[api_key], header.request_api_version, frame, pos)[0]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.differential.replay", description=__doc__)
    parser.add_argument(
        "--sessions", default=",".join(SESSIONS), help="comma-separated: " + ", ".join(SESSIONS)
    )
    parser.add_argument("--examples-shown", type=int, default=3, help="differences shown per API and version")
    args = parser.parse_args(argv)
    names = [n for n in args.sessions.split(",") if n]
    unknown = [n for n in names if n not in SESSIONS]
    if unknown:
        print(f"unknown session(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    from bench.peers.maven import ArtifactUnavailable
    from tests.differential.session import brokers

    try:
        with brokers() as (kbroker, kafka):
            exchanges = record(kafka, names, "cli")
            tally = replay(kbroker, exchanges, Tally(keep=args.examples_shown))
    except ArtifactUnavailable as e:
        print(f"Kafka 3.9 is unavailable here: {e}", file=sys.stderr)
        return 2
    print(f"recorded {len(exchanges)} requests on {len({e.connection for e in exchanges})} connections")
    print(tally.table())
    return 1 if tally.total_different() else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

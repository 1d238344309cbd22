"""The Produce frame path (KafkaApis.handle -> handle_produce_frame, protocol/_produce.c's decode_frame) answers real
clients byte for byte as the general path does: confluent-kafka and kafka-python, idempotent and not, acks 0, 1 and
all, each producing one record per request through a recording proxy to a compiled broker and to one on the Python
references (KBROKER_PURE_PYTHON=1: handle_produce and the generated codec); the Produce responses are the same bytes
(correlation ids aside, checked against each request's), acks=0's records are all there, and the partition's
segment holds the same bytes on both. Hostile Produce frames
(a header cut short, a client id length that lies, a version the direct decode does not take, a v1 header under a
flexible version and the reverse) get the same answer or the same closed connection from both (~25 s). Transactional
producers of both libraries, one record per request in a committed and then an aborted transaction, get the same
Produce answers too (the frame path's single-partition append with the KIP-890 guard against handle_produce)."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kbroker.broker import produce_codec
from kbroker.protocol import codec
from kbroker.protocol import records as R
from kbroker.protocol.accelerators import PURE_PYTHON_ENV
from kbroker.protocol.messages import CreateTopicsRequest, ProduceRequest, RequestHeader

from tests.broker_process import BrokerProcess, free_port
from tests.chaos_proxy import _recv_frame
from tests.clients import RawClient, kp_consume, wait_until

C = CreateTopicsRequest
P = ProduceRequest
RECORDS = 5


class RecordingProxy:
    """Forwards whole frames between clients and one broker, keeping each connection's (request, response) frames
    matched by correlation id (a Produce with acks=0 has no response)."""

    def __init__(self, broker_port: int, port: int) -> None:
        self.broker_port = broker_port
        self.listener = socket.create_server(("127.0.0.1", port))
        self.exchanges: list[tuple[bytes, bytes | None]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            broker = socket.create_connection(("127.0.0.1", self.broker_port))
            pending: dict[int, bytes] = {}
            threading.Thread(target=self._requests, args=(client, broker, pending), daemon=True).start()
            threading.Thread(target=self._responses, args=(broker, client, pending), daemon=True).start()

    def _requests(self, client: socket.socket, broker: socket.socket, pending: dict[int, bytes]) -> None:
        while (frame := _recv_frame(client)) is not None:
            api_key, _, correlation_id = struct.unpack_from(">hhi", frame, 4)
            with self._lock:
                if api_key == 0 and frame_acks(frame) == 0:
                    self.exchanges.append((frame, None))
                else:
                    pending[correlation_id] = frame
            broker.sendall(frame)
        broker.close()

    def _responses(self, broker: socket.socket, client: socket.socket, pending: dict[int, bytes]) -> None:
        while (frame := _recv_frame(broker)) is not None:
            (correlation_id,) = struct.unpack_from(">i", frame, 4)
            with self._lock:
                self.exchanges.append((pending.pop(correlation_id), frame))
            client.sendall(frame)
        client.close()

    def produce_answers(self) -> list[tuple[bytes, bytes | None]]:
        with self._lock:
            return [(req, resp) for req, resp in self.exchanges if struct.unpack_from(">h", req, 4)[0] == 0]

    def close(self) -> None:
        self.listener.close()


def frame_acks(frame: bytes) -> int:
    header, pos = codec.decode_request_header(frame[4:])
    req, _ = codec.decode(P, header.request_api_version, frame[4:], pos)
    return int(req.acks)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[tuple[BrokerProcess, RecordingProxy]]]:
    if not produce_codec.COMPILED:
        pytest.skip(
            f"protocol/_produce.c not built (python setup.py build_ext --inplace), or {PURE_PYTHON_ENV} is set"
        )
    out = []
    try:
        for name, env in (("compiled", None), ("python", {PURE_PYTHON_ENV: "1"})):
            proxy_port = free_port()
            broker = BrokerProcess(
                Path(tmp_path_factory.mktemp(name)),
                overrides={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy_port}"},
                env=env,
            ).start()
            out.append((broker, RecordingProxy(broker.port, proxy_port)))
        yield out
    finally:
        for broker, proxy in out:
            proxy.close()
            broker.stop()


def _create(broker: BrokerProcess, topic: str) -> None:
    with RawClient(broker.bootstrap, timeout=15) as conn:
        resp = conn.request(
            19,
            7,
            C(
                topics=[C.CreatableTopic(name=topic, num_partitions=1, replication_factor=1)],
                timeout_ms=15000,
            ),
        )
        assert all(t.error_code == 0 for t in resp.topics)


def _ck(bootstrap: str, topic: str, idempotent: bool, acks: int) -> None:
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": idempotent,
            "acks": acks,
            "linger.ms": 0,
            "socket.timeout.ms": 10000,
        }
    )
    errors: list[Any] = []
    for i in range(RECORDS):
        p.produce(
            topic,
            key=b"k%d" % i,
            value=b"v" * (10 + i),
            timestamp=1_700_000_000_000 + i,
            on_delivery=lambda err, _m: errors.append(err) if err else None,
        )
        assert p.flush(15) == 0
    assert not errors


def _kp(bootstrap: str, topic: str, idempotent: bool, acks: int) -> None:
    from kafka import KafkaProducer

    p = KafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=idempotent,
        acks=acks if acks != -1 else "all",
        linger_ms=0,
    )
    try:
        for i in range(RECORDS):
            p.send(topic, key=b"k%d" % i, value=b"v" * (10 + i), timestamp_ms=1_700_000_000_000 + i).get(15)
    finally:
        p.close(timeout=5)


CASES = [
    ("ck", True, -1),
    ("ck", False, 0),
    ("ck", False, 1),
    ("ck", False, -1),
    ("kp", True, -1),
    ("kp", False, 0),
    ("kp", False, 1),
    ("kp", False, -1),
]


@pytest.mark.parametrize("client, idempotent, acks", CASES)
def test_real_clients_get_the_same_produce_answers(
    pair: list[tuple[BrokerProcess, RecordingProxy]], client: str, idempotent: bool, acks: int
) -> None:
    topic = f"{client}-{'idem' if idempotent else 'plain'}-{acks}".replace("-1", "all")
    answers = []
    for broker, proxy in pair:
        _create(broker, topic)
        before = len(proxy.produce_answers())
        bootstrap = f"127.0.0.1:{proxy.listener.getsockname()[1]}"
        (_ck if client == "ck" else _kp)(bootstrap, topic, idempotent, acks)
        # one record per request: the requests are the same on both brokers (acks=0's reach the proxy after
        # the client's send returned)
        got = wait_until(
            lambda p=proxy, b=before: (g := p.produce_answers()[b:]) and len(g) >= RECORDS and g,
            what="the Produce requests through the proxy",
        )
        assert len(got) == RECORDS, got
        answers.append(got)
    for (req_c, resp_c), (req_p, resp_p) in zip(*answers, strict=True):
        if acks == 0:
            assert resp_c is None and resp_p is None
            continue
        assert resp_c is not None and resp_p is not None
        assert resp_c[4:8] == req_c[8:12] and resp_p[4:8] == req_p[8:12]  # each answers its own request
        assert resp_c[:4] + resp_c[8:] == resp_p[:4] + resp_p[8:]  # byte for byte, correlation ids aside
    if acks == 0:  # nothing answered: every record is there on both, at the same offsets
        stored = [
            [(r.offset, r.key, r.value) for r in kp_consume(b.bootstrap, topic, [0], RECORDS)]
            for b, _ in pair
        ]
        assert stored[0] == stored[1] and len(stored[0]) == RECORDS
    # The same bytes on disk: the compiled broker's one-call append (storage/leader_append.append_plain) wrote what
    # the Python references wrote (the same batches from the same client, the same producer ids and offsets).
    segments = [
        wait_until(
            lambda b=b: (data := _segment(b, topic)).count(b"\x02") and _batches(data) == RECORDS and data,
            what="the records on disk",
        )
        for b, _ in pair
    ]
    assert segments[0] == segments[1]


def _segment(broker: BrokerProcess, topic: str) -> bytes:
    path = broker.data_dir / "logs" / f"{topic}-0" / "00000000000000000000.log"
    return path.read_bytes() if path.exists() else b""


def _batches(data: bytes) -> int:
    count, pos = 0, 0
    while pos + 12 <= len(data):
        pos += 12 + struct.unpack_from(">i", data, pos + 8)[0]
        count += 1
    return count


# Transactional producers: one record per request in a transaction that commits, then in one that aborts, so the
# frame path's single-partition append opens a transaction (KIP-890 verified with the coordinator), continues it,
# and opens the next after the COMMIT marker; the Python broker serves the same requests through handle_produce.
TXN_SPLIT = 3  # records in the committed transaction; the rest of RECORDS in the aborted one


def _ck_txn(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"{topic}-txn",
            "linger.ms": 0,
            "socket.timeout.ms": 10000,
        }
    )
    p.init_transactions(30)
    for records, commit in ((range(TXN_SPLIT), True), (range(TXN_SPLIT, RECORDS), False)):
        p.begin_transaction()
        for i in records:
            p.produce(topic, key=b"k%d" % i, value=b"v" * (10 + i), timestamp=1_700_000_000_000 + i)
            assert p.flush(15) == 0
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)


def _kp_txn(bootstrap: str, topic: str) -> None:
    from kafka import KafkaProducer

    p = KafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"{topic}-txn", enable_idempotence=True, linger_ms=0
    )
    try:
        p.init_transactions()
        for records, commit in ((range(TXN_SPLIT), True), (range(TXN_SPLIT, RECORDS), False)):
            p.begin_transaction()
            for i in records:
                p.send(topic, key=b"k%d" % i, value=b"v" * (10 + i), timestamp_ms=1_700_000_000_000 + i).get(
                    15
                )
            (p.commit_transaction if commit else p.abort_transaction)()
    finally:
        p.close(timeout=5)


@pytest.mark.parametrize("client", ["ck", "kp"])
def test_transactional_clients_get_the_same_produce_answers(
    pair: list[tuple[BrokerProcess, RecordingProxy]], client: str
) -> None:
    topic = f"{client}-txn"
    answers = []
    for broker, proxy in pair:
        _create(broker, topic)
        before = len(proxy.produce_answers())
        bootstrap = f"127.0.0.1:{proxy.listener.getsockname()[1]}"
        (_ck_txn if client == "ck" else _kp_txn)(bootstrap, topic)
        got = proxy.produce_answers()[before:]
        assert len(got) == RECORDS, got
        answers.append(got)
    for (req_c, resp_c), (req_p, resp_p) in zip(*answers, strict=True):
        assert resp_c is not None and resp_p is not None
        assert resp_c[4:8] == req_c[8:12] and resp_p[4:8] == req_p[8:12]
        assert resp_c[:4] + resp_c[8:] == resp_p[:4] + resp_p[8:]
    # what both stored: the three committed records, the COMMIT marker, the two aborted ones and the ABORT marker
    committed = [
        [
            (r.offset, r.key, r.value)
            for r in kp_consume(b.bootstrap, topic, [0], TXN_SPLIT, isolation_level="read_committed")
        ]
        for b, _ in pair
    ]
    assert committed[0] == committed[1] == [(i, b"k%d" % i, b"v" * (10 + i)) for i in range(TXN_SPLIT)]


def _raw(version: int, client_id: bytes | None, tagged: bytes, body: bytes, correlation_id: int = 7) -> bytes:
    head = struct.pack(">hhi", 0, version, correlation_id)
    head += struct.pack(">h", -1) if client_id is None else struct.pack(">h", len(client_id)) + client_id
    frame = head + tagged + body
    return struct.pack(">i", len(frame)) + frame


def _body(version: int, topic: str, batch: bytes) -> bytes:
    req = P(
        acks=1,
        timeout_ms=5000,
        topic_data=[
            P.TopicProduceData(name=topic, partition_data=[P.PartitionProduceData(index=0, records=batch)])
        ],
    )
    header = RequestHeader(request_api_key=0, request_api_version=version, correlation_id=1, client_id=None)
    frame = bytes(codec.encode_request(header, req))[4:]
    return frame[codec.decode_request_header(frame)[1] :]


def _answer(broker: BrokerProcess, frame: bytes) -> bytes | None:
    """The broker's answer to one frame on a new connection, or None when it closes the connection."""
    with RawClient(broker.bootstrap, timeout=10) as conn:
        conn.send_bytes(frame)
        try:
            return conn.recv_frame()
        except (ConnectionError, OSError):
            return None


def test_hostile_produce_frames_get_the_same_answer(pair: list[tuple[BrokerProcess, RecordingProxy]]) -> None:
    for broker, _ in pair:
        _create(broker, "hostile")
    batch = R.build_batch([(b"k", b"v", (), 1_700_000_000_000)])
    v9, v8 = _body(9, "hostile", batch), _body(8, "hostile", batch)
    frames = {
        "common v9": _raw(9, b"c", b"\x00", v9),
        "common v8": _raw(8, b"c", b"", v8),
        "null client id": _raw(9, None, b"\x00", v9),
        "header tagged fields": _raw(9, b"c", b"\x02\x05\x01x\x06\x00", v9),
        "header cut in the client id": struct.pack(">i", 11) + _raw(9, b"client", b"", b"")[4:-3],
        "client id length past the frame": struct.pack(">i", 12) + struct.pack(">hhih", 0, 9, 7, 400) + b"ab",
        "client id length -2": _raw(9, b"", b"\x00", v9)[:12] + struct.pack(">h", -2) + b"\x00" + v9,
        "client id not UTF-8": _raw(9, b"\xff\xfe", b"\x00", v9),
        "v1 header under v9": _raw(9, b"c", b"", v9),
        "v2 header under v8": _raw(8, b"c", b"\x00", v8),
        "header tagged field past the frame": _raw(9, b"c", b"\x01\x05\x7f", b""),
        "version 12": _raw(12, b"c", b"\x00", v9),
        "version 2": _raw(2, b"c", b"", _body(2, "hostile", batch)),
        "version -1": _raw(-1, b"c", b"", v8),
        "body cut short": _raw(9, b"c", b"\x00", v9[:-5]),
        "acks 2": _raw(9, b"c", b"\x00", v9[:1] + struct.pack(">h", 2) + v9[3:]),
    }
    for what, frame in frames.items():
        compiled, python = (_answer(broker, frame) for broker, _ in pair)
        assert compiled == python, what
    # Both brokers took the requests that decode: the common ones appended, each at the same offsets.
    stored = [[(r.offset, r.value) for r in kp_consume(b.bootstrap, "hostile", [0], 5)] for b, _ in pair]
    assert stored[0] == stored[1] and len(stored[0]) == 5
    assert "produce path compiled" in pair[0][0].read_log()

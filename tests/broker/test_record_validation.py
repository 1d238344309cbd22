"""Produce walks every record (Kafka's LogValidator): poison-pill batches under a valid CRC are refused before
a librdkafka consumer can stall on them, and per-record refusals (no key on a compacted topic, timestamps out
of range) come back in Produce v8+ `record_errors` with Kafka's messages."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from kbroker.broker import produce_codec
from kbroker.protocol import codec as wire_codec
from kbroker.protocol import framing
from kbroker.protocol import records as R
from kbroker.protocol.accelerators import PURE_PYTHON_ENV
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import ProduceRequest
from kbroker.protocol.record_walk import COMPILED

from tests.broker_process import BrokerProcess
from tests.clients import Msg, ProduceFailed, RawClient, ck_consume, ck_produce
from tests.protocol.test_record_walk import VARINT_FIELDS, record_with_widths

T = 15
HOUR = 3_600_000


@pytest.fixture(scope="module", params=["compiled", "pure-python"])
def broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """Every test here runs against a broker with the compiled codec, record walk and batch scan and against one with their
    Python references (the accelerators are optional: a machine without a compiler runs the Python ones, which
    must decode the same requests and refuse the same batches)."""
    if request.param == "compiled" and not (COMPILED and wire_codec.COMPILED and R.SCAN_COMPILED and produce_codec.COMPILED
                                            and framing.COMPILED):
        pytest.skip("protocol/_record_walk.c, _codec.c, _batch_scan.c, _produce.c or _frames.c not built "
                    "(python setup.py build_ext --inplace)")
    env = {PURE_PYTHON_ENV: "1"} if request.param == "pure-python" else None
    b = BrokerProcess(tmp_path_factory.mktemp("broker"), env=env).start()
    deadline = time.monotonic() + T
    while "started in" not in b.read_log() and time.monotonic() < deadline:
        time.sleep(0.05)
    kind = "pure Python" if env else "compiled"
    for part in ("codec", "record walk", "batch scan", "produce path", "framing"):
        assert f"{part} {kind}" in b.read_log(), b.read_log()[-2000:]
    yield b
    b.stop()


def _create(bootstrap: str, name: str, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(T)


def _produce_raw(bootstrap: str, topic: str, batch: bytes, version: int = 9) -> ProduceRequest:
    P = ProduceRequest
    req = P(acks=-1, timeout_ms=10000, topic_data=[P.TopicProduceData(
        name=topic, partition_data=[P.PartitionProduceData(index=0, records=batch)])])
    with RawClient(bootstrap) as raw:
        return raw.request(0, version, req).responses[0].partition_responses[0]


def _now() -> int:
    return int(time.time() * 1000)


def _recrc(raw: bytearray) -> bytes:
    raw[17:21] = R.compute_crc(raw, 0, len(raw)).to_bytes(4, "big")
    return bytes(raw)


def _with_payload(codec: int, payload: bytes, count: int) -> bytes:
    """A batch with a correct header (codec, lastOffsetDelta = count - 1, recordsCount) and CRC around payload."""
    template = bytearray(R.build_batch([(b"k", b"v", (), _now())]))
    out = bytearray(template[:R.BATCH_HEADER_SIZE]) + payload
    out[8:12] = (R.BATCH_OVERHEAD + len(payload)).to_bytes(4, "big")
    out[21:23] = codec.to_bytes(2, "big")
    out[23:27] = (count - 1).to_bytes(4, "big")
    out[57:61] = count.to_bytes(4, "big")
    return _recrc(out)


def _with_body(codec: int, body: bytes, count: int) -> bytes:
    """The records `body`, compressed with codec, in a batch with a correct header and CRC."""
    return _with_payload(codec, R.compress(codec, body) if codec else body, count)


def _records_body(n: int) -> bytes:
    return R.build_batch([(b"k%d" % i, b"value-%d" % i, (), _now()) for i in range(n)])[R.BATCH_HEADER_SIZE:]


def _poison_pills(codec: int) -> dict[str, bytes]:
    two = _records_body(2)
    # record 0's length varint (a one-byte zigzag) claims one byte more than the record has
    lying_length = bytearray(two)
    lying_length[0] += 2
    # a header count of 1 on a record that has no header bytes left
    lying_headers = bytearray(_records_body(1))
    assert lying_headers[-1] == 0
    lying_headers[-1] = 2
    return {
        "garbage records": _with_body(codec, bytes(range(7, 7 + 40)), 3),
        "count 3, 2 records": _with_body(codec, two, 3),
        "count 1, 2 records": _with_body(codec, two, 1),
        "record length lies": _with_body(codec, bytes(lying_length), 2),
        "header count lies": _with_body(codec, bytes(lying_headers), 1),
        "offset deltas 0, 0": _dup_first(codec, two),
        "no records at all": _with_body(codec, b"", 1),
    }


def _dup_first(codec: int, two: bytes) -> bytes:
    # the first record twice: both claim offset delta 0
    first = two[: 1 + (two[0] >> 1)]
    return _with_body(codec, first + first, 2)


@pytest.mark.parametrize("codec", [R.COMPRESSION_NONE, R.COMPRESSION_LZ4, R.COMPRESSION_ZSTD],
                         ids=["none", "lz4", "zstd"])
def test_poison_pill_batches_are_refused_and_consumers_read_on(broker, topic_name: str, codec: int) -> None:
    _create(broker.bootstrap, topic_name)
    good = [Msg(b"k%d" % i, b"before-%d" % i, partition=0) for i in range(5)]
    ck_produce(broker.bootstrap, topic_name, good, timeout=T, **{"compression.type": "lz4"})
    for what, batch in _poison_pills(codec).items():
        assert list(R.iter_batch_headers(batch)), what  # a valid header and CRC: only the records lie
        resp = _produce_raw(broker.bootstrap, topic_name, batch)
        assert resp.error_code == ErrorCode.INVALID_RECORD, (what, resp.error_code, resp.error_message)
        assert resp.error_message and resp.base_offset == -1, what
    if codec:
        # a compressed payload that does not inflate (the README used to let these through)
        resp = _produce_raw(broker.bootstrap, topic_name, _with_payload(codec, b"\x00not a compressed frame", 1))
        assert resp.error_code == ErrorCode.CORRUPT_MESSAGE, resp.error_message
    later = [Msg(b"k%d" % i, b"after-%d" % i, partition=0) for i in range(5)]
    ck_produce(broker.bootstrap, topic_name, later, timeout=T)
    # librdkafka reads everything from the beginning: nothing refused reached the log
    got = ck_consume(broker.bootstrap, topic_name, [0], 10, timeout=T)
    assert [r.value for r in got] == [m.value for m in good + later]
    assert [r.offset for r in got] == list(range(10))


@pytest.mark.parametrize("codec", [R.COMPRESSION_NONE, R.COMPRESSION_ZSTD], ids=["none", "zstd"])
def test_over_long_record_varints_are_refused(broker, topic_name: str, codec: int) -> None:
    # Kafka reads record varints with ByteUtils.readVarint (5 bytes at most; only the timestamp delta is a
    # 10-byte varlong): a key length of 1 written in 10 bytes is INVALID_RECORD, and nothing is stored.
    _create(broker.bootstrap, topic_name)
    for field in VARINT_FIELDS:
        width = 10 if field != "timestamp" else 11
        body = record_with_widths(0, {}) + record_with_widths(1, {field: width})
        resp = _produce_raw(broker.bootstrap, topic_name, _with_body(codec, body, 2))
        assert resp.error_code == ErrorCode.INVALID_RECORD, (field, resp.error_code, resp.error_message)
        assert resp.error_message.startswith("Found invalid record structure"), (field, resp.error_message)
        assert resp.base_offset == -1
    # five bytes everywhere and a ten-byte timestamp delta are what Kafka still reads: stored, and librdkafka
    # reads the records back
    widths = {f: 5 for f in VARINT_FIELDS} | {"timestamp": 10}
    body = record_with_widths(0, widths, key=b"a", value=b"first") + record_with_widths(1, widths, key=b"b",
                                                                                         value=b"second")
    resp = _produce_raw(broker.bootstrap, topic_name, _with_body(codec, body, 2))
    assert (resp.error_code, resp.base_offset) == (0, 0), resp.error_message
    got = ck_consume(broker.bootstrap, topic_name, [0], 2, timeout=T)
    assert [(r.key, r.value, r.offset) for r in got] == [(b"a", b"first", 0), (b"b", b"second", 1)]
    assert list(got[0].headers) == [("h", b"x")]


def test_compacted_topic_reports_each_keyless_record(broker, topic_name: str) -> None:
    _create(broker.bootstrap, topic_name, **{"cleanup.policy": "compact"})
    now = _now()
    keys = [None, b"a", b"b", None, b"c"]
    for codec in (R.COMPRESSION_NONE, R.COMPRESSION_ZSTD):
        batch = R.build_batch([(k, b"v", (), now) for k in keys], compression=codec)
        resp = _produce_raw(broker.bootstrap, topic_name, batch)
        assert resp.error_code == ErrorCode.INVALID_RECORD
        assert [e.batch_index for e in resp.record_errors] == [0, 3]
        msg = f"Compacted topic cannot accept message without key in topic partition {topic_name}-0"
        assert [e.batch_index_error_message for e in resp.record_errors] == [msg, msg]
        assert resp.error_message == (
            "One or more records have been rejected due to 2 record errors in total, and only showing the first "
            f"three errors at most: [RecordError(batchIndex=0, message='{msg}'), "
            f"RecordError(batchIndex=3, message='{msg}')]")
    # before v8 the response has no record_errors; the partition error is the same
    old = _produce_raw(broker.bootstrap, topic_name, R.build_batch([(None, b"v", (), now)]), version=7)
    assert old.error_code == ErrorCode.INVALID_RECORD
    # librdkafka fails the keyless message with INVALID_RECORD; keyed ones are stored
    with pytest.raises(ProduceFailed) as failed:
        ck_produce(broker.bootstrap, topic_name, [Msg(None, b"no key", partition=0)], timeout=T)
    assert failed.value.errors[0].code() == KafkaError.INVALID_RECORD
    ck_produce(broker.bootstrap, topic_name, [Msg(b"a", b"keyed", partition=0)], timeout=T)
    assert [r.value for r in ck_consume(broker.bootstrap, topic_name, [0], 1, timeout=T)] == [b"keyed"]


def test_timestamps_out_of_range_are_refused_per_record(broker, topic_name: str) -> None:
    _create(broker.bootstrap, topic_name, **{"message.timestamp.before.max.ms": str(HOUR),
                                             "message.timestamp.after.max.ms": str(HOUR)})
    now = _now()
    stamps = [now, now - 2 * HOUR, now + 60_000, now + 2 * HOUR]
    resp = _produce_raw(broker.bootstrap, topic_name, R.build_batch([(b"k", b"v", (), ts) for ts in stamps]))
    assert resp.error_code == ErrorCode.INVALID_TIMESTAMP
    assert resp.error_message == "One or more records have been rejected due to invalid timestamp"
    assert [e.batch_index for e in resp.record_errors] == [1, 3]
    m = resp.record_errors[0].batch_index_error_message
    assert m.startswith(f"Timestamp {now - 2 * HOUR} of message with offset 1 is out of range. The timestamp "
                        "should be within ["), m
    # confluent-kafka: a message two hours old fails with INVALID_TIMESTAMP, a current one is stored
    with pytest.raises(ProduceFailed) as failed:
        ck_produce(broker.bootstrap, topic_name, [Msg(b"k", b"old", partition=0, timestamp=now - 2 * HOUR)],
                   timeout=T)
    assert failed.value.errors[0].code() == KafkaError.INVALID_TIMESTAMP
    [rec] = ck_produce(broker.bootstrap, topic_name, [Msg(b"k", b"fresh", partition=0)], timeout=T)
    assert rec.offset == 0
    # the deprecated difference key still applies when before/after are left at their defaults
    other = topic_name + "-diff"
    _create(broker.bootstrap, other, **{"message.timestamp.difference.max.ms": str(HOUR)})
    resp = _produce_raw(broker.bootstrap, other, R.build_batch([(b"k", b"v", (), now + 2 * HOUR)]))
    assert resp.error_code == ErrorCode.INVALID_TIMESTAMP and [e.batch_index for e in resp.record_errors] == [0]


def test_client_batches_may_not_claim_log_append_time(broker, topic_name: str) -> None:
    _create(broker.bootstrap, topic_name, **{"message.timestamp.type": "LogAppendTime"})
    batch = R.build_batch([(b"k", b"v", (), _now())] * 2, timestamp_type=R.TIMESTAMP_LOG_APPEND_TIME)
    resp = _produce_raw(broker.bootstrap, topic_name, batch)
    assert resp.error_code == ErrorCode.INVALID_TIMESTAMP
    assert [e.batch_index for e in resp.record_errors] == [0, 1]
    assert "Producer should not set timestamp type to LogAppendTime" in resp.record_errors[0].batch_index_error_message


def test_broker_level_timestamp_bounds_apply_to_topics_without_their_own(broker, topic_name: str) -> None:
    _create(broker.bootstrap, topic_name)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})

    def set_after(value: str | None) -> None:
        op = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
        entry = ConfigEntry("log.message.timestamp.after.max.ms", value, incremental_operation=op)
        res = ConfigResource(ConfigResource.Type.BROKER, "0", incremental_configs=[entry])
        for f in admin.incremental_alter_configs([res]).values():
            f.result(T)

    future = R.build_batch([(b"k", b"v", (), _now() + 2 * HOUR)])
    set_after(str(HOUR))
    try:
        resp = _produce_raw(broker.bootstrap, topic_name, future)
        assert resp.error_code == ErrorCode.INVALID_TIMESTAMP and [e.batch_index for e in resp.record_errors] == [0]
    finally:
        set_after(None)
    assert _produce_raw(broker.bootstrap, topic_name, future).error_code == 0

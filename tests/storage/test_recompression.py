"""Topic compression.type: batches whose codec differs are recompressed on append (Kafka's LogValidator), keeping
offsets, timestamps and producer metadata; "producer" stores batches as sent; control batches are never touched."""

from __future__ import annotations

import pytest
from kbroker.protocol.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    Record,
    build_batch,
    decode_records,
    iter_batch_headers,
    recompress_batch,
    validate_batches,
)
from kbroker.storage.config import LogConfig
from kbroker.storage.errors import RecordTooLargeError

from tests.storage.storage_helpers import NOW, read_all

CODECS = {"uncompressed": COMPRESSION_NONE, "gzip": COMPRESSION_GZIP, "snappy": COMPRESSION_SNAPPY,
          "lz4": COMPRESSION_LZ4, "zstd": COMPRESSION_ZSTD}


def _records(n: int, tag: str) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]]:
    return [(f"{tag}-{i}".encode() if i % 7 else None, (f"{tag}-value-{i}-" * (i % 50)).encode() or None,
             [("h", str(i).encode()), ("none", None)] if i % 3 == 0 else [], NOW + 5 * i) for i in range(n)]


def _stored(log) -> list[tuple[int, object]]:  # type: ignore[no-untyped-def]
    info = log.read(0, 1 << 24)
    data = info.records.read_bytes()
    return [(pos, h) for pos, h in iter_batch_headers(data)], data


@pytest.mark.parametrize("target", list(CODECS))
@pytest.mark.parametrize("source", [COMPRESSION_NONE, COMPRESSION_LZ4, COMPRESSION_GZIP])
def test_recompressed_on_append_keeping_everything(make_log, target, source):
    log = make_log(compression_type=target)
    # An idempotent producer's batch and a plain one, 3,000 records in all (several lz4/snappy blocks).
    first = build_batch(_records(2000, "a"), compression=source, producer_id=42, producer_epoch=3,
                        base_sequence=0)
    second = build_batch(_records(1000, "b"), compression=source)
    for b in (first, second):
        log.append_as_leader(bytearray(b), NOW)
    sent = decode_records(first) + [Record(r.offset + 2000, r.timestamp, r.key, r.value, r.headers, r.attributes)
                                    for r in decode_records(second)]
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in read_all(log)] == \
        [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in sent]
    headers, _ = _stored(log)
    assert [h.compression for _, h in headers] == [CODECS[target]] * 2
    h1, h2 = headers[0][1], headers[1][1]
    assert (h1.base_offset, h1.last_offset_delta, h1.records_count) == (0, 1999, 2000)
    assert (h1.producer_id, h1.producer_epoch, h1.base_sequence) == (42, 3, 0)
    assert (h1.base_timestamp, h1.max_timestamp) == (NOW, NOW + 5 * 1999)
    assert (h2.base_offset, h2.producer_id, h2.base_sequence) == (2000, -1, -1)
    # The producer state saw the batch: a retry of it is a duplicate answered with its offsets.
    dup = log.append_as_leader(bytearray(first), NOW)
    assert (dup.first_offset, dup.last_offset) == (0, 1999) and log.log_end_offset == 3000


def test_producer_keeps_the_batch_as_sent(make_log):
    log = make_log()  # compression.type=producer is the default
    b = build_batch(_records(100, "p"), compression=COMPRESSION_SNAPPY)
    log.append_as_leader(bytearray(b), NOW)
    headers, data = _stored(log)
    assert [h.compression for _, h in headers] == [COMPRESSION_SNAPPY]
    assert data[61:] == b[61:]


def test_same_codec_is_not_rebuilt(make_log):
    log = make_log(compression_type="zstd", compression_zstd_level=19)
    b = build_batch(_records(100, "z"), compression=COMPRESSION_ZSTD)
    log.append_as_leader(bytearray(b), NOW)
    _, data = _stored(log)
    assert data[61:] == b[61:]


def test_control_batches_are_never_recompressed(make_log):
    log = make_log(compression_type="gzip")
    marker = build_batch([(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", [], NOW)], producer_id=7,
                         producer_epoch=0, is_transactional=True, is_control=True)
    log.append_as_leader(bytearray(marker), NOW, from_client=False)
    log.append_as_leader(bytearray(build_batch(_records(10, "c"))), NOW)
    headers, _ = _stored(log)
    assert [(h.is_control, h.compression) for _, h in headers] == [(True, COMPRESSION_NONE), (False, COMPRESSION_GZIP)]


def test_log_append_time_after_recompression(make_log):
    log = make_log(compression_type="lz4", message_timestamp_type="LogAppendTime")
    info = log.append_as_leader(bytearray(build_batch(_records(10, "t"))), NOW + 999)
    assert info.log_append_time == NOW + 999
    assert {r.timestamp for r in read_all(log)} == {NOW + 999}
    headers, data = _stored(log)
    validate_batches(data, from_client=False)  # the CRC covers the rewritten header
    assert headers[0][1].compression == COMPRESSION_LZ4


def test_recompressed_batch_larger_than_max_message_bytes(make_log):
    # Incompressible values grow a little under gzip: a batch at the limit no longer fits once rebuilt.
    import os

    raw = build_batch([(b"k", os.urandom(4000), [], NOW)])
    log = make_log(compression_type="gzip", max_message_bytes=len(raw))
    with pytest.raises(RecordTooLargeError):
        log.append_as_leader(bytearray(raw), NOW)
    assert log.log_end_offset == 0


def test_recompress_batch_levels():
    body = [(b"k", b"abcdefgh" * 4000, [], NOW)]
    b = build_batch(body)
    fast = recompress_batch(b, 0, COMPRESSION_ZSTD, 1)
    best = recompress_batch(b, 0, COMPRESSION_ZSTD, 19)
    for out in (fast, best):
        validate_batches(out)
        assert [(r.key, r.value) for r in decode_records(out)] == [(b"k", b"abcdefgh" * 4000)]
    gz = recompress_batch(b, 0, COMPRESSION_GZIP, 1)
    assert decode_records(gz)[0].value == b"abcdefgh" * 4000


def test_compression_configs_validated():
    base = LogConfig()
    cfg = LogConfig.from_topic_configs(base, {"compression.type": "zstd", "compression.zstd.level": "-5",
                                              "compression.gzip.level": "9", "compression.lz4.level": "17"})
    assert (cfg.compression_type, cfg.target_codec, cfg.compression_level) == ("zstd", COMPRESSION_ZSTD, -5)
    assert LogConfig().target_codec is None
    for key, bad in [("compression.type", "brotli"), ("compression.gzip.level", "0"),
                     ("compression.gzip.level", "10"), ("compression.lz4.level", "18"),
                     ("compression.zstd.level", "23")]:
        with pytest.raises(ValueError, match=key):
            LogConfig.from_topic_configs(base, {key: bad})

"""Fuzzing Produce with record batches (every codec) that are valid or corrupted: bad CRC, lengths and
counts that lie, garbage compressed payloads with a correct CRC, codecs swapped, truncation, tails.

Each produce answers with an error code other than UNKNOWN_SERVER_ERROR, the broker stays alive with no
traceback in its log, a raw round trip works after each example, and at the end everything the
compacted topic accepted decodes record by record and the cleaner never gave up on it."""

from __future__ import annotations

import time

from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import strategies as st
from kbroker.protocol import records as R

from tests.broker_process import BrokerProcess
from tests.fuzz.common import Raw, budget, record_batch, run_for
from tests.fuzz.test_broker_fuzz import LogWatch, assert_healthy

PLAIN = "batches-plain"
COMPACT = "batches-compact"


def _fetch_all(raw: Raw, topic: str, partition: int) -> list[bytes]:
    """Every batch of the partition, read with raw Fetch requests from offset 0."""
    batches: list[bytes] = []
    offset = 0
    for _ in range(10000):
        part = raw.fetch(topic, partition, offset)
        assert part.error_code == 0, part.error_code
        data = bytes(part.records or b"")
        got = [(pos, h) for pos, h in R.iter_batch_headers(data) if h.next_offset > offset]
        if not got:
            return batches
        for pos, h in got:
            batches.append(data[pos:pos + h.size_in_bytes])
            offset = h.next_offset
    return batches


def test_produce_corrupted_batches(fuzz_broker: BrokerProcess) -> None:
    watch = LogWatch(fuzz_broker)
    bootstrap = fuzz_broker.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([
        NewTopic(PLAIN, 2, 1),
        NewTopic(COMPACT, 2, 1, config={"cleanup.policy": "compact", "segment.bytes": "2000",
                                        "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "100"}),
    ]).values():
        f.result(30)

    def check(sends: list[tuple[str, int, bytes]]) -> None:
        with Raw(bootstrap) as raw:
            for topic, partition, batch in sends:
                resp = raw.produce(topic, partition, batch)
                # A corrupt batch is refused as a whole with an error code (CORRUPT_MESSAGE, INVALID_RECORD,
                # a producer-state error...), never UNKNOWN_SERVER_ERROR, which stands for an unexpected exception.
                assert resp.error_code != -1, (resp.error_code, resp.error_message)
        assert_healthy(fuzz_broker, watch, f"{len(sends)} produce requests")

    send = st.tuples(st.sampled_from([PLAIN, COMPACT]), st.integers(0, 1), record_batch(corrupt=True))
    chunks = run_for(budget("batches"), st.lists(send, min_size=1, max_size=4), check, chunk=30)
    print(f"batch fuzz: {chunks} chunks of 30 examples")

    # Whatever a compacted topic accepted must decode record by record (the cleaner relies on it), and
    # the cleaner must not have given up on any partition.
    time.sleep(1.0)
    with Raw(bootstrap) as raw:
        for partition in (0, 1):
            for batch in _fetch_all(raw, COMPACT, partition):
                R.decode_records(batch)
    log = watch.new()
    assert "uncleanable" not in log, log[-6000:]
    assert not watch.unexpected_tracebacks(log), log[-6000:]

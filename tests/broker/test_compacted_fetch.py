"""Compacted lz4/zstd topics read from the beginning by librdkafka: the cleaner never leaves an empty
compressed batch (librdkafka aborts on one: `rd_slice_init_full: Assertion 'r == 0' failed`), and such
batches an older version left on disk are rewritten when the log is loaded, before any fetch.

The consumer runs in a child process, so an abort fails the test instead of killing pytest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kbroker.protocol import records as R
from kbroker.storage.checkpoints import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile

from tests.broker_process import BrokerProcess
from tests.clients import Msg, ck_produce
from tests.fuzz.common import Raw
from tests.storage.storage_helpers import write_legacy_segment

T = 15

_CONSUMER = """
import json, sys, time
from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING
bootstrap, topic, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "compacted-fetch", "enable.auto.commit": False,
              "fetch.wait.max.ms": 100})
c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
got = []
deadline = time.monotonic() + 20
while len(got) < want and time.monotonic() < deadline:
    for m in c.consume(100, 0.5):
        if m.error():
            print(json.dumps({"error": str(m.error())}))
            sys.exit(2)
        got.append([m.offset(), (m.key() or b"").decode(), (m.value() or b"").decode()])
c.close()
print(json.dumps({"records": got}))
"""


def _consume_in_child(bootstrap: str, topic: str, want: int) -> list[list]:
    r = subprocess.run([sys.executable, "-c", _CONSUMER, bootstrap, topic, str(want)], capture_output=True,
                       timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr.decode(errors="replace")[-2000:])
    return json.loads(r.stdout.decode().strip().splitlines()[-1])["records"]


def _batches(bootstrap: str, topic: str) -> list[R.RecordBatchHeader]:
    headers: list[R.RecordBatchHeader] = []
    offset = 0
    with Raw(bootstrap) as raw:
        while True:
            part = raw.fetch(topic, 0, offset)
            assert part.error_code == 0
            got = [h for _, h in R.iter_batch_headers(bytes(part.records or b"")) if h.next_offset > offset]
            if not got:
                return headers
            headers.extend(got)
            offset = got[-1].next_offset


def _create(bootstrap: str, name: str, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(T)


@pytest.fixture(scope="module")
def cleaning_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("compacted-fetch"),
                      {"log.cleaner.backoff.ms": "200", "log.segment.delete.delay.ms": "100"})
    b.start()
    yield b
    b.stop()


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_idempotent_compacted_topic_reads_from_the_beginning(cleaning_broker: BrokerProcess, codec: str) -> None:
    topic = f"compacted-idempotent-{codec}"
    _create(cleaning_broker.bootstrap, topic, **{"cleanup.policy": "compact", "segment.bytes": "2000",
                                                 "min.cleanable.dirty.ratio": "0.01"})
    latest: dict[bytes, bytes] = {}
    for rnd in range(12):
        # one batch per round, every key rewritten by the next round: whole batches become empty
        msgs = [Msg(b"k%d" % k, b"r%d-k%d-" % (rnd, k) + os.urandom(40).hex().encode(), partition=0) for k in range(6)]
        ck_produce(cleaning_broker.bootstrap, topic, msgs, timeout=T, **{"enable.idempotence": True,
                                                                         "compression.type": codec,
                                                                         "linger.ms": 50})
        latest.update((m.key, m.value) for m in msgs)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        headers = _batches(cleaning_broker.bootstrap, topic)
        if sum(h.records_count for h in headers) < 72:
            break
        time.sleep(0.2)
    assert sum(h.records_count for h in headers) < 72, "nothing was compacted"
    assert not [h for h in headers if h.records_count == 0 and h.compression], headers
    got = _consume_in_child(cleaning_broker.bootstrap, topic, sum(h.records_count for h in headers))
    seen = {k.encode(): v.encode() for _, k, v in got}
    assert seen == latest


def test_empty_compressed_batches_on_disk_are_rewritten_at_load(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "legacy")
    broker.start()
    topic = "legacy-compacted"
    try:
        _create(broker.bootstrap, topic, **{"cleanup.policy": "compact"})
        ck_produce(broker.bootstrap, topic, [Msg(b"k", b"v", partition=0)], timeout=T)
    finally:
        broker.stop()
    logs = tmp_path / "legacy" / "logs"
    part = logs / f"{topic}-0"
    for f in part.iterdir():
        if f.suffix in (".log", ".index", ".timeindex", ".snapshot"):
            f.unlink()
    now = int(time.time() * 1000)
    # What the old cleaner left: producer 7's fully superseded batch as an empty lz4 batch, then live records.
    write_legacy_segment(part, [
        R.build_batch([], compression=R.COMPRESSION_LZ4, producer_id=7, producer_epoch=0, base_sequence=0,
                      last_offset_delta=1, max_timestamp=now),
        R.build_batch([(b"a", b"1", (), now), (b"b", b"1", (), now)], compression=R.COMPRESSION_LZ4),
    ])
    write_legacy_segment(part, [R.build_batch([(b"c", b"1", (), now)])], base_offset=4)
    cleaner = OffsetCheckpointFile(logs / CLEANER_OFFSET_CHECKPOINT)
    cleaner.write({**cleaner.read(), (topic, 0): 4})
    broker.start()
    try:
        headers = _batches(broker.bootstrap, topic)
        # producer 7's batch is its last (the producer state was rebuilt from the log): kept, uncompressed
        assert [(h.base_offset, h.records_count, h.compression) for h in headers] == [
            (0, 0, R.COMPRESSION_NONE), (2, 2, R.COMPRESSION_LZ4), (4, 1, R.COMPRESSION_NONE)]
        got = _consume_in_child(broker.bootstrap, topic, 3)
        assert [(o, k) for o, k, _ in got] == [(2, "a"), (3, "b"), (4, "c")]
        assert "Rewrote 1 empty compressed batches in segment 0" in broker.read_log()
    finally:
        broker.stop()

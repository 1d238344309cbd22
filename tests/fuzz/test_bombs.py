"""Decompression bombs against a real broker: small batches (KBs) whose payload inflates to 200 MB.

Every path that decompresses must stop at a bound derived from max.message.bytes: the produce path of a
compacted topic (key check), the log cleaner (a topic switched to compact after the bomb was written),
and timestamp lookups (ListOffsets). The broker's peak RSS (VmHWM) must stay below 500 MB."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from protocol import records as R
from protocol.errors import ErrorCode
from protocol.messages import ListOffsetsRequest
from tests.broker_process import BrokerProcess
from tests.fuzz.common import Raw, bomb_batch, round_trip, vm_hwm_mb

BOMB = 200 * 1024 * 1024
RSS_LIMIT_MB = 500
T = 30


@functools.cache
def bomb(compression: int) -> bytes:
    return bomb_batch(compression, BOMB)


@pytest.fixture(scope="module")
def bomb_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("bomb-broker"), {
        "log.cleaner.backoff.ms": "100", "log.segment.delete.delay.ms": "100"})
    b.start()
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    for f in admin.create_topics([NewTopic("fuzz-health", 1, 1)]).values():
        f.result(T)
    yield b
    if b.alive():
        b.stop()


def _create(bootstrap: str, name: str, config: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(T)


@pytest.fixture(autouse=True)
def _reset_peak_rss(bomb_broker: BrokerProcess) -> None:
    """Each test measures its own peak: writing 5 to clear_refs resets VmHWM to the current RSS."""
    with open(f"/proc/{bomb_broker.proc.pid}/clear_refs", "w") as fh:  # type: ignore[union-attr]
        fh.write("5")


def _assert_bounded(broker: BrokerProcess, what: str) -> None:
    assert broker.alive(), f"broker died after {what}:\n{broker.read_log()[-3000:]}"
    peak = vm_hwm_mb(broker.proc.pid)  # type: ignore[union-attr]
    print(f"{what}: broker peak RSS {peak:.0f} MB")
    assert peak < RSS_LIMIT_MB, f"broker peak RSS {peak:.0f} MB after {what}"
    round_trip(broker.bootstrap)


@pytest.mark.parametrize("compression", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_bomb_produced_to_compacted_topic_is_refused(bomb_broker: BrokerProcess, compression: int) -> None:
    topic = f"bomb-compact-{compression}"
    _create(bomb_broker.bootstrap, topic, {"cleanup.policy": "compact"})
    batch = bomb(compression)
    with Raw(bomb_broker.bootstrap, timeout=60) as raw:
        resp = raw.produce(topic, 0, batch)
    # snappy's xerial blocks hold 32 KB each, so its bomb is ~10 MB: MESSAGE_TOO_LARGE before any inflating.
    assert resp.error_code in (ErrorCode.CORRUPT_MESSAGE, ErrorCode.MESSAGE_TOO_LARGE), \
        (len(batch), resp.error_code, resp.error_message)
    _assert_bounded(bomb_broker, f"a {len(batch)}-byte codec {compression} bomb")


def test_cleaner_bounds_decompression(bomb_broker: BrokerProcess) -> None:
    """A bomb written while the topic was delete-only, then the topic switched to compact: the cleaner
    must refuse to inflate it (and may mark the partition uncleanable), without blowing up memory."""
    topic = "bomb-later-compacted"
    _create(bomb_broker.bootstrap, topic, {"segment.bytes": "1000", "min.cleanable.dirty.ratio": "0.01"})
    with Raw(bomb_broker.bootstrap, timeout=60) as raw:
        resp = raw.produce(topic, 0, bomb(4))
        assert resp.error_code == 0, resp.error_code  # the produce path of a delete topic reads headers only
        filler = [(b"k%d" % i, b"v" * 300, (), int(time.time() * 1000)) for i in range(12)]
        for rec in filler:
            assert raw.produce(topic, 0, R.build_batch([rec])).error_code == 0
    admin = AdminClient({"bootstrap.servers": bomb_broker.bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)])
    for f in admin.incremental_alter_configs([res]).values():
        f.result(T)
    # The cleaner refuses the bomb and marks the partition uncleanable (Kafka does the same with a batch
    # it cannot read); wait for that.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and f"Cleaner failed on {topic}" not in bomb_broker.read_log():
        time.sleep(0.2)
    log = bomb_broker.read_log()
    assert f"Cleaner failed on {topic}" in log, log[-3000:]
    assert "exceeds" in log.split(f"Cleaner failed on {topic}", 1)[1][:3000]
    _assert_bounded(bomb_broker, "cleaning a log holding a zstd bomb")


@pytest.mark.parametrize("timestamp", [-3, 0], ids=["max-timestamp", "by-timestamp"])
def test_list_offsets_over_a_bomb(bomb_broker: BrokerProcess, timestamp: int) -> None:
    """ListOffsets by timestamp reads records of the matching batch: a bomb there must stay bounded."""
    topic = f"bomb-list-offsets{timestamp}"
    _create(bomb_broker.bootstrap, topic, {})
    L = ListOffsetsRequest
    with Raw(bomb_broker.bootstrap, timeout=60) as raw:
        assert raw.produce(topic, 0, bomb(4)).error_code == 0
        req = L(replica_id=-1, isolation_level=0, topics=[L.ListOffsetsTopic(name=topic, partitions=[
            L.ListOffsetsPartition(partition_index=0, timestamp=timestamp)])])
        resp = raw.request(2, 8, req)
    part = resp.topics[0].partitions[0]
    assert part.error_code != ErrorCode.UNKNOWN_SERVER_ERROR, part
    _assert_bounded(bomb_broker, f"ListOffsets timestamp={timestamp} over a zstd bomb")

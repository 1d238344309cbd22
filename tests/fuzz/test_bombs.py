"""Decompression bombs against a real broker: small batches (KBs) whose payload inflates to 200 MB.

Every path that decompresses must stop at a bound derived from max.message.bytes: the produce path (which
walks the records of every batch, compressed or not, of every topic), and over a bomb an older version
stored, the log cleaner and timestamp lookups (tests/storage/test_legacy_segments.py). The broker's peak
RSS (VmHWM) must stay below 500 MB."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kbroker.protocol.errors import ErrorCode

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


@pytest.mark.parametrize("compression", [1, 3, 4], ids=["gzip", "lz4", "zstd"])
def test_bomb_produced_to_delete_topic_is_refused(bomb_broker: BrokerProcess, compression: int) -> None:
    """Produce inflates every compressed batch to walk its records (Kafka's LogValidator), bounded like the
    compacted path: a bomb no longer reaches any log. The cleaner and ListOffsets bounds over a bomb an older
    version stored are tested on such a segment in tests/storage/test_legacy_segments.py."""
    topic = f"bomb-delete-{compression}"
    _create(bomb_broker.bootstrap, topic, {})
    with Raw(bomb_broker.bootstrap, timeout=60) as raw:
        resp = raw.produce(topic, 0, bomb(compression))
        assert resp.error_code == ErrorCode.CORRUPT_MESSAGE, (resp.error_code, resp.error_message)
        assert "exceeds" in (resp.error_message or "")
    _assert_bounded(bomb_broker, f"a codec {compression} bomb produced to a delete topic")

"""A broker per fuzz module with the topics the fuzzers aim at (plain, compacted with tiny segments, health)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker_process import BrokerProcess
from tests.fuzz.common import COMPACT_TOPIC, HEALTH_TOPIC, PLAIN_TOPIC


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("fuzz-broker"), {
        "log.cleaner.backoff.ms": "200",
        "log.segment.delete.delay.ms": "100",
        "log.retention.check.interval.ms": "1000",
    })
    b.start()
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    futures = admin.create_topics([
        NewTopic(PLAIN_TOPIC, 3, 1),
        NewTopic(COMPACT_TOPIC, 2, 1, config={
            "cleanup.policy": "compact", "segment.bytes": "2000", "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "100"}),
        NewTopic(HEALTH_TOPIC, 1, 1),
    ])
    for f in futures.values():
        f.result(30)
    yield b
    if b.alive():
        b.stop()

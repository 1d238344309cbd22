"""Share sessions as Kafka's ShareSessionCache keeps them: a member that opens its session again (epoch 0) keeps the
records it holds and can still acknowledge them; the connection that opened a session closing releases them at
once (Kafka 4.1+), long before their acquisition locks would expire. Raw ShareFetch requests over the wire."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
)
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    AlterReplicaLogDirsRequest,
    MetadataRequest,
    ShareFetchRequest,
    ShareGroupHeartbeatRequest,
)

from kbroker_tools.wire import WireClient
from tests.broker.share.group_configs import EARLIEST_LONG_LOCKS, set_group_configs
from tests.broker.test_log_dirs import _broker as log_dirs_broker
from tests.broker.test_log_dirs import _dir_of as dir_of
from tests.broker.test_log_dirs import _placement as placement
from tests.broker_process import BrokerProcess
from tests.clients import wait_until

F = ShareFetchRequest
ACCEPT = 1


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        tmp_path_factory.mktemp("broker"),
        {"offsets.topic.num.partitions": "1", "share.coordinator.state.topic.num.partitions": "1"},
    )
    b.start()
    yield b
    b.stop()


def setup(broker: BrokerProcess, topic: str, group: str, n: int) -> bytes:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    set_group_configs(admin, group, EARLIEST_LONG_LOCKS)
    produce(broker, topic, 0, n)
    with WireClient(broker.bootstrap) as w:
        md = w.request(3, 12, MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)]))
    return bytes(md.topics[0].topic_id)


def produce(broker: BrokerProcess, topic: str, first: int, n: int) -> None:
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(first, first + n):
        p.produce(topic, f"v{i}".encode(), partition=0)
    p.flush(30)


def join(w: WireClient, group: str, topic: str) -> str:
    member = str(uuid.uuid4())
    r = w.request(
        76,
        1,
        ShareGroupHeartbeatRequest(
            group_id=group, member_id=member, member_epoch=0, subscribed_topic_names=[topic]
        ),
    )
    assert r.error_code == 0, r
    return member


def share_fetch(
    w: WireClient,
    group: str,
    member: str,
    epoch: int,
    topic_id: bytes,
    acks: list[tuple[int, int, int]] = (),  # type: ignore[assignment]
    wait_ms: int = 0,
) -> Any:
    batches = [
        F.AcknowledgementBatch(first_offset=f, last_offset=la, acknowledge_types=[t]) for f, la, t in acks
    ]
    r = w.request(
        78,
        1,
        F(
            group_id=group,
            member_id=member,
            share_session_epoch=epoch,
            max_wait_ms=wait_ms,
            min_bytes=1,
            max_bytes=1 << 20,
            max_records=500,
            batch_size=500,
            topics=[
                F.FetchTopic(
                    topic_id=topic_id,
                    partitions=[F.FetchPartition(partition_index=0, acknowledgement_batches=batches)],
                )
            ],
        ),
    )
    assert r.error_code == 0, r
    return r


def move(bootstrap: str, topic: str, partition: int, to: Path) -> None:
    A = AlterReplicaLogDirsRequest
    with WireClient(bootstrap) as w:
        r = w.request(
            34,
            2,
            A(
                dirs=[
                    A.AlterReplicaLogDir(
                        path=str(to), topics=[A.AlterReplicaLogDirTopic(name=topic, partitions=[partition])]
                    )
                ]
            ),
        )
    assert r.results[0].partitions[0].error_code == 0, r


def acquired(r: Any) -> list[tuple[int, int, int]]:
    return [
        (a.first_offset, a.last_offset, a.delivery_count)
        for t in r.responses
        for p in t.partitions
        for a in p.acquired_records
    ]


def ack_errors(r: Any) -> list[int]:
    return [p.acknowledge_error_code for t in r.responses for p in t.partitions]


def test_a_new_session_keeps_what_the_member_holds(broker: BrokerProcess, topic_name: str) -> None:
    group = "g-" + topic_name
    topic_id = setup(broker, topic_name, group, 10)
    with WireClient(broker.bootstrap) as wa, WireClient(broker.bootstrap) as wb:
        a, b = join(wa, group, topic_name), join(wb, group, topic_name)
        assert acquired(share_fetch(wa, group, a, 0, topic_id, wait_ms=5000)) == [(0, 9, 1)]
        # a restarts its session (what Kafka's client does after a session error): nothing is released, so
        # nothing comes back to a itself with a second delivery count, nor to b
        assert acquired(share_fetch(wa, group, a, 0, topic_id)) == []
        assert acquired(share_fetch(wb, group, b, 0, topic_id, wait_ms=300)) == []
        # and a's acknowledgement of what it held before is still good
        r = share_fetch(wa, group, a, 1, topic_id, acks=[(0, 9, ACCEPT)])
        assert ack_errors(r) == [0]
        produce(broker, topic_name, 10, 1)
        assert acquired(share_fetch(wb, group, b, 1, topic_id, wait_ms=5000)) == [(10, 10, 1)]


def test_closing_the_connection_releases_at_once(broker: BrokerProcess, topic_name: str) -> None:
    group = "g-" + topic_name
    topic_id = setup(broker, topic_name, group, 5)
    with WireClient(broker.bootstrap) as wb:
        b = join(wb, group, topic_name)
        wa = WireClient(broker.bootstrap)
        a = join(wa, group, topic_name)
        assert acquired(share_fetch(wa, group, a, 0, topic_id, wait_ms=5000)) == [(0, 4, 1)]
        wa.close()
        started = time.monotonic()
        got: list[tuple[int, int, int]] = []
        epoch = 0
        while not got and time.monotonic() < started + 20:
            got = acquired(share_fetch(wb, group, b, epoch, topic_id, wait_ms=500))
            epoch += 1
        # the locks last 60 s: only the closed connection brought these back
        assert got == [(0, 4, 2)]
        assert time.monotonic() - started < 20


def test_an_acknowledgement_whose_state_cannot_be_written_is_not_confirmed(tmp_path: Path) -> None:
    b, dirs = log_dirs_broker(
        tmp_path,
        2,
        **{
            "offsets.topic.num.partitions": "1",
            "share.coordinator.state.topic.num.partitions": "1",
            "log.flush.offset.checkpoint.interval.ms": "200",
        },
    )
    try:
        topic, group = "acks", "g-acks"
        topic_id = setup(b, topic, group, 3)
        # the failed write is retried for 15 s before the acknowledgement is answered
        with WireClient(b.bootstrap, timeout=40) as w:
            m = join(w, group, topic)
            assert acquired(share_fetch(w, group, m, 0, topic_id, wait_ms=5000)) == [(0, 2, 1)]
            state_dir = dir_of(b.bootstrap, "__share_group_state")
            if state_dir == dir_of(b.bootstrap, topic):
                other = next(d for d in dirs if d != state_dir)
                move(b.bootstrap, "__share_group_state", 0, other)
                wait_until(
                    lambda: dir_of(b.bootstrap, "__share_group_state") == other, timeout=30, what="the move"
                )
                state_dir = other
            # The state's log dir fails (replaced by a file): its snapshot write is refused (KAFKA_STORAGE_ERROR, which
            # the share coordinator answers as NOT_COORDINATOR, retried as Kafka's persister does)
            state_dir.rename(state_dir.with_name("moved-away"))
            state_dir.write_text("not a directory")
            # the broker finds out at its next checkpoint write in that dir (the open segment still takes writes)
            wait_until(
                lambda: ("error", ErrorCode.KAFKA_STORAGE_ERROR) in placement(b.bootstrap).values(),
                timeout=15,
                what="the failed dir in DescribeLogDirs",
            )
            r = share_fetch(w, group, m, 1, topic_id, acks=[(0, 2, ACCEPT)])
            # the client is not told the records are done: Kafka's SharePartition answers the persister's
            # NOT_COORDINATOR as COORDINATOR_NOT_AVAILABLE
            assert ack_errors(r) == [ErrorCode.COORDINATOR_NOT_AVAILABLE]
        assert "Could not write the state of share-partition" in b.read_log()
    finally:
        b.stop()

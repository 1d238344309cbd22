"""How a ShareFetch acquires, as Kafka 4.2's SharePartition: whole batches in batch_optimized mode (ShareFetch v1
and v2's default, max_records a soft limit), max_records exactly in record_limit mode (v2); no new records past
the in-flight window of group.share.partition.max.record.locks, and a waiting ShareFetch woken as soon as an
acknowledgement moves the start offset; and Kafka 4.x's balanced, sticky SimpleAssignor (five members on two
partitions: three on each). Raw requests over the wire against a real broker."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
)
from kbroker.protocol.messages import (
    MetadataRequest,
    ShareAcknowledgeRequest,
    ShareFetchRequest,
    ShareGroupDescribeRequest,
    ShareGroupHeartbeatRequest,
)

from kbroker_tools.wire import WireClient
from tests.broker.share.group_configs import EARLIEST_LONG_LOCKS, set_group_configs
from tests.broker_process import BrokerProcess

F = ShareFetchRequest
ACCEPT, BATCH, LOCKS = 1, 100, 200
BATCH_OPTIMIZED, RECORD_LIMIT = 0, 1


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        tmp_path_factory.mktemp("broker"),
        {
            "offsets.topic.num.partitions": "1",
            "share.coordinator.state.topic.num.partitions": "1",
            "group.share.partition.max.record.locks": str(LOCKS),
        },
    )
    b.start()
    yield b
    b.stop()


def setup(broker: BrokerProcess, topic: str, group: str, partitions: int = 1, batches: int = 3) -> bytes:
    """The topic with `batches` batches of BATCH records in partition 0 (one flush each); its topic id."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    set_group_configs(admin, group, EARLIEST_LONG_LOCKS)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 50})
    for b in range(batches):
        for i in range(BATCH):
            p.produce(topic, f"v{b * BATCH + i}".encode(), partition=0)
        p.flush(30)
    with WireClient(broker.bootstrap) as w:
        md = w.request(3, 12, MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)]))
    return bytes(md.topics[0].topic_id)


def join(w: WireClient, group: str, topic: str) -> tuple[str, Any]:
    member = str(uuid.uuid4())
    r = w.request(
        76,
        1,
        ShareGroupHeartbeatRequest(
            group_id=group, member_id=member, member_epoch=0, subscribed_topic_names=[topic]
        ),
    )
    assert r.error_code == 0, r
    return member, r.assignment


def fetch(
    w: WireClient,
    group: str,
    member: str,
    epoch: int,
    topic_id: bytes,
    max_records: int,
    mode: int = BATCH_OPTIMIZED,
    version: int = 1,
    wait_ms: int = 0,
    batch_size: int | None = None,
) -> list[tuple[int, int, int]]:
    """One ShareFetch of partition 0; the acquired (first, last, delivery count) ranges."""
    r = w.request(
        78,
        version,
        F(
            group_id=group,
            member_id=member,
            share_session_epoch=epoch,
            max_wait_ms=wait_ms,
            min_bytes=1,
            max_bytes=1 << 20,
            max_records=max_records,
            batch_size=max_records if batch_size is None else batch_size,
            share_acquire_mode=mode,
            topics=[
                F.FetchTopic(
                    topic_id=topic_id,
                    partitions=[F.FetchPartition(partition_index=0)],
                )
            ],
        ),
    )
    assert r.error_code == 0, r
    parts = [p for t in r.responses for p in t.partitions]
    assert all(p.error_code == 0 and p.acknowledge_error_code == 0 for p in parts), parts
    return [(a.first_offset, a.last_offset, a.delivery_count) for p in parts for a in p.acquired_records]


def accept(
    w: WireClient, group: str, member: str, epoch: int, topic_id: bytes, first: int, last: int
) -> None:
    """ShareAcknowledge (79) of first..last as accepted: acquires nothing, unlike a ShareFetch."""
    A = ShareAcknowledgeRequest
    r = w.request(
        79,
        1,
        A(
            group_id=group,
            member_id=member,
            share_session_epoch=epoch,
            topics=[
                A.AcknowledgeTopic(
                    topic_id=topic_id,
                    partitions=[
                        A.AcknowledgePartition(
                            partition_index=0,
                            acknowledgement_batches=[
                                A.AcknowledgementBatch(
                                    first_offset=first, last_offset=last, acknowledge_types=[ACCEPT]
                                )
                            ],
                        )
                    ],
                )
            ],
        ),
    )
    assert r.error_code == 0 and all(p.error_code == 0 for t in r.responses for p in t.partitions), r


def test_batch_optimized_and_record_limit(broker: BrokerProcess, topic_name: str) -> None:
    group = "acquire-" + topic_name
    topic_id = setup(broker, topic_name, group)
    with WireClient(broker.bootstrap) as w:
        a, _ = join(w, group, topic_name)
        b, _ = join(w, group, topic_name)
        c, _ = join(w, group, topic_name)
        # record_limit: exactly max_records, the rest of the second batch stays available
        assert fetch(w, group, a, 0, topic_id, 150, RECORD_LIMIT, version=2) == [(0, 149, 1)]
        # batch_optimized: the available rest of that batch (50 records, below max_records)...
        assert fetch(w, group, b, 0, topic_id, 60) == [(150, 199, 1)]
        # (the window of max.record.locks, 200 here, is full until the first batch is accepted)
        accept(w, group, a, 1, topic_id, 0, 99)
        # ...then whole batches: max_records 10 still takes a batch of 100 (a soft limit, as Kafka's)
        assert fetch(w, group, c, 0, topic_id, 10) == [(200, 299, 1)]


def test_batch_size_cuts_the_acquired_ranges_at_batch_boundaries(
    broker: BrokerProcess, topic_name: str
) -> None:
    """As Kafka's SharePartition.createBatches: one acquisition of two log batches of 100 (the in-flight window
    is 200 here) answers a new acquired range at the first batch starting BatchSize records or more past the
    range's first offset; never within a batch."""
    for size, want in (
        (200, [(0, 199, 1)]),
        (150, [(0, 199, 1)]),
        (100, [(0, 99, 1), (100, 199, 1)]),
    ):
        topic, group = f"{topic_name}-{size}", f"batch-size-{size}-{topic_name}"
        topic_id = setup(broker, topic, group)
        with WireClient(broker.bootstrap) as w:
            m, _ = join(w, group, topic)
            assert fetch(w, group, m, 0, topic_id, 200, batch_size=size, wait_ms=5000) == want, size


def test_the_in_flight_window_and_a_waiting_fetch(broker: BrokerProcess, topic_name: str) -> None:
    group = "window-" + topic_name
    topic_id = setup(broker, topic_name, group)
    with WireClient(broker.bootstrap) as w1, WireClient(broker.bootstrap) as w2:
        a, _ = join(w1, group, topic_name)
        b, _ = join(w1, group, topic_name)
        # max.record.locks 200 (Kafka counts the window from the start offset): two batches, not three
        assert fetch(w1, group, a, 0, topic_id, 500) == [(0, 199, 1)]
        assert fetch(w2, group, b, 0, topic_id, 500) == []  # the window is full
        got: list[list[tuple[int, int, int]]] = []
        waiting = threading.Thread(
            target=lambda: got.append(fetch(w2, group, b, 1, topic_id, 500, wait_ms=20_000))
        )
        started = time.monotonic()
        waiting.start()
        time.sleep(0.5)
        assert not got, "a fetch with nothing to acquire answered before its max wait"
        # accepting the first batch moves the start offset: room for the third batch, and the waiting fetch
        # is woken at once rather than at its max wait
        accept(w1, group, a, 1, topic_id, 0, 99)
        waiting.join(30)
        assert got == [[(200, 299, 1)]]
        assert time.monotonic() - started < 10, "the waiting fetch was not woken by the acknowledgement"


def describe(w: WireClient, group: str) -> dict[str, list[int]]:
    r = w.request(77, 1, ShareGroupDescribeRequest(group_ids=[group]))
    return {
        m.member_id: sorted(p for t in m.assignment.topic_partitions for p in t.partitions)
        for m in r.groups[0].members
    }


def test_five_members_on_two_partitions_share_each_three_ways(broker: BrokerProcess, topic_name: str) -> None:
    group = "assign-" + topic_name
    setup(broker, topic_name, group, partitions=2, batches=0)
    with WireClient(broker.bootstrap) as w:
        first_heard = {}
        for _ in range(5):
            member, assignment = join(w, group, topic_name)
            first_heard[member] = sorted(p for t in assignment.topic_partitions for p in t.partitions)
        target = describe(w, group)
    # balanced: every partition shared by ceil(5 / 2) = 3 members, one member holds both
    assert sorted(len(ps) for ps in target.values()) == [1, 1, 1, 1, 2], target
    for p in (0, 1):
        assert sum(p in ps for ps in target.values()) == 3, target
    # sticky: members still on the assignment they heard when they joined (a member hears a new one only at its
    # next heartbeat) already share each partition three ways, as the target does
    for p in (0, 1):
        assert sum(p in ps for ps in first_heard.values()) == 3, first_heard

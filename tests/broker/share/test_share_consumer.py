"""confluent-kafka's ShareConsumer (librdkafka 2.16, KIP-932) against a real kbroker: implicit acknowledgement
reads every record once; a record a consumer never acknowledges comes back after
`share.record.lock.duration.ms`; a record released every time is archived after `group.share.delivery.count.limit`
deliveries; ListGroups and ShareGroupDescribe see the group; `kbroker-admin share-groups --reset-offsets` and
`--delete-offsets` (AlterShareGroupOffsets, DeleteShareGroupOffsets) move where the group reads."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import AcknowledgeType, KafkaException, Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    DeleteGroupsRequest,
    DeleteShareGroupOffsetsRequest,
    ListGroupsRequest,
    ShareGroupDescribeRequest,
)

from kbroker_tools.wire import WireClient
from tests.broker_process import BrokerProcess


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        tmp_path_factory.mktemp("broker"),
        {
            "group.share.heartbeat.interval.ms": "500",
            "group.share.min.heartbeat.interval.ms": "100",
            "group.share.min.record.lock.duration.ms": "1000",
            "group.share.delivery.count.limit": "3",
            "offsets.topic.num.partitions": "2",
        },
    )
    b.start()
    yield b
    b.stop()


def setup_topic(
    bootstrap: str, topic: str, group: str, count: int, configs: dict[str, str], partitions: int = 2
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    res = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()
        ],
    )
    admin.incremental_alter_configs([res])[res].result(30)
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        p.produce(topic, f"v{i}".encode(), partition=i % partitions)
    p.flush(30)


def admin_cli(broker: BrokerProcess, *args: str) -> str:
    """kbroker-admin share-groups, as a user runs it."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "kbroker_tools.admin",
            "share-groups",
            "--bootstrap-server",
            broker.bootstrap,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def consumer(bootstrap: str, group: str, explicit: bool) -> ShareConsumer:
    return ShareConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "share.acknowledgement.mode": "explicit" if explicit else "implicit",
        }
    )


def test_implicit_acknowledgement_reads_each_record_once(broker: BrokerProcess, topic_name: str) -> None:
    group = "g-" + topic_name
    setup_topic(broker.bootstrap, topic_name, group, 200, {"share.auto.offset.reset": "earliest"})
    c = consumer(broker.bootstrap, group, explicit=False)
    c.subscribe([topic_name])
    got: list[str] = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < 200 and time.monotonic() < deadline:
            got += [m.value().decode() for m in c.poll(1.0) if m.error() is None]
        c.commit_sync()
        with WireClient(broker.bootstrap) as w:
            d = w.request(77, 1, ShareGroupDescribeRequest(group_ids=[group])).groups[0]
            assert (d.error_code, d.group_state, len(d.members)) == (0, "Stable", 1)
            assert sorted(p for t in d.members[0].assignment.topic_partitions for p in t.partitions) == [0, 1]
        with WireClient(broker.bootstrap) as w:
            listed = w.request(16, 5, ListGroupsRequest(types_filter=["share"])).groups
            assert [(g.group_id, g.group_type, g.group_state) for g in listed] == [(group, "share", "Stable")]
            busy = w.request(42, 2, DeleteGroupsRequest(groups_names=[group])).results[0]
            assert busy.error_code == ErrorCode.NON_EMPTY_GROUP
        assert admin_cli(broker, "--list").splitlines() == [group]
        members = admin_cli(broker, "--describe", "--group", group, "--members").splitlines()
        assert members[0].split() == [
            "GROUP",
            "CONSUMER-ID",
            "HOST",
            "CLIENT-ID",
            "#PARTITIONS",
            "ASSIGNMENT",
        ]
        assert members[1].split()[0] == group and members[1].split()[4] == "2"
        state = admin_cli(broker, "--describe", "--group", group, "--state").splitlines()
        assert state[1].split() == [group, "Stable", "1"]
    finally:
        c.close()
    assert sorted(got) == sorted(f"v{i}" for i in range(200))
    with WireClient(broker.bootstrap) as w:
        assert w.request(42, 2, DeleteGroupsRequest(groups_names=[group])).results[0].error_code == 0
        assert w.request(16, 5, ListGroupsRequest(types_filter=["share"])).groups == []


def test_unacknowledged_record_comes_back_after_the_lock(broker: BrokerProcess, topic_name: str) -> None:
    group = "g-" + topic_name
    setup_topic(
        broker.bootstrap,
        topic_name,
        group,
        10,
        {"share.auto.offset.reset": "earliest", "share.record.lock.duration.ms": "1500"},
        partitions=1,
    )
    first = consumer(broker.bootstrap, group, explicit=True)
    first.subscribe([topic_name])
    held: list[str] = []
    deadline = time.monotonic() + 60
    while not held and time.monotonic() < deadline:
        held += [m.value().decode() for m in first.poll(1.0) if m.error() is None]
    assert held
    # `first` stays in the group and never acknowledges: its locks expire and a second member of the one
    # partition (both members share it) gets the records.
    second = consumer(broker.bootstrap, group, explicit=True)
    second.subscribe([topic_name])
    again: dict[str, int] = {}
    started = time.monotonic()
    try:
        while len(again) < 10 and time.monotonic() < started + 60:
            for m in second.poll(0.5):
                if m.error() is None:
                    again[m.value().decode()] = m.delivery_count()
                    second.acknowledge(m, AcknowledgeType.ACCEPT)
            second.commit_sync()
    finally:
        second.close()
        first.close()
    assert sorted(again) == sorted(f"v{i}" for i in range(10))
    assert all(again[v] >= 2 for v in held), again
    assert time.monotonic() - started >= 1.0, "redelivered before the lock expired"


def test_delivery_count_limit_archives_a_poison_record(broker: BrokerProcess, topic_name: str) -> None:
    group = "g-" + topic_name
    setup_topic(broker.bootstrap, topic_name, group, 4, {"share.auto.offset.reset": "earliest"})
    c = consumer(broker.bootstrap, group, explicit=True)
    c.subscribe([topic_name])
    deliveries: dict[str, int] = {}
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            msgs = [m for m in c.poll(0.5) if m.error() is None]
            for m in msgs:
                v = m.value().decode()
                deliveries[v] = deliveries.get(v, 0) + 1
                c.acknowledge(m, AcknowledgeType.RELEASE if v == "v0" else AcknowledgeType.ACCEPT)
            c.commit_sync()
            if deliveries.get("v0") == 3 and not msgs and len(deliveries) == 4:
                break
    finally:
        c.close()
    # group.share.delivery.count.limit=3: released three times, then archived, never a fourth delivery
    assert deliveries == {"v0": 3, "v1": 1, "v2": 1, "v3": 1}


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("share.auto.offset.reset", "newest", "the value must be either 'earliest', 'latest'"),
        ("share.isolation.level", "dirty", "String must be one of: read_committed, read_uncommitted"),
        (
            "share.record.lock.duration.ms",
            "999999",
            "must be less than or equal to group.share.max.record.lock",
        ),
    ],
)
def test_share_group_configs_are_validated(
    broker: BrokerProcess, name: str, value: str, message: str
) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    res = ConfigResource(
        ResourceType.GROUP,
        "g-validated",
        incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)],
    )
    with pytest.raises(KafkaException) as info:
        admin.incremental_alter_configs([res])[res].result(30)
    assert info.value.args[0].name() == "INVALID_CONFIG" and message in info.value.args[0].str()
    ok = ConfigResource(
        ResourceType.GROUP,
        "g-validated",
        incremental_configs=[
            ConfigEntry(
                name,
                "by_duration:PT1H"
                if name == "share.auto.offset.reset"
                else "read_committed"
                if name == "share.isolation.level"
                else "20000",
                incremental_operation=AlterConfigOpType.SET,
            )
        ],
    )
    admin.incremental_alter_configs([ok])[ok].result(30)


def read_all(bootstrap: str, group: str, topic: str, want: int, timeout: float = 30) -> list[str]:
    c = consumer(bootstrap, group, explicit=False)
    c.subscribe([topic])
    got: list[str] = []
    deadline = time.monotonic() + timeout
    idle_until = None
    try:
        while time.monotonic() < deadline:
            msgs = [m.value().decode() for m in c.poll(0.5) if m.error() is None]
            got += msgs
            if len(got) >= want:
                # a little longer: anything more than wanted would show
                idle_until = idle_until or time.monotonic() + 1.5
                if time.monotonic() >= idle_until:
                    break
    finally:
        c.close()
    return got


def admin_cli_when_empty(broker: BrokerProcess, *args: str) -> str:
    """The group empties once the closed consumer's leave is seen: retry NON_EMPTY_GROUP for a while."""
    deadline = time.monotonic() + 20
    while True:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "kbroker_tools.admin",
                "share-groups",
                "--bootstrap-server",
                broker.bootstrap,
            ]
            + list(args),
            capture_output=True,
            text=True,
            timeout=60,
        )
        if r.returncode == 0 or "NON_EMPTY_GROUP" not in r.stderr + r.stdout or time.monotonic() > deadline:
            return f"rc={r.returncode}\n{r.stdout}{r.stderr}"
        time.sleep(0.5)


def test_reset_and_delete_offsets_from_the_command_line(broker: BrokerProcess, topic_name: str) -> None:
    group = "g-" + topic_name
    setup_topic(
        broker.bootstrap, topic_name, group, 10, {"share.auto.offset.reset": "earliest"}, partitions=1
    )
    assert sorted(read_all(broker.bootstrap, group, topic_name, 10)) == sorted(f"v{i}" for i in range(10))
    dry = admin_cli(broker, "--reset-offsets", "--group", group, "--topic", topic_name, "--to-earliest")
    assert dry.splitlines()[1].split() == [group, topic_name, "0", "0"]
    out = admin_cli_when_empty(
        broker, "--reset-offsets", "--group", group, "--topic", topic_name, "--to-offset", "6", "--execute"
    )
    assert out.splitlines()[0] == "rc=0" and out.splitlines()[2].split() == [group, topic_name, "0", "6"], out
    assert sorted(read_all(broker.bootstrap, group, topic_name, 4)) == [f"v{i}" for i in range(6, 10)]
    # DeleteShareGroupOffsets forgets the state: share.auto.offset.reset (earliest) applies again
    out = admin_cli_when_empty(broker, "--delete-offsets", "--group", group, "--topic", topic_name)
    assert out.splitlines()[0] == "rc=0" and out.splitlines()[2].split() == [topic_name, "Successful"], out
    assert sorted(read_all(broker.bootstrap, group, topic_name, 10)) == sorted(f"v{i}" for i in range(10))
    out = admin_cli_when_empty(broker, "--delete-offsets", "--group", group, "--topic", "no-such-topic")
    assert out.splitlines()[0] == "rc=1" and "UNKNOWN_TOPIC_OR_PARTITION" in out, out
    with WireClient(broker.bootstrap) as w:
        D = DeleteShareGroupOffsetsRequest
        r = w.request(
            92, 0, D(group_id="no-such-group", topics=[D.DeleteShareGroupOffsetsRequestTopic(topic_name)])
        )
        assert r.error_code == ErrorCode.GROUP_ID_NOT_FOUND


def test_read_committed_skips_aborted_transactions(broker: BrokerProcess, topic_name: str) -> None:
    group = "g-" + topic_name
    setup_topic(
        broker.bootstrap,
        topic_name,
        group,
        0,
        {"share.auto.offset.reset": "earliest", "share.isolation.level": "read_committed"},
        partitions=1,
    )
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "tx-" + topic_name})
    p.init_transactions(30)
    for batch, commit in (("c0", True), ("a0", False), ("c1", True), ("a1", False)):
        p.begin_transaction()
        for i in range(5):
            p.produce(topic_name, f"{batch}-{i}".encode(), partition=0)
        p.flush(30)
        p.commit_transaction(30) if commit else p.abort_transaction(30)
    # an open transaction: not delivered either (past the last stable offset)
    p.begin_transaction()
    p.produce(topic_name, b"open-0", partition=0)
    p.flush(30)
    got = read_all(broker.bootstrap, group, topic_name, 10)
    p.abort_transaction(30)
    assert sorted(got) == sorted(f"c{b}-{i}" for b in range(2) for i in range(5)), got

"""kbroker-admin consumer-groups --reset-offsets --from-file against a real kbroker: the plan kafka-consumer-groups
prints, the commit seen by confluent-kafka and kafka-python, and one-line errors for a bad file."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

from tests.broker_process import BrokerProcess
from tests.tools.test_admin_cli import admin, table
from tests.tools.test_admin_errors import assert_one_line_error, run_admin


def _first_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The offset of the first record a confluent-kafka member of `group` is given, per partition."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    first: dict[int, int] = {}
    deadline = time.monotonic() + 60
    try:
        while len(first) < partitions and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                first.setdefault(m.partition(), m.offset())
    finally:
        c.close()
    return first


def test_reset_offsets_from_file_plans_commits_and_refuses_bad_lines(
    broker: BrokerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    b = broker.bootstrap
    admin_client = AdminClient({"bootstrap.servers": b})
    admin_client.create_topics([NewTopic("planned", 2, 1)])["planned"].result(30)
    p = Producer({"bootstrap.servers": b})
    for i in range(20):
        p.produce("planned", f"v{i}".encode(), partition=i % 2)
    assert p.flush(30) == 0

    plan = tmp_path / "plan.csv"
    plan.write_text("planned,0,3\nplanned,1,7\n")
    base = ["consumer-groups", "--bootstrap-server", b, "--reset-offsets", "--group", "from-file"]
    dry = admin(*base, "--from-file", str(plan), "--dry-run")
    assert dry.stdout.splitlines()[:2] == [
        "",
        f"{'GROUP':<30} {'TOPIC':<30} {'PARTITION':<10} {'NEW-OFFSET':<15}",
    ]
    assert table(dry.stdout) == [
        ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"],
        ["from-file", "planned", "0", "3"],
        ["from-file", "planned", "1", "7"],
    ]
    kc = KafkaConsumer(bootstrap_servers=b, group_id="from-file", enable_auto_commit=False)
    try:
        assert kc.committed(KafkaTopicPartition("planned", 0)) is None  # a dry run commits nothing

        done = admin(*base, "--from-file", str(plan), "--execute")
        assert table(done.stdout) == table(dry.stdout)
        assert [kc.committed(KafkaTopicPartition("planned", i)) for i in (0, 1)] == [3, 7]
    finally:
        kc.close()
    assert _first_offsets(b, "from-file", "planned", 2) == {0: 3, 1: 7}

    # Past the log end: clamped with Kafka's warning; the --export of one run is the --from-file of the next.
    plan.write_text("planned,0,99\n")
    clamped = admin(*base, "--from-file", str(plan), "--export", "--execute")
    assert clamped.stdout == "planned,0,10\n"
    assert clamped.stderr == (
        "WARN: New offset (99) is higher than latest offset for topic partition planned-0. "
        "Value will be set to 10\n"
    )
    plan.write_text(clamped.stdout)
    assert table(admin(*base, "--from-file", str(plan), "--dry-run").stdout)[1:] == [
        ["from-file", "planned", "0", "10"]
    ]

    # Several groups in one file (group,topic,partition,offset, as --export writes for several groups).
    plan.write_text("g-a,planned,0,1\ng-b,planned,1,2\n")
    both = admin(
        "consumer-groups",
        "--bootstrap-server",
        b,
        "--reset-offsets",
        "--group",
        "g-a",
        "--group",
        "g-b",
        "--from-file",
        str(plan),
        "--execute",
    )
    assert table(both.stdout)[1:] == [
        ["g-a", "planned", "0", "1"],
        ["g-b", "planned", "1", "2"],
    ]
    assert _first_offsets(b, "g-b", "planned", 2)[1] == 2

    # Bad plans: one line of error, exit 1, nothing committed (run in this process: the same main() the command runs).
    two_groups = [
        "consumer-groups",
        "--bootstrap-server",
        b,
        "--reset-offsets",
        "--group",
        "g-a",
        "--group",
        "g-c",
    ]
    for argv, text, message in (
        (base, "planned,0,3\nplanned,zero,3\n", "line 2: 'planned,zero,3' is not topic,partition,offset"),
        (base, "planned,0\n", "line 1: 'planned,0' is not"),
        (base, "planned,5,1\n", "Topic 'planned' has no partition 5"),
        (base, "nowhere,0,1\n", "Topic 'nowhere' does not exist"),
        (two_groups, "g-a,planned,0,5\n", "No reset plan for group g-c found"),
        (base, None, "absent.csv: No such file or directory"),
    ):
        if text is not None:
            plan.write_text(text)
        argv = [*argv, "--from-file", str(plan if text is not None else tmp_path / "absent.csv"), "--execute"]
        rc, _, err = run_admin(argv, capsys, monkeypatch)
        assert_one_line_error(rc, err, argv)
        assert message in err, err
    assert _first_offsets(b, "g-a", "planned", 2)[0] == 1  # g-a's line was not applied for want of g-c's
    kc = KafkaConsumer(bootstrap_servers=b, group_id="from-file", enable_auto_commit=False)
    try:
        assert kc.committed(KafkaTopicPartition("planned", 0)) == 10  # no bad file changed anything
    finally:
        kc.close()

"""kbroker-admin consumer-groups --reset-offsets --from-file against a real kbroker: the plan kafka-consumer-groups
prints, the commit seen by confluent-kafka and kafka-python, and one-line errors for a bad file."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

from tests.tools.test_admin_cli import admin, table


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


def test_reset_offsets_from_file_plans_commits_and_refuses_bad_lines(broker, tmp_path: Path) -> None:
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

    for text, message in (
        ("planned,0,3\nplanned,zero,3\n", "line 2: 'planned,zero,3' is not topic,partition,offset"),
        ("planned,0\n", "line 1: 'planned,0' is not"),
        ("planned,5,1\n", "Topic 'planned' has no partition 5"),
        ("nowhere,0,1\n", "Topic 'nowhere' does not exist"),
    ):
        plan.write_text(text)
        bad = admin(*base, "--from-file", str(plan), "--execute", rc=1)
        assert message in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    plan.write_text("g-a,planned,0,5\n")
    missing = admin(
        "consumer-groups",
        "--bootstrap-server",
        b,
        "--reset-offsets",
        "--group",
        "g-a",
        "--group",
        "g-c",
        "--from-file",
        str(plan),
        "--execute",
        rc=1,
    )
    assert "No reset plan for group g-c found" in missing.stderr
    assert _first_offsets(b, "g-a", "planned", 2)[0] == 1  # g-a's line was not applied either
    gone = admin(*base, "--from-file", str(tmp_path / "absent.csv"), "--execute", rc=1)
    assert "absent.csv" in gone.stderr and len(gone.stderr.strip().splitlines()) == 1
    kc = KafkaConsumer(bootstrap_servers=b, group_id="from-file", enable_auto_commit=False)
    try:
        assert kc.committed(KafkaTopicPartition("planned", 0)) == 10  # no bad file changed anything
    finally:
        kc.close()

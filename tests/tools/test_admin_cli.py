"""kbroker-admin against a real kbroker and against librdkafka's mock cluster (a C implementation of the
protocol, /work/shared/bench-peers): the tool is a wire-protocol client, not a reader of kbroker's internals."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker_process import ROOT

MOCK_SCRIPT = Path("/work/shared/bench-peers/librdkafka_mock_broker.py")


def admin(*args: str, stdin: str | None = None, rc: int = 0) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([sys.executable, "-m", "kbroker_tools.admin", *args], input=stdin, cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == rc, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr
    return r


def table(stdout: str) -> list[list[str]]:
    """Rows of a kafka-consumer-groups table (header first), split on runs of spaces."""
    lines = [line for line in stdout.splitlines() if line.strip() and not line.startswith(("Consumer group", "WARN"))]
    return [line.split() for line in lines]


def test_usage_lists_the_commands():
    r = admin("--help")
    for name in ("topics", "consumer-groups", "configs", "console-producer", "console-consumer", "get-offsets"):
        assert f"  {name} " in r.stdout
    assert admin("no-such-command", rc=2).stderr.startswith("kbroker-admin: unknown command")


def test_topics_against_kbroker(broker):
    b = broker.bootstrap
    assert admin("topics", "--bootstrap-server", b, "--create", "--topic", "orders", "--partitions", "2",
                 "--config", "retention.ms=3600000").stdout == "Created topic orders.\n"
    err = admin("topics", "--bootstrap-server", b, "--create", "--topic", "orders", "--partitions", "2", rc=1)
    assert err.stderr.startswith("Error: creating topic orders: TOPIC_ALREADY_EXISTS")
    admin("topics", "--bootstrap-server", b, "--create", "--topic", "orders", "--if-not-exists")
    assert "orders" in admin("topics", "--bootstrap-server", b, "--list").stdout.split("\n")
    admin("topics", "--bootstrap-server", b, "--alter", "--topic", "orders", "--partitions", "3")
    lines = admin("topics", "--bootstrap-server", b, "--describe", "--topic", "orders").stdout.splitlines()
    head = dict(f.split(": ", 1) for f in lines[0].split("\t"))
    assert head["Topic"] == "orders" and head["PartitionCount"] == "3" and head["ReplicationFactor"] == "1"
    assert head["Configs"] == "retention.ms=3600000" and len(head["TopicId"]) == 22
    assert lines[1:] == [f"\tTopic: orders\tPartition: {p}\tLeader: 0\tReplicas: 0\tIsr: 0\tElr: N/A\tLastKnownElr: N/A"
                         for p in range(3)]
    admin("topics", "--bootstrap-server", b, "--delete", "--topic", "orders")
    assert "orders" not in admin("topics", "--bootstrap-server", b, "--list").stdout.split("\n")
    missing = admin("topics", "--bootstrap-server", b, "--describe", "--topic", "orders", rc=1)
    assert missing.stderr == "Error: Topic 'orders' does not exist as expected\n"
    admin("topics", "--bootstrap-server", b, "--delete", "--topic", "orders", "--if-exists")


def test_console_tools_groups_and_offsets_against_kbroker(broker):
    b = broker.bootstrap
    admin("topics", "--bootstrap-server", b, "--create", "--topic", "clicks", "--partitions", "1")
    lines = "".join(f"user{i}|click{i}\n" for i in range(6))
    admin("console-producer", "--bootstrap-server", b, "--topic", "clicks", "--property", "parse.key=true",
          "--property", "key.separator=|", stdin=lines)
    out = admin("console-consumer", "--bootstrap-server", b, "--topic", "clicks", "--group", "readers",
                "--from-beginning", "--max-messages", "4", "--timeout-ms", "20000", "--property", "print.key=true",
                "--property", "print.offset=true", "--property", "key.separator=,")
    assert out.stdout.splitlines() == [f"Offset:{i},user{i},click{i}" for i in range(4)]
    assert out.stderr.strip().endswith("Processed a total of 4 messages")
    assert admin("get-offsets", "--bootstrap-server", b, "--topic", "clicks").stdout == "clicks:0:6\n"
    assert admin("get-offsets", "--bootstrap-server", b, "--topic", "clicks", "--time", "-2").stdout == "clicks:0:0\n"

    assert "readers" in admin("consumer-groups", "--bootstrap-server", b, "--list").stdout.split("\n")
    desc = admin("consumer-groups", "--bootstrap-server", b, "--describe", "--group", "readers")
    assert "Consumer group 'readers' has no active members." in desc.stdout
    rows = table(desc.stdout)
    assert rows[0] == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
                       "HOST", "CLIENT-ID"]
    assert rows[1] == ["readers", "clicks", "0", "4", "6", "2", "-", "-", "-"]
    state = table(admin("consumer-groups", "--bootstrap-server", b, "--describe", "--group", "readers",
                        "--state").stdout)
    assert state[0][0] == "GROUP" and state[1][0] == "readers" and state[1][-2:] == ["Empty", "0"]

    dry = admin("consumer-groups", "--bootstrap-server", b, "--reset-offsets", "--group", "readers", "--topic",
                "clicks", "--shift-by", "-3")
    assert dry.stderr.startswith("WARN: No action will be performed as the --execute option is missing.")
    assert table(dry.stdout)[1:] == [["readers", "clicks", "0", "1"]]
    assert table(admin("consumer-groups", "--bootstrap-server", b, "--describe", "--group",
                       "readers").stdout)[1][3] == "4"  # a dry run changes nothing
    for flags, new in ((["--to-earliest"], "0"), (["--to-latest"], "6"), (["--shift-by", "-10"], "0"),
                       (["--to-offset", "5"], "5"), (["--to-datetime", "2000-01-01T00:00:00.000Z"], "0")):
        r = admin("consumer-groups", "--bootstrap-server", b, "--reset-offsets", "--group", "readers",
                  "--all-topics", *flags, "--execute")
        assert table(r.stdout)[1:] == [["readers", "clicks", "0", new]], flags
        lag = table(admin("consumer-groups", "--bootstrap-server", b, "--describe", "--group", "readers").stdout)
        assert lag[1][3:6] == [new, "6", str(6 - int(new))], flags
    rest = admin("console-consumer", "--bootstrap-server", b, "--topic", "clicks", "--group", "readers",
                 "--max-messages", "1", "--timeout-ms", "20000")
    assert rest.stdout == "click0\n"  # the group resumes where --to-datetime put it

    # An active member blocks a reset, as in Kafka.
    member = subprocess.Popen(
        [sys.executable, "-m", "kbroker_tools.admin", "console-consumer", "--bootstrap-server", b, "--topic",
         "clicks", "--group", "busy", "--timeout-ms", "60000"], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        from tests.clients import wait_until

        def stable() -> bool:
            # Until the member has joined, the group does not exist and describe says so (exit status 1).
            r = subprocess.run([sys.executable, "-m", "kbroker_tools.admin", "consumer-groups", "--bootstrap-server",
                                b, "--describe", "--group", "busy", "--state"], cwd=ROOT, capture_output=True,
                               text=True, timeout=120)
            assert "Traceback" not in r.stderr, r.stderr
            return r.returncode == 0 and table(r.stdout)[1][-2:] == ["Stable", "1"]

        wait_until(stable, timeout=60, interval=0.5, what="a Stable group with one member")
        refused = admin("consumer-groups", "--bootstrap-server", b, "--reset-offsets", "--group", "busy",
                        "--all-topics", "--to-earliest", "--execute", rc=1)
        assert "can only be reset if the group 'busy' is inactive, but the current state is Stable" in refused.stderr
        members = table(admin("consumer-groups", "--bootstrap-server", b, "--describe", "--group", "busy",
                              "--members").stdout)
        assert members[0] == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
        assert members[1][0] == "busy" and members[1][-1] == "1"
    finally:
        member.terminate()
        member.wait(30)

    deleted = admin("consumer-groups", "--bootstrap-server", b, "--delete", "--group", "readers")
    assert deleted.stdout == "Deletion of requested consumer groups ('readers') was successful.\n"
    assert "readers" not in admin("consumer-groups", "--bootstrap-server", b, "--list").stdout.split("\n")


def test_console_formats_and_headers(broker):
    b = broker.bootstrap
    admin("topics", "--bootstrap-server", b, "--create", "--topic", "fmt")
    admin("console-producer", "--bootstrap-server", b, "--topic", "fmt", "--property", "parse.key=true",
          "--property", "parse.headers=true", "--property", "null.marker=NULL",
          stdin="h1:a,h2:b\tk1\tv1\n\tk2\tNULL\n")
    out = admin("console-consumer", "--bootstrap-server", b, "--topic", "fmt", "--partition", "0", "--offset",
                "earliest", "--max-messages", "2", "--timeout-ms", "20000", "--property", "print.key=true",
                "--property", "print.headers=true", "--property", "print.timestamp=true",
                "--property", "print.partition=true")
    first, second = out.stdout.splitlines()
    ts, part, headers, key, value = first.split("\t")
    assert ts.startswith("CreateTime:") and int(ts.split(":")[1]) > 0
    assert (part, headers, key, value) == ("Partition:0", "h1:a,h2:b", "k1", "v1")
    assert second.split("\t")[1:] == ["Partition:0", "NO_HEADERS", "k2", "null"]
    # 100 good lines, then a malformed one: the 100 are delivered and the bad line is named (Kafka's console
    # producer stops reading there too).
    admin("topics", "--bootstrap-server", b, "--create", "--topic", "partly", "--partitions", "1")
    lines = "".join(f"k{i}\tv{i}\n" for i in range(100)) + "no-separator-here\nk\tafter\n"
    bad = admin("console-producer", "--bootstrap-server", b, "--topic", "partly", "--property", "parse.key=true",
                stdin=lines, rc=1)
    assert bad.stderr == ("Error: No key separator found on line number 101: 'no-separator-here' "
                          "(the 100 records before it were sent)\n")
    assert admin("get-offsets", "--bootstrap-server", b, "--topic", "partly").stdout == "partly:0:100\n"


def test_configs_against_kbroker(broker):
    b = broker.bootstrap
    admin("topics", "--bootstrap-server", b, "--create", "--topic", "cfg")
    r = admin("configs", "--bootstrap-server", b, "--alter", "--entity-type", "topics", "--entity-name", "cfg",
              "--add-config", "retention.ms=60000,cleanup.policy=[compact,delete]")
    assert r.stdout == "Completed updating config for topic cfg.\n"
    d = admin("configs", "--bootstrap-server", b, "--describe", "--entity-type", "topics", "--entity-name", "cfg")
    lines = d.stdout.splitlines()
    assert lines[0] == "Dynamic configs for topic cfg are:"
    assert lines[1].startswith("  cleanup.policy=compact,delete sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:"
                               "cleanup.policy=compact,delete")
    assert lines[2].startswith("  retention.ms=60000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=60000")
    admin("configs", "--bootstrap-server", b, "--alter", "--entity-type", "topics", "--entity-name", "cfg",
          "--delete-config", "cleanup.policy")
    d = admin("configs", "--bootstrap-server", b, "--describe", "--entity-type", "topics", "--entity-name", "cfg")
    assert [line.split()[0] for line in d.stdout.splitlines()[1:]] == ["retention.ms=60000"]
    everything = admin("configs", "--bootstrap-server", b, "--describe", "--entity-type", "brokers",
                       "--entity-name", "0", "--all")
    assert everything.stdout.startswith("All configs for broker 0 are:\n")
    assert any(line.startswith("  num.partitions=") for line in everything.stdout.splitlines())
    bad = admin("configs", "--bootstrap-server", b, "--alter", "--entity-type", "topics", "--entity-name", "cfg",
                "--add-config", "retention.ms=soon", rc=1)
    assert bad.stderr.startswith("Error: altering configs of topic cfg: INVALID_CONFIG")
    # KIP-848 group configs (resource type GROUP): the group need not exist.
    r = admin("configs", "--bootstrap-server", b, "--alter", "--entity-type", "groups", "--entity-name", "g-cfg",
              "--add-config", "consumer.heartbeat.interval.ms=6000")
    assert r.stdout == "Completed updating config for group g-cfg.\n"
    d = admin("configs", "--bootstrap-server", b, "--describe", "--entity-type", "groups", "--entity-name", "g-cfg")
    assert d.stdout.splitlines()[0] == "Dynamic configs for group g-cfg are:"
    assert d.stdout.splitlines()[1].startswith("  consumer.heartbeat.interval.ms=6000 sensitive=false synonyms="
                                               "{GROUP_CONFIG:consumer.heartbeat.interval.ms=6000")
    bad = admin("configs", "--bootstrap-server", b, "--alter", "--entity-type", "groups", "--entity-name", "g-cfg",
                "--add-config", "consumer.session.timeout.ms=1000", rc=1)
    assert "INVALID_CONFIG" in bad.stderr and "group.consumer.min.session.timeout.ms" in bad.stderr

    q = admin("configs", "--bootstrap-server", b, "--alter", "--entity-type", "clients", "--entity-name", "app1",
              "--add-config", "producer_byte_rate=1048576,consumer_byte_rate=2097152")
    assert q.stdout == "Completed updating config for entity: client-id 'app1'.\n"
    d = admin("configs", "--bootstrap-server", b, "--describe", "--entity-type", "clients", "--entity-name", "app1")
    assert d.stdout == ("Quota configs for client-id 'app1' are consumer_byte_rate=2097152.0, "
                        "producer_byte_rate=1048576.0\n")
    admin("configs", "--bootstrap-server", b, "--alter", "--entity-type", "clients", "--entity-name", "app1",
          "--delete-config", "producer_byte_rate,consumer_byte_rate")
    assert admin("configs", "--bootstrap-server", b, "--describe", "--entity-type", "clients", "--entity-name",
                 "app1").stdout == ""


# ---------------------------------------------------------------- librdkafka's mock cluster


@pytest.fixture(scope="module")
def mock_cluster() -> Iterator[str]:
    if not MOCK_SCRIPT.exists():
        pytest.skip(f"librdkafka's mock broker script is not at {MOCK_SCRIPT}")
    proc = subprocess.Popen([sys.executable, str(MOCK_SCRIPT), "mocktopic", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(60)
    try:
        assert line and line[0].startswith("READY"), f"mock cluster did not start: {line!r}"
        yield line[0].split()[1]
    finally:
        proc.terminate()
        proc.wait(30)


def test_against_librdkafka_mock_cluster(mock_cluster):
    b = mock_cluster
    assert "mocktopic_0" in admin("topics", "--bootstrap-server", b, "--list").stdout.split("\n")
    lines = admin("topics", "--bootstrap-server", b, "--describe", "--topic", "mocktopic_0").stdout.splitlines()
    assert "PartitionCount: 4" in lines[0] and len(lines) == 5
    assert all(f"\tPartition: {p}\tLeader: " in lines[p + 1] for p in range(4))
    admin("console-producer", "--bootstrap-server", b, "--topic", "mocktopic_0", "--property", "parse.key=true",
          "--property", "key.separator=:", stdin="".join(f"k{i}:v{i}\n" for i in range(8)))
    offsets = admin("get-offsets", "--bootstrap-server", b, "--topic", "mocktopic_0").stdout.splitlines()
    assert [o.rsplit(":", 1)[0] for o in offsets] == [f"mocktopic_0:{p}" for p in range(4)]
    assert sum(int(o.rsplit(":", 1)[1]) for o in offsets) == 8
    out = admin("console-consumer", "--bootstrap-server", b, "--topic", "mocktopic_0", "--group", "mockgroup",
                "--from-beginning", "--max-messages", "8", "--timeout-ms", "30000", "--property", "print.key=true")
    assert sorted(out.stdout.splitlines()) == sorted(f"k{i}\tv{i}" for i in range(8))
    # The mock cannot DescribeGroups: offsets and lag still come from OffsetFetch and ListOffsets.
    desc = admin("consumer-groups", "--bootstrap-server", b, "--describe", "--group", "mockgroup")
    rows = table(desc.stdout)
    assert rows[0][:6] == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"]
    by_partition = {int(r[2]): r for r in rows[1:]}
    ends = {int(o.rsplit(":", 2)[1]): int(o.rsplit(":", 1)[1]) for o in offsets}
    for p, r in by_partition.items():
        assert r[0] == "mockgroup" and int(r[3]) == int(r[4]) == ends[p] and r[5] == "0"
    assert sum(int(r[3]) for r in by_partition.values()) == 8


def test_kafka_tool_parity_flags_against_kbroker(broker):
    """The flags scripts use from Kafka 3.9's tools: group states, offset deletion, reset by duration with CSV
    export and Kafka's clamping warning, topic health filters, SCRAM users, broker defaults, --topic-partitions."""
    b = broker.bootstrap
    admin("topics", "--bootstrap-server", b, "--create", "--topic", "parity", "--partitions", "3",
          "--config", "min.insync.replicas=2")
    # acks=1: with min.insync.replicas=2 on one broker, acks=all would be refused (NOT_ENOUGH_REPLICAS)
    admin("console-producer", "--bootstrap-server", b, "--topic", "parity", "--property", "parse.key=true",
          "--request-required-acks", "1", stdin="".join(f"{i % 3}\tv{i}\n" for i in range(30)))
    admin("console-consumer", "--bootstrap-server", b, "--topic", "parity", "--group", "par-g", "--from-beginning",
          "--max-messages", "30", "--timeout-ms", "20000")

    listed = table(admin("consumer-groups", "--bootstrap-server", b, "--list", "--state").stdout)
    assert listed[0] == ["GROUP", "STATE"] and ["par-g", "Empty"] in listed[1:]
    assert table(admin("consumer-groups", "--bootstrap-server", b, "--list", "--state", "Stable").stdout) == \
        [["GROUP", "STATE"]]
    ends = dict(line.rsplit(":", 1)[0].split(":")[1:] + [line.rsplit(":", 1)[1]] for line in
                admin("get-offsets", "--bootstrap-server", b, "--topic", "parity").stdout.split())
    # Past the log end: Kafka's warning, and the offset clamped to the end
    r = admin("consumer-groups", "--bootstrap-server", b, "--reset-offsets", "--group", "par-g", "--topic",
              "parity:0", "--to-offset", "1000", "--export")
    assert r.stdout == f"parity,0,{ends['0']}\n"
    assert r.stderr == (f"WARN: New offset (1000) is higher than latest offset for topic partition parity-0. "
                        f"Value will be set to {ends['0']}\n")
    # An hour ago, every record was still to come: the earliest offsets
    r = admin("consumer-groups", "--bootstrap-server", b, "--reset-offsets", "--group", "par-g", "--topic", "parity",
              "--by-duration", "PT1H", "--export", "--execute")
    assert r.stdout.splitlines() == [f"parity,{p},0" for p in range(3)]
    deleted = table(admin("consumer-groups", "--bootstrap-server", b, "--delete-offsets", "--group", "par-g",
                          "--topic", "parity:1").stdout)
    assert deleted == [["TOPIC", "PARTITION", "STATUS"], ["parity", "1", "Successful"]]
    left = table(admin("consumer-groups", "--bootstrap-server", b, "--describe", "--group", "par-g").stdout)
    assert sorted(int(row[2]) for row in left[1:]) == [0, 2]

    # One broker: ISR 1 < min.insync.replicas 2 on every partition; all have a leader and all replicas in sync.
    under_min = admin("topics", "--bootstrap-server", b, "--describe", "--topic", "parity",
                      "--under-min-isr-partitions").stdout.splitlines()
    assert [line.split("\t")[2] for line in under_min] == [f"Partition: {p}" for p in range(3)]
    for flag in ("--under-replicated-partitions", "--unavailable-partitions"):
        assert admin("topics", "--bootstrap-server", b, "--describe", "--topic", "parity", flag).stdout == ""

    offsets = admin("get-offsets", "--bootstrap-server", b, "--topic-partitions", "parity:1-3,nothing-.*").stdout
    assert offsets.split() == [f"parity:{p}:{ends[str(p)]}" for p in (1, 2)]

    admin("configs", "--bootstrap-server", b, "--alter", "--entity-type", "users", "--entity-name", "alice",
          "--add-config", "SCRAM-SHA-256=[iterations=8192,password=alice-secret],SCRAM-SHA-512=[password=x]")
    assert admin("configs", "--bootstrap-server", b, "--describe", "--entity-type", "users", "--entity-name",
                 "alice").stdout == ("SCRAM credential configs for user-principal 'alice' are "
                                     "SCRAM-SHA-256=iterations=8192, SCRAM-SHA-512=iterations=4096\n")
    admin("configs", "--bootstrap-server", b, "--alter", "--entity-type", "users", "--entity-name", "alice",
          "--delete-config", "SCRAM-SHA-512")
    assert "SCRAM-SHA-512" not in admin("configs", "--bootstrap-server", b, "--describe", "--entity-type",
                                        "users").stdout

    assert admin("configs", "--bootstrap-server", b, "--alter", "--entity-type", "brokers", "--entity-default",
                 "--add-config", "message.max.bytes=2000000").stdout == \
        "Completed updating default config for brokers in the cluster.\n"
    assert admin("configs", "--bootstrap-server", b, "--describe", "--entity-type", "brokers",
                 "--entity-default").stdout.splitlines() == [
        "Default configs for brokers in the cluster are:",
        "  message.max.bytes=2000000 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:message.max.bytes=2000000}"]
    admin("configs", "--bootstrap-server", b, "--alter", "--entity-type", "brokers", "--entity-default",
          "--delete-config", "message.max.bytes")

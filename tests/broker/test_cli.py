"""The `python -m kbroker.broker` command line: config validation at startup, SIGTERM shutdown, restart with data."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from kbroker.protocol.messages import FetchRequest

from tests.broker_process import ROOT, BrokerProcess, free_port
from tests.clients import Msg, RawClient, aio_consume, ck_produce, kp_consume, wait_until

T = 15


def run_broker(tmp_path, *overrides: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    args = [sys.executable, "-m", "kbroker.broker", str(ROOT / "configs" / "server.properties"),
            "--override", f"log.dirs={tmp_path / 'logs'}",
            "--override", f"listeners=PLAINTEXT://127.0.0.1:{free_port()}"]
    for o in overrides:
        args += ["--override", o]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("override, key", [
    ("num.partitions=abc", "num.partitions"),
    ("num.partitions=0", "num.partitions"),
    ("no.such.key=1", "no.such.key"),
    ("listeners=garbage", "listeners"),
    ("auto.create.topics.enable=maybe", "auto.create.topics.enable"),
    ("log.segment.bytes=10", "log.segment.bytes"),
    # Kafka's GroupCoordinatorConfig bounds of the KIP-848 timeouts
    ("group.consumer.session.timeout.ms=30000", "group.consumer.min.session.timeout.ms"),
    ("group.consumer.max.heartbeat.interval.ms=4000", "group.consumer.min.heartbeat.interval.ms"),
])
def test_bad_config_stops_startup(tmp_path, override, key):
    r = run_broker(tmp_path, override)
    assert r.returncode != 0
    assert key in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_bad_config_file(tmp_path):
    bad = tmp_path / "bad.properties"
    bad.write_text("broker.id=zero\nlog.dirs=/tmp/x\n")
    r = subprocess.run([sys.executable, "-m", "kbroker.broker", str(bad)], cwd=ROOT, capture_output=True, text=True,
                       timeout=20)
    assert r.returncode != 0 and "broker.id" in r.stderr
    r = subprocess.run([sys.executable, "-m", "kbroker.broker", str(tmp_path / "missing.properties")], cwd=ROOT,
                       capture_output=True, text=True, timeout=20)
    assert r.returncode != 0 and "missing.properties" in r.stderr
    assert "Traceback" not in r.stderr


def test_port_in_use(tmp_path):
    first = BrokerProcess(tmp_path / "a").start()
    try:
        args = [sys.executable, "-m", "kbroker.broker", str(ROOT / "configs" / "server.properties"),
                "--override", f"log.dirs={tmp_path / 'b'}",
                "--override", f"listeners=PLAINTEXT://127.0.0.1:{first.port}"]
        r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=20)
        assert r.returncode == 1, r.stderr[-2000:]
        assert str(first.port) in r.stderr or "in use" in r.stderr, r.stderr[-2000:]
        assert first.alive()
    finally:
        assert first.stop() == 0


def test_sigterm_clean_shutdown_and_restart_keeps_data(tmp_path):
    b = BrokerProcess(tmp_path / "broker").start()
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("keep", 2, 1, config={"retention.ms": "86400000"})])["keep"].result(T)
        msgs = [Msg(f"k{i}".encode(), f"v{i}".encode(), (("h", b"1"),), 1_700_000_000_000 + i, i % 2)
                for i in range(1000)]
        delivered = ck_produce(b.bootstrap, "keep", msgs, **{"compression.type": "lz4"})
        cluster_id = admin.describe_cluster().result(T).cluster_id
        del admin

        assert b.stop() == 0
        assert "shut down cleanly" in b.read_log()

        b.start()
        got = kp_consume(b.bootstrap, "keep", [0, 1], 1000)
        assert sorted(got) == sorted(delivered)
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        assert admin.describe_cluster().result(T).cluster_id == cluster_id
        entries = next(iter(admin.describe_configs([ConfigResource("topic", "keep")]).values())).result(T)
        assert entries["retention.ms"].value == "86400000"
        # Appends continue after the recovered end.
        more = ck_produce(b.bootstrap, "keep", [Msg(b"k", b"after", partition=0)])
        assert more[0].offset == 500
    finally:
        assert b.stop() == 0


def test_kill_9_and_restart_keeps_acked_data(tmp_path):
    b = BrokerProcess(tmp_path / "broker").start()
    try:
        msgs = [Msg(f"k{i}".encode(), f"v{i}".encode() * 10, partition=0) for i in range(3000)]
        delivered = ck_produce(b.bootstrap, "crash", msgs, acks=-1)  # auto-created
        b.kill()
        b.start()
        got = aio_consume(b.bootstrap, "crash", [0], len(msgs))
        assert sorted(got) == sorted(delivered)
        more = ck_produce(b.bootstrap, "crash", [Msg(b"k", b"after", partition=0)])
        assert more[0].offset == 3000
    finally:
        assert b.stop() == 0


def test_sigterm_answers_parked_long_polls_and_closes_at_once(tmp_path):
    """Fetches parked in the purgatory answer with what they have when the broker stops, instead of holding the
    shutdown (and every client's next request, unread in its socket) for their max_wait_ms: a Java or kafka-python
    consumer's long poll used to keep a stopping broker serving nothing for the processors' 5 s grace."""
    from confluent_kafka import Consumer, TopicPartition  # noqa: PLC0415
    from kbroker.protocol import codec  # noqa: PLC0415

    b = BrokerProcess(tmp_path / "broker").start()
    stopped = False
    try:
        ck_produce(b.bootstrap, "parked", [Msg(None, b"v", partition=0)])
        consumer = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "parked", "enable.auto.commit": False,
                             "fetch.wait.max.ms": 30000, "fetch.min.bytes": 1_000_000, "log_level": 0})
        consumer.assign([TopicPartition("parked", 0, 0)])
        for _ in range(4):
            assert consumer.poll(0.5) is None  # its fetch waits for 1 MB or 30 s
        fetch = FetchRequest(
            replica_id=-1, max_wait_ms=30000, min_bytes=1_000_000, max_bytes=1_000_000, isolation_level=0,
            topics=[FetchRequest.FetchTopic(topic="parked", partitions=[
                FetchRequest.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1_000_000)])],
        )
        with RawClient(b.bootstrap, timeout=T) as raw:
            raw.send_bytes(raw.frame(1, 4, fetch))
            time.sleep(0.5)  # both fetches are parked
            t0 = time.monotonic()
            assert b.stop() == 0
            stopped = True
            took = time.monotonic() - t0
            # The raw long poll got its answer, with the record it had, before the connection closed.
            _, resp = codec.decode_response(1, 4, raw.recv_frame())
        part = resp.responses[0].partitions[0]
        assert part.error_code == 0 and part.high_watermark == 1 and len(part.records) > 0
        assert took < 3.0, f"SIGTERM took {took:.2f} s with two fetches parked"
        # So did librdkafka's.
        got = consumer.poll(5.0)
        assert got is not None and got.error() is None and got.value() == b"v"
        consumer.close()
    finally:
        if not stopped:
            b.stop()
    assert "shut down cleanly" in b.read_log()


def test_sigterm_answers_a_parked_join_group_at_once(tmp_path):
    """A JoinGroup waiting for a rebalance (a member that does not rejoin) is answered when the broker stops: it
    used to hold the shutdown for the network processors' 5 s grace."""
    import threading  # noqa: PLC0415

    from confluent_kafka import Consumer  # noqa: PLC0415
    from kafka import KafkaConsumer  # noqa: PLC0415

    b = BrokerProcess(tmp_path / "broker").start()
    stopped = False
    joiner = None
    try:
        ck_produce(b.bootstrap, "joined", [Msg(None, b"v", partition=0)])
        member = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "parked", "session.timeout.ms": 30000,
                           "max.poll.interval.ms": 300000, "log_level": 0})
        member.subscribe(["joined"])
        wait_until(lambda: (member.poll(0.2), member.assignment())[1], timeout=T, what="an assignment")
        # kafka-python joins too; the confluent member stops polling, so the rebalance waits for it (up to its
        # 300 s max.poll.interval.ms) and kafka-python's JoinGroup stays parked.
        joiner = KafkaConsumer("joined", bootstrap_servers=b.bootstrap, group_id="parked", session_timeout_ms=30000,
                               max_poll_interval_ms=300000, request_timeout_ms=305000)
        threading.Thread(target=lambda: joiner.poll(timeout_ms=20000), daemon=True).start()
        wait_until(lambda: "Preparing to rebalance group parked" in b.read_log(), timeout=T,
                   what="kafka-python's JoinGroup")
        time.sleep(0.5)  # its JoinGroup waits for the member that does not rejoin
        t0 = time.monotonic()
        assert b.stop() == 0
        stopped = True
        took = time.monotonic() - t0
        assert took < 3.0, f"SIGTERM took {took:.2f} s with a JoinGroup parked"
    finally:
        if not stopped:
            b.stop()
    assert "shut down cleanly" in b.read_log()


def test_first_start_and_shutdown_log_no_false_alarms(tmp_path):
    """A new log dir is not an unclean shutdown, and a long-poll fetch whose client went away does not leave a
    pending task to be destroyed at exit."""
    b = BrokerProcess(tmp_path / "broker").start()
    try:
        ck_produce(b.bootstrap, "polled", [Msg(None, b"v", partition=0)])
        fetch = FetchRequest(
            replica_id=-1, max_wait_ms=30000, min_bytes=1_000_000, max_bytes=1_000_000, isolation_level=0,
            topics=[FetchRequest.FetchTopic(topic="polled", partitions=[
                FetchRequest.FetchPartition(partition=0, fetch_offset=1, partition_max_bytes=1_000_000)])],
        )
        for _ in range(3):
            with RawClient(b.bootstrap) as c:
                c.send_bytes(c.frame(1, 4, fetch))
                time.sleep(0.2)  # the fetch is parked in purgatory when the client leaves
    finally:
        assert b.stop() == 0
    log = b.read_log()
    assert "shut down cleanly" in log
    assert "Loaded 0 logs" in log and "unclean" not in log, log
    assert "Task was destroyed" not in log and " ERROR " not in log, log
    # What start-up loaded is frozen out of the cyclic collector's sight, and collections are rarer (gc_tuning).
    frozen = re.search(r"Garbage collector: (\d+) start-up objects frozen, thresholds \(10000, 20, 100\)", log)
    assert frozen is not None and int(frozen.group(1)) > 10_000, log

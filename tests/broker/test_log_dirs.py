"""JBOD: AlterReplicaLogDirs moves a partition between log.dirs online (kafka-python's admin client and raw
requests), DescribeLogDirs follows the move, and a failed log dir takes only its partitions offline."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka import KafkaConsumer, KafkaProducer, TopicPartitionReplica
from kafka import TopicPartition as KTP
from kafka.admin import KafkaAdminClient
from kafka.errors import KafkaStorageError, NoError
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import AlterReplicaLogDirsRequest, DescribeLogDirsRequest

from kbroker_tools.wire import WireClient
from tests.broker.test_metrics import scrape, value
from tests.broker_process import BrokerProcess, free_port, wait_for_port
from tests.clients import ck_read_committed, wait_until

RAW = AlterReplicaLogDirsRequest
# Copying at this rate makes the move of ~1 MB last seconds: long enough to see the future replica and to kill
# the broker halfway through.
SLOW_COPY = "300000"


def _broker(tmp_path: Path, n_dirs: int, **overrides: str) -> tuple[BrokerProcess, list[Path]]:
    dirs = [tmp_path / f"dir{i}" for i in range(n_dirs)]
    b = BrokerProcess(tmp_path, {"log.dirs": ",".join(map(str, dirs)), "num.partitions": "1", **overrides})
    return b.start(), [d.resolve() for d in dirs]


def _placement(bootstrap: str) -> dict[tuple[str, int, bool], tuple[str, int]]:
    """(topic, partition, is_future) -> (log dir, offset lag), from DescribeLogDirs v1; dirs with an error map to
    their error code under ("", -1, False)."""
    with WireClient(bootstrap) as c:
        resp = c.request(35, 1, DescribeLogDirsRequest(topics=None))
    out: dict[tuple[str, int, bool], tuple[str, int]] = {}
    for r in resp.results:
        if r.error_code:
            out[(r.log_dir, -1, False)] = ("error", r.error_code)
        for t in r.topics:
            for p in t.partitions:
                out[(t.name, p.partition_index, p.is_future_key)] = (r.log_dir, p.offset_lag)
    return out


def _dir_of(bootstrap: str, topic: str, partition: int = 0) -> Path:
    return Path(_placement(bootstrap)[(topic, partition, False)][0])


def _create(bootstrap: str, topic: str) -> None:
    with WireClient(bootstrap) as c:
        c.create_topic(topic, 1)


class _Producing:
    """An idempotent acks=all producer sending numbered records until stopped; `acked` holds what was acknowledged."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.p = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 60000,
            }
        )
        self.topic = topic
        self.acked: set[int] = set()
        self.errors: list[Any] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._n = 0

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acked.add(int(msg.value()[:10]))
        else:
            self.errors.append(err)

    def send(self, count: int, size: int = 1000) -> None:
        for _ in range(count):
            self.p.produce(
                self.topic, value=b"%010d" % self._n + b"x" * (size - 10), on_delivery=self._on_delivery
            )
            self._n += 1
            self.p.poll(0)

    def _run(self) -> None:
        while not self._stop.is_set():  # ~40 KB/s: well below the throttled copying
            self.send(10, 200)
            time.sleep(0.05)

    def __enter__(self) -> _Producing:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.p.flush(60)


def _read_all(bootstrap: str, topic: str, expected: int) -> list[int]:
    c = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        consumer_timeout_ms=3000,
    )
    c.assign([KTP(topic, 0)])
    got: list[int] = []
    deadline = time.monotonic() + 60
    while len(got) < expected and time.monotonic() < deadline:
        for records in c.poll(timeout_ms=500, max_records=5000).values():
            got.extend(int(r.value[:10]) for r in records)
    c.close()
    return got


def _assert_all_acked_readable(bootstrap: str, topic: str, acked: set[int]) -> None:
    got = _read_all(bootstrap, topic, len(acked))
    assert len(got) == len(set(got)), "duplicates in the log"
    missing = acked - set(got)
    assert not missing, f"{len(missing)} acknowledged records missing, e.g. {sorted(missing)[:5]}"


def test_move_under_produce_with_kafka_python_admin(tmp_path: Path) -> None:
    b, dirs = _broker(tmp_path, 2, **{"replica.alter.log.dirs.io.max.bytes.per.second": SLOW_COPY})
    try:
        topic = "moving"
        _create(b.bootstrap, topic)
        src = _dir_of(b.bootstrap, topic)
        dest = next(d for d in dirs if d != src)
        admin = KafkaAdminClient(bootstrap_servers=b.bootstrap)
        with _Producing(b.bootstrap, topic) as prod:
            prod.send(800)  # ~0.8 MB to copy: seconds at the throttled rate
            prod.p.flush(30)
            result = admin.alter_replica_log_dirs({TopicPartitionReplica(topic, 0, 0): str(dest)})
            assert list(result.values()) == [NoError]
            # While moving: the current replica still in src, the future one in dest with its lag.
            moving = wait_until(
                lambda: (p := _placement(b.bootstrap)).get((topic, 0, True)) and p,
                timeout=15,
                what="the future replica in DescribeLogDirs",
            )
            assert moving[(topic, 0, True)][0] == str(dest)
            assert moving[(topic, 0, False)][0] == str(src)
            assert list((dest).glob(f"{topic}-0.*-future")), "the future log's directory"
            wait_until(lambda: (topic, 0, True) not in _placement(b.bootstrap), timeout=60, what="the swap")
            acked_during = len(prod.acked)
            wait_until(
                lambda: len(prod.acked) > acked_during + 100, timeout=20, what="produce after the move"
            )
        assert not prod.errors, prod.errors[:3]
        assert _dir_of(b.bootstrap, topic) == dest
        assert (dest / f"{topic}-0").is_dir() and not (src / f"{topic}-0").exists()
        # The same request again: the log is where it is asked to be, nothing to do.
        assert list(admin.alter_replica_log_dirs({(topic, 0, 0): str(dest)}).values()) == [NoError]
        admin.close()
        _assert_all_acked_readable(b.bootstrap, topic, prod.acked)
        b.restart()
        assert _dir_of(b.bootstrap, topic) == dest
        _assert_all_acked_readable(b.bootstrap, topic, prod.acked)
    finally:
        b.kill()


def test_kill_9_mid_move_loses_nothing_and_the_move_resumes(tmp_path: Path) -> None:
    b, dirs = _broker(tmp_path, 2, **{"replica.alter.log.dirs.io.max.bytes.per.second": SLOW_COPY})
    try:
        topic = "killed"
        _create(b.bootstrap, topic)
        src = _dir_of(b.bootstrap, topic)
        dest = next(d for d in dirs if d != src)
        prod = _Producing(b.bootstrap, topic)
        prod.send(900)
        prod.p.flush(30)
        with WireClient(b.bootstrap) as c:
            resp = c.request(
                34,
                2,
                RAW(
                    dirs=[
                        RAW.AlterReplicaLogDir(
                            path=str(dest), topics=[RAW.AlterReplicaLogDirTopic(name=topic, partitions=[0])]
                        )
                    ]
                ),
            )
        assert resp.results[0].partitions[0].error_code == 0
        wait_until(lambda: list(dest.glob(f"{topic}-0.*-future")), timeout=10, what="the future log")
        time.sleep(0.5)  # part of the copy done
        b.kill()
        assert (src / f"{topic}-0").is_dir()
        b.start()
        _assert_all_acked_readable(b.bootstrap, topic, prod.acked)
        # The copy starts over after the restart and finishes.
        wait_until(lambda: _dir_of(b.bootstrap, topic) == dest, timeout=60, what="the resumed move")
        _assert_all_acked_readable(b.bootstrap, topic, prod.acked)
        assert len(prod.acked) == 900
    finally:
        b.kill()


def test_moved_log_keeps_transactions_and_producer_state(tmp_path: Path) -> None:
    """Aborted and committed transactions, an open one and an idempotent producer's sequences survive the swap:
    read_committed sees the same, the open transaction completes and the producer goes on without errors."""
    b, dirs = _broker(
        tmp_path, 2, **{"transaction.state.log.replication.factor": "1", "transaction.state.log.min.isr": "1"}
    )
    try:
        topic = "txn-moving"
        _create(b.bootstrap, topic)
        src = _dir_of(b.bootstrap, topic)
        dest = next(d for d in dirs if d != src)
        tp = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "mover"})
        tp.init_transactions(30)
        for value, commit in ((b"a1", False), (b"c1", True)):
            tp.begin_transaction()
            tp.produce(topic, value=value)
            tp.commit_transaction(30) if commit else tp.abort_transaction(30)
        tp.begin_transaction()
        tp.produce(topic, value=b"open")
        tp.flush(10)
        admin = KafkaAdminClient(bootstrap_servers=b.bootstrap)
        assert list(admin.alter_replica_log_dirs({(topic, 0, 0): str(dest)}).values()) == [NoError]
        admin.close()
        wait_until(lambda: _dir_of(b.bootstrap, topic) == dest, timeout=30, what="the move")
        assert [v for _, v in ck_read_committed(b.bootstrap, topic)] == [b"c1"]
        tp.commit_transaction(30)
        tp.begin_transaction()
        tp.produce(topic, value=b"after")
        tp.commit_transaction(30)
        assert [v for _, v in ck_read_committed(b.bootstrap, topic)] == [b"c1", b"open", b"after"]
    finally:
        b.kill()


def test_raw_requests_get_kafkas_answers(tmp_path: Path) -> None:
    b, dirs = _broker(tmp_path, 2)
    try:
        topic = "raw"
        _create(b.bootstrap, topic)
        src = _dir_of(b.bootstrap, topic)

        def alter(
            path: str, name: str, partitions: list[int], version: int = 2
        ) -> dict[tuple[str, int], int]:
            with WireClient(b.bootstrap) as c:
                resp = c.request(
                    34,
                    version,
                    RAW(
                        dirs=[
                            RAW.AlterReplicaLogDir(
                                path=path,
                                topics=[RAW.AlterReplicaLogDirTopic(name=name, partitions=partitions)],
                            )
                        ]
                    ),
                )
            return {
                (t.topic_name, p.partition_index): p.error_code for t in resp.results for p in t.partitions
            }

        with WireClient(b.bootstrap) as c:
            v = {k.api_key: (k.min_version, k.max_version) for k in c.api_versions().api_keys}
        assert v[34] == (0, 2)
        assert alter(str(tmp_path / "nowhere"), topic, [0]) == {(topic, 0): ErrorCode.LOG_DIR_NOT_FOUND}
        assert alter(str(src), "no-such-topic", [0]) == {
            ("no-such-topic", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        }
        assert alter(str(src), topic, [7]) == {(topic, 7): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        # Already there: nothing moves.
        assert alter(str(src), topic, [0], version=0) == {(topic, 0): 0}
        assert (topic, 0, True) not in _placement(b.bootstrap)
        dest = next(d for d in dirs if d != src)
        assert alter(str(dest), topic, [0], version=1) == {(topic, 0): 0}
        wait_until(lambda: _dir_of(b.bootstrap, topic) == dest, timeout=20, what="the move of an empty log")
    finally:
        b.kill()


def test_failed_log_dir_takes_only_its_partitions_offline(tmp_path: Path) -> None:
    metrics_port = free_port()
    b, dirs = _broker(
        tmp_path,
        2,
        **{"log.flush.offset.checkpoint.interval.ms": "200", "metrics.port": str(metrics_port)},
    )
    try:
        wait_for_port(metrics_port)
        assert value(scrape(metrics_port), "kafka_log_logmanager_offlinelogdirectorycount") == 0
        _create(b.bootstrap, "healthy")  # first: into dir0, which also holds the embedded metadata
        _create(b.bootstrap, "doomed")
        bad, good = _dir_of(b.bootstrap, "doomed"), _dir_of(b.bootstrap, "healthy")
        assert bad != good, "the two topics' logs went to different dirs"
        kp = KafkaProducer(bootstrap_servers=b.bootstrap, retries=0, acks=1)
        kp.send("doomed", b"before").get(10)
        # The dir is replaced by a file: the next checkpoint write in it fails with ENOTDIR.
        bad.rename(bad.with_name("moved-away"))
        bad.write_text("not a directory")
        wait_until(
            lambda: ("error", ErrorCode.KAFKA_STORAGE_ERROR) in _placement(b.bootstrap).values(),
            timeout=15,
            what="the failed dir in DescribeLogDirs",
        )
        p = _placement(b.bootstrap)
        assert p[(str(bad), -1, False)] == ("error", ErrorCode.KAFKA_STORAGE_ERROR)
        assert p[("healthy", 0, False)][0] == str(good)
        samples = scrape(metrics_port)
        assert value(samples, "kafka_log_logmanager_offlinelogdirectorycount") == 1
        assert value(samples, "kafka_server_replicamanager_offlinereplicacount") == 1
        with pytest.raises(KafkaStorageError):
            kp.send("doomed", b"after").get(10)
        with WireClient(b.bootstrap) as c:
            md = {t.name: t.partitions[0] for t in c.metadata(["doomed", "healthy"]).topics}
        assert (md["doomed"].error_code, md["doomed"].leader_id, md["doomed"].offline_replicas) == (
            ErrorCode.LEADER_NOT_AVAILABLE,
            -1,
            [0],
        )
        assert (md["healthy"].error_code, md["healthy"].leader_id, md["healthy"].offline_replicas) == (
            0,
            0,
            [],
        )
        kp.send("healthy", b"still served").get(10)
        with WireClient(b.bootstrap) as c:
            from kbroker.protocol.messages import FetchRequest

            F = FetchRequest
            resp = c.request(
                1,
                11,
                F(
                    replica_id=-1,
                    max_wait_ms=0,
                    min_bytes=1,
                    max_bytes=1 << 20,
                    isolation_level=0,
                    session_id=0,
                    session_epoch=-1,
                    topics=[
                        F.FetchTopic(
                            topic=t,
                            partitions=[
                                F.FetchPartition(
                                    partition=0,
                                    fetch_offset=0,
                                    log_start_offset=-1,
                                    partition_max_bytes=1 << 20,
                                )
                            ],
                        )
                        for t in ("doomed", "healthy")
                    ],
                ),
            )
            codes = {r.topic: r.partitions[0].error_code for r in resp.responses}
            assert codes == {"doomed": ErrorCode.KAFKA_STORAGE_ERROR, "healthy": 0}
            # No move into or out of the failed dir.
            resp = c.request(
                34,
                2,
                RAW(
                    dirs=[
                        RAW.AlterReplicaLogDir(
                            path=str(bad),
                            topics=[RAW.AlterReplicaLogDirTopic(name="healthy", partitions=[0])],
                        )
                    ]
                ),
            )
            assert resp.results[0].partitions[0].error_code == ErrorCode.KAFKA_STORAGE_ERROR
        kp.close()
        assert b.alive()
        # A restart with the dir still unusable: the broker starts on the other one, the dir stays offline and no
        # empty log takes the place of the one in it.
        b.restart()
        p = _placement(b.bootstrap)
        assert p[(str(bad), -1, False)] == ("error", ErrorCode.KAFKA_STORAGE_ERROR)
        assert p[("healthy", 0, False)][0] == str(good)
        kp = KafkaProducer(bootstrap_servers=b.bootstrap, retries=0, acks=1)
        kp.send("healthy", b"after the restart").get(10)
        with pytest.raises(KafkaStorageError):
            kp.send("doomed", b"after the restart").get(10)
        kp.close()
    finally:
        b.kill()


def test_java_admin_alter_and_describe_replica_log_dirs(tmp_path: Path) -> None:
    """The official Java admin client: alterReplicaLogDirs (LogDirNotFoundException for an unknown dir) and
    describeReplicaLogDirs showing the future replica, then the partition in its new dir."""
    import shutil
    import subprocess

    from tests.java.test_java_client import JARS, find_jar_dir

    jars = find_jar_dir()
    if jars is None or shutil.which("javac") is None:
        pytest.skip("the Java Kafka client or a JDK is not installed")
    cp = ":".join(str(jars / f"{j}.jar") for j in JARS)
    src = Path(__file__).resolve().parent.parent / "java" / "LogDirsAdmin.java"
    classes = tmp_path / "classes"
    subprocess.run(["javac", "-cp", cp, "-d", str(classes), str(src)], check=True, timeout=120)
    b, dirs = _broker(tmp_path, 3, **{"replica.alter.log.dirs.io.max.bytes.per.second": SLOW_COPY})
    try:
        topic = "java-moving"
        _create(b.bootstrap, topic)
        prod = _Producing(b.bootstrap, topic)
        prod.send(600)
        prod.p.flush(30)
        src_dir = _dir_of(b.bootstrap, topic)
        dest = next(d for d in dirs if d != src_dir)
        out = subprocess.run(
            [
                "java",
                "-XX:TieredStopAtLevel=1",
                "-XX:+UseSerialGC",
                "-cp",
                f"{classes}:{cp}",
                "LogDirsAdmin",
                b.bootstrap,
                topic,
                str(dest),
                str(tmp_path / "nowhere"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        lines = [line.split() for line in out.stdout.splitlines()]
        assert lines[0] == ["X", "LogDirNotFoundException"]
        futures = [x for x in lines if x[0] == "F"]
        assert futures and all(x[1] == str(dest) and int(x[2]) >= 0 for x in futures), lines
        assert lines[-1] == ["C", str(dest)]
        _assert_all_acked_readable(b.bootstrap, topic, prod.acked)
    finally:
        b.kill()

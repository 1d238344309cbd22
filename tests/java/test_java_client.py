"""The official Java Kafka client (kafka-clients 3.9) against a real kbroker process, unmodified.

KafkaCompat.java (beside this file) is compiled once per module with javac; each test runs one or more of its
scenarios in a JVM and checks its `OK`/`INFO`/`DONE` lines, then cross-checks with confluent-kafka: records
produced by Java are read back by librdkafka and records produced by librdkafka are verified by Java, both
through the same deterministic generator (`gen` here, `key`/`value`/`headers`/`timestamp` in Java).

The Java jars come from a pip package (see the `test` extra in pyproject.toml): kafka-clients plus the
lz4-java, snappy-java, zstd-jni and slf4j-api jars it needs, under site-packages/pyflink/lib.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.clients import Msg, RawClient, Rec, by_partition, ck_consume, ck_produce

HERE = Path(__file__).resolve().parent
SOURCES = [HERE / "KafkaCompat.java", HERE / "org" / "slf4j" / "impl" / "StaticLoggerBinder.java"]
JARS = ["kafka-clients", "slf4j-api", "lz4-java", "snappy-java", "zstd-jni"]
BASE_TS = 1_700_000_000_000
COUNT = 10_000
JAVA_TIMEOUT = 240
# The Java client's log level (stderr): WARN keeps passing runs quiet but shows what went wrong.
JAVA_LOG = os.environ.get("KBROKER_JAVA_LOG", "WARN")
COMPRESSION_CODES = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def find_jar_dir() -> Path | None:
    """pyflink/lib holding every jar we need (pyflink is a namespace package: search all its paths)."""
    spec = importlib.util.find_spec("pyflink")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        lib = Path(loc) / "lib"
        if all((lib / f"{j}.jar").is_file() for j in JARS):
            return lib
    return None


def _missing() -> str | None:
    if shutil.which("javac") is None or shutil.which("java") is None:
        return "javac/java not on PATH (install a JDK, e.g. openjdk-17-jdk-headless)"
    if find_jar_dir() is None:
        return ("Java Kafka client jars not found: pip install the `test` extra "
                "(shigawire-apache-flink-libraries ships pyflink/lib/kafka-clients.jar and its dependencies)")
    return None


_why = _missing()
pytestmark = pytest.mark.skipif(_why is not None, reason=_why or "")


# ---------------------------------------------------------------- the record generator (mirrors KafkaCompat.java)


def gen(tag: str, i: int) -> Msg:
    headers: tuple[tuple[str, bytes], ...] = (("idx", str(i).encode()), ("tag", tag.encode()))
    if i % 3 == 0:
        headers += (("empty", b""),)
    value = None if i % 101 == 0 else f"{tag}-value-{i}-{'abcdefghij' * (i % 20)}".encode()
    return Msg(f"{tag}-key-{i}".encode(), value, headers, BASE_TS + 10 * i)


def check_records(tag: str, recs: Sequence[Rec], count: int) -> dict[int, int]:
    """Every generated record exactly once, identical, in produce order and at offsets 0.. per partition."""
    seen: set[int] = set()
    for p, rs in by_partition(recs).items():
        assert [r.offset for r in rs] == list(range(len(rs))), f"partition {p}: offsets not 0..{len(rs) - 1}"
        last = -1
        for r in rs:
            assert r.key is not None and r.key.startswith(f"{tag}-key-".encode()), r
            i = int(r.key.rsplit(b"-", 1)[1])
            want = gen(tag, i)
            assert (r.key, r.value, r.headers, r.timestamp) == (want.key, want.value, want.headers, want.timestamp), \
                f"partition {p} offset {r.offset}: {r} != {want}"
            assert i > last, f"partition {p}: record {i} after {last}"
            assert i not in seen
            last = i
            seen.add(i)
    assert seen == set(range(count)), f"{count - len(seen)} records missing"
    return {p: len(rs) for p, rs in by_partition(recs).items()}


# ---------------------------------------------------------------- running Java


def compile_java(tmp_path_factory: pytest.TempPathFactory, sources: list[Path], name: str) -> str:
    """javac the sources against the kafka-clients jars; the classpath to run them with."""
    jar_dir = find_jar_dir()
    assert jar_dir is not None
    jars = [str(jar_dir / f"{j}.jar") for j in JARS]
    out = tmp_path_factory.mktemp(name)
    r = subprocess.run(["javac", "-Xlint:all", "-d", str(out), "-cp", os.pathsep.join(jars), *map(str, sources)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"javac failed:\n{r.stdout}\n{r.stderr}"
    return os.pathsep.join([str(out), *jars])


@pytest.fixture(scope="module")
def java_classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Compile KafkaCompat once per module; the classpath to run it with."""
    return compile_java(tmp_path_factory, SOURCES, "java-classes")


@dataclass
class JavaRun:
    stdout: str
    stderr: str

    @property
    def ok(self) -> list[str]:
        return [line[3:] for line in self.stdout.splitlines() if line.startswith("OK ")]

    @property
    def info(self) -> list[dict[str, Any]]:
        return [json.loads(line[5:]) for line in self.stdout.splitlines() if line.startswith("INFO ")]

    def info_with(self, key: str) -> dict[str, Any]:
        found = [i for i in self.info if key in i]
        assert found, f"no INFO line with {key!r} in:\n{self.stdout}"
        return found[-1]


def run_java(classpath: str, broker: Any, scenario: str, log: str = JAVA_LOG, jvm_props: Sequence[str] = (),
             **args: Any) -> JavaRun:
    cmd = ["java", f"-Dkcompat.log={log}", *jvm_props, "-cp", classpath, "KafkaCompat", broker.bootstrap, scenario,
           *(f"{k}={v}" for k, v in args.items())]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=JAVA_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        out, err = (x.decode(errors="replace") if isinstance(x, bytes) else x or "" for x in (e.stdout, e.stderr))
        raise AssertionError(f"Java scenario {scenario} {args} timed out after {JAVA_TIMEOUT}s\n"
                             f"--- stdout:\n{out}\n--- stderr:\n{err[-8000:]}\n"
                             f"--- broker log (tail):\n{broker.read_log()[-4000:]}") from None
    done = [f"DONE {scenario}"]
    if r.returncode != 0 or r.stdout.splitlines()[-1:] != done:
        raise AssertionError(
            f"Java scenario {scenario} {args} exited {r.returncode}\n--- stdout:\n{r.stdout}\n"
            f"--- stderr (Java client, log level {log}):\n{r.stderr[-8000:]}\n"
            f"--- broker log (tail):\n{broker.read_log()[-4000:]}")
    return JavaRun(r.stdout, r.stderr)


# ---------------------------------------------------------------- raw protocol helpers


def api_keys(bootstrap: str) -> set[int]:
    from kbroker.protocol.messages import ApiVersionsRequest

    with RawClient(bootstrap) as raw:
        resp = raw.request(18, 0, ApiVersionsRequest())
    assert resp.error_code == 0
    return {k.api_key for k in resp.api_keys}


def stored_batches(bootstrap: str, topic: str, partition: int, max_bytes: int = 1 << 20) -> list[Any]:
    """The record batch headers the broker returns from offset 0 (a raw Fetch v12: zstd topics need v10+)."""
    from kbroker.protocol.messages import FetchRequest
    from kbroker.protocol.records import iter_batch_headers

    req = FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=max_bytes, isolation_level=0,
                       session_id=0, session_epoch=-1,
                       topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
                           FetchRequest.FetchPartition(partition=partition, fetch_offset=0,
                                                       partition_max_bytes=max_bytes)])])
    with RawClient(bootstrap) as raw:
        resp = raw.request(1, 12, req)
    [pd] = resp.responses[0].partitions
    assert pd.error_code == 0
    return [h for _, h in iter_batch_headers(pd.records or b"")]


def ck_create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


# ---------------------------------------------------------------- tests


def test_admin(java_classpath: str, broker: Any, topic_name: str) -> None:
    from confluent_kafka.admin import AdminClient

    run = run_java(java_classpath, broker, "admin", topic=topic_name)
    expected = ["describeCluster", "createTopics", "createTopics existing", "describeTopics", "describeConfigs",
                "incrementalAlterConfigs SET", "incrementalAlterConfigs DELETE", "createPartitions", "deleteRecords",
                "consume after deleteRecords", "listTopics", "deleteTopics", "describeTopics deleted"]
    assert [line.split(" ", 2)[0] for line in run.ok] == [e.split(" ")[0] for e in expected], run.stdout
    for e in expected:
        assert any(line.startswith(e) for line in run.ok), (e, run.stdout)
    cluster = run.info_with("cluster_id")
    md = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
    assert cluster["cluster_id"] == md.cluster_id
    assert cluster["controller_id"] == md.controller_id
    assert [(n["id"], n["host"], n["port"]) for n in cluster["nodes"]] == \
        [(b.id, b.host, b.port) for b in md.brokers.values()]
    assert topic_name not in md.topics


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_produce_consume(java_classpath: str, broker: Any, topic_name: str, compression: str) -> None:
    """Java produces 10,000 records (acks=all, no idempotence) and reads them back; librdkafka reads them too."""
    run = run_java(java_classpath, broker, "produce,consume", topic=topic_name, compression=compression,
                   idempotence="false", count=COUNT)
    assert f"produced {COUNT} compression={compression} idempotence=false" in run.ok
    assert any(line.startswith(f"consumed {COUNT} identical records in order") for line in run.ok)
    assert any(line.startswith("offsetsForTimes") for line in run.ok)
    # KIP-714: the client pushes metrics by default (enable.metrics.push); kbroker does not offer telemetry, as Kafka
    # without a metrics plugin, and the client must not complain about it.
    assert not [ln for ln in run.stderr.splitlines() if "elemetry" in ln and ("WARN" in ln or "ERROR" in ln)]
    per_partition = {int(p): n for p, n in run.info_with("produced")["per_partition"].items()}
    assert sorted(per_partition) == [0, 1, 2]

    recs = ck_consume(broker.bootstrap, topic_name, range(3), COUNT)
    assert check_records(topic_name, recs, COUNT) == per_partition

    batches = stored_batches(broker.bootstrap, topic_name, 0)
    assert batches
    assert {b.compression for b in batches} == {COMPRESSION_CODES[compression]}
    assert {b.producer_id for b in batches} == {-1}


@pytest.mark.parametrize("target", ["lz4", "snappy", "gzip", "zstd"])
def test_topic_compression_type_recompresses(java_classpath: str, broker: Any, topic_name: str,
                                             target: str) -> None:
    """A topic with compression.type set: the broker recompresses what Java sends uncompressed (with its
    idempotent producer's metadata), Java and librdkafka read the broker's frames back."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 3, 1, config={"compression.type": target})])[topic_name].result(30)
    run = run_java(java_classpath, broker, "produce,consume", topic=topic_name, compression="none",
                   idempotence="default", count=COUNT, create="false")
    assert f"produced {COUNT} compression=none idempotence=default" in run.ok
    assert any(line.startswith(f"consumed {COUNT} identical records in order") for line in run.ok)
    recs = ck_consume(broker.bootstrap, topic_name, range(3), COUNT)
    check_records(topic_name, recs, COUNT)
    for p in range(3):
        batches = stored_batches(broker.bootstrap, topic_name, p)
        assert batches and {b.compression for b in batches} == {COMPRESSION_CODES[target]}
        assert batches[0].producer_id >= 0 and batches[0].base_sequence == 0


def test_idempotent_producer(java_classpath: str, broker: Any, topic_name: str) -> None:
    """The Java default (enable.idempotence=true): needs InitProducerId (key 22) advertised."""
    if 22 not in api_keys(broker.bootstrap):
        pytest.skip("kbroker does not advertise InitProducerId (ApiVersions key 22): "
                    "the Java producer's default idempotence cannot work yet")
    run = run_java(java_classpath, broker, "produce,consume", log="INFO", topic=topic_name, compression="lz4",
                   idempotence="default", count=COUNT)
    assert f"produced {COUNT} compression=lz4 idempotence=default" in run.ok
    assert any(line.startswith(f"consumed {COUNT} identical records in order") for line in run.ok)
    assert "Instantiated an idempotent producer" in run.stderr
    assert "ProducerId set to" in run.stderr

    recs = ck_consume(broker.bootstrap, topic_name, range(3), COUNT)
    check_records(topic_name, recs, COUNT)
    for p in range(3):
        batches = stored_batches(broker.bootstrap, topic_name, p)
        assert batches and len({b.producer_id for b in batches}) == 1
        assert batches[0].producer_id >= 0 and batches[0].producer_epoch == 0
        # Sequences start at 0 and follow on from batch to batch.
        seq = 0
        for b in batches:
            assert b.base_sequence == seq, (p, b)
            seq += b.last_offset_delta + 1


@pytest.fixture(scope="module")
def python_topic(broker: Any) -> str:
    """A 3-partition topic with COUNT generated records produced by librdkafka (lz4, keyed)."""
    topic = "java-reads-librdkafka"
    ck_create_topic(broker.bootstrap, topic, 3)
    conf: dict[str, Any] = {"compression.type": "lz4", "acks": "all"}
    delivered = ck_produce(broker.bootstrap, topic, [gen(topic, i) for i in range(COUNT)], **conf)
    assert len(delivered) == COUNT
    return topic


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_java_consumes_librdkafka_records(java_classpath: str, broker: Any, python_topic: str,
                                          isolation: str) -> None:
    """assign()+seekToBeginning, offsets APIs; read_committed still reads non-transactional data."""
    run = run_java(java_classpath, broker, "consume", topic=python_topic, count=COUNT, isolation=isolation)
    assert f"consumed {COUNT} identical records in order (isolation={isolation}, 3 partitions)" in run.ok
    recs = ck_consume(broker.bootstrap, python_topic, range(3), COUNT)
    ends = {int(p): n for p, n in run.info_with("end_offsets")["end_offsets"].items()}
    assert ends == {p: len(rs) for p, rs in by_partition(recs).items()}


def test_consumer_group_resumes_after_commit(java_classpath: str, broker: Any, python_topic: str) -> None:
    """subscribe() with group.id, commitSync, close; a new member of the group resumes after the commit."""
    from confluent_kafka import Consumer, TopicPartition

    group = "java-group"
    run = run_java(java_classpath, broker, "group", topic=python_topic, group=group, count=COUNT)
    first = run.info_with("first_consumer_read")
    assert first["first_consumer_read"] >= COUNT // 2
    assert any(line.startswith("second consumer resumed after the committed offsets") for line in run.ok)

    # librdkafka sees the group's final commits at the end of every partition.
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        committed = c.committed([TopicPartition(python_topic, p) for p in range(3)], timeout=10)
        ends = {p: c.get_watermark_offsets(TopicPartition(python_topic, p), timeout=10)[1] for p in range(3)}
    finally:
        c.close()
    assert {tp.partition: tp.offset for tp in committed} == ends


def test_consumer_group_rebalance(java_classpath: str, broker: Any, python_topic: str) -> None:
    """Two members of one group share the partitions (commit on revoke: nothing read twice); one leaves, the
    other takes over every partition."""
    run = run_java(java_classpath, broker, "rebalance", topic=python_topic, group="java-rebalance", count=COUNT)
    assert any(line.startswith("two members share 3 partitions") for line in run.ok), run.stdout
    assert any(line.startswith("after the second member left the first holds all 3 partitions") for line in run.ok)


def test_client_quotas(java_classpath: str, broker: Any) -> None:
    """The Java Admin client sets, reads and removes client quotas."""
    run = run_java(java_classpath, broker, "quotas", client="java-quota-client")
    for e in ["alterClientQuotas java-quota-client", "describeClientQuotas", "alterClientQuotas negative refused",
              "alterClientQuotas remove"]:
        assert any(line.startswith(e) for line in run.ok), (e, run.stdout)


def test_fetch_sessions_many_partitions(java_classpath: str, tmp_path: Path, topic_name: str) -> None:
    """KIP-227: the Java consumer reads 100 partitions through one incremental fetch session while a producer is
    still writing; every record arrives exactly once. Its FetchSessionHandler's own log shows the session the
    broker created and the incremental responses that left unchanged partitions out; the broker's gauges show the
    session closed when the consumer closed, and nothing evicted."""
    import re
    import urllib.request

    from tests.broker_process import BrokerProcess, free_port

    metrics_port = free_port()
    b = BrokerProcess(tmp_path, {"metrics.port": str(metrics_port), "metrics.host": "127.0.0.1"})
    b.start()
    try:
        n = 20_000
        run = run_java(java_classpath, b, "sessions",
                       jvm_props=["-Dkcompat.log.org.apache.kafka.clients.FetchSessionHandler=DEBUG"],
                       topic=topic_name, partitions=100, count=n)
        assert f"consumed {n} records exactly once from 100 partitions while producing" in run.ok
        lines = run.stderr.splitlines()
        # Up to close(): then the client marks its session to be closed, and a response still in flight is
        # logged as a "full" one.
        closing = [i for i, ln in enumerate(lines) if "close the existing session" in ln]
        assert closing, "the consumer did not close its fetch session"
        lines = lines[:closing[0]]
        created = [ln for ln in lines if "sent a full fetch response that created a new incremental fetch session" in ln]
        incremental = [ln for ln in lines if "sent an incremental fetch response" in ln]
        implied = [int(m.group(1)) for ln in incremental if (m := re.search(r"(\d+) implied partition", ln))]
        assert len(created) == 1 and "with 100 response partition(s)" in created[0], created
        assert len(incremental) >= 10, len(incremental)
        # Unchanged partitions were left out of incremental responses (the client counts them as implied).
        assert implied and max(implied) >= 90, implied[:20]
        assert not [ln for ln in lines if "unable to process the fetch request" in ln or "closing session" in ln]
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        gauges = {ln.split(" ")[0]: float(ln.split(" ")[1]) for ln in text.splitlines()
                  if ln.startswith("kafka_server_fetchsessioncache_")}
        assert gauges["kafka_server_fetchsessioncache_incrementalfetchsessionevictions_total"] == 0
        # The consumer's close sent epoch -1 for its session (KafkaConsumer.close closes fetch sessions).
        assert gauges["kafka_server_fetchsessioncache_numincrementalfetchsessions"] == 0
        assert gauges["kafka_server_fetchsessioncache_numincrementalfetchpartitionscached"] == 0
        assert "Traceback" not in b.read_log()
    finally:
        b.stop()

"""The page-view job through Spark's own Kafka connector against real kbroker processes: the same windows as the
Python data source and as an independent model, restarts from the checkpoint, a broker kill -9 mid-stream, and a
three-broker ZooKeeper cluster (replication factor 3) losing a broker while the job runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.2")
pytest.importorskip("pyarrow")

from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from kbroker.spark_jobs import pageviews  # noqa: E402

from tests.broker_process import BrokerProcess, wait_all_registered  # noqa: E402
from tests.spark_jobs.conftest import connector_coordinates, create_topic, produce  # noqa: E402
from tests.spark_jobs.test_pageviews import ev, model, output_windows  # noqa: E402
from tests.zookeeper import ZooKeeperServer, zookeeper_missing  # noqa: E402

PAGES = ["/home", "/cart", "/item/1", "/item/2"]
ROOT = Path(__file__).resolve().parents[2]


def traffic(start_s: int, seconds: int, step: float = 1.7) -> list[str]:
    """Events in event-time order (none late, so the closed windows do not depend on how batches split them)."""
    return [ev(start_s + i * step, PAGES[i % 4], f"u{i % 7}") for i in range(int(seconds / step))]


def run(spark: Any, bootstrap: str, tin: str, tout: str, ckpt: Path, source: str) -> Any:
    c = pageviews.JobConfig(bootstrap, tin, tout, str(ckpt), source=source)
    return pageviews.run(spark, c, timeout=180)


def wait_for(pred: Callable[[], bool], timeout: float, what: str, query: Any) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert query.exception() is None, str(query.exception())[:3000]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)


def test_connector_and_python_source_give_the_same_windows_and_restart(
    kafka_spark, broker, admin, topic_name, tmp_path
) -> None:
    tin = create_topic(admin, topic_name + "-in", partitions=2)
    outs = {s: create_topic(admin, f"{topic_name}-out-{s}") for s in ("kafka", "python")}
    run1 = [ev(s * 7.3 % 240, PAGES[s % 3], f"u{s % 5}") for s in range(80)] + [ev(245, "/home"), "not json"]
    produce(broker.bootstrap, tin, run1[0::2], partition=0)
    produce(broker.bootstrap, tin, run1[1::2], partition=1)
    for source, tout in outs.items():
        q = run(kafka_spark, broker.bootstrap, tin, tout, tmp_path / source, source)
        assert sum(p["numInputRows"] for p in q.recentProgress) == len(run1)
    want1 = model([[run1]])
    assert want1
    assert (
        output_windows(broker.bootstrap, outs["kafka"])
        == output_windows(broker.bootstrap, outs["python"])
        == want1
    )

    # Late events (dropped), events for the open window, and newer ones that close more windows.
    run2 = [ev(10, "/home"), ev(150, "/cart"), ev(200, "/item/1"), ev(235, "/cart")]
    run2 += [ev(250 + i * 20, PAGES[i % 4]) for i in range(10)] + [ev(500, "/home")]
    produce(broker.bootstrap, tin, run2[0::2], partition=0)
    produce(broker.bootstrap, tin, run2[1::2], partition=1)
    for source, tout in outs.items():
        q = run(kafka_spark, broker.bootstrap, tin, tout, tmp_path / source, source)
        # From the checkpoint: only the new records are read.
        assert sum(p["numInputRows"] for p in q.recentProgress) == len(run2), source
    want2 = model([[run1], [run2]])
    assert len(want2) > len(want1)
    assert (
        output_windows(broker.bootstrap, outs["kafka"])
        == output_windows(broker.bootstrap, outs["python"])
        == want2
    )


def test_cli_auto_picks_the_connector_and_prints_a_summary(broker, admin, topic_name, tmp_path) -> None:
    """The documented command in its own process: --source auto resolves the connector from the cache and uses it."""
    if connector_coordinates() is None:
        pytest.skip("Spark's Kafka connector is unavailable: see the spark fixture's reason")
    tin, tout = create_topic(admin, topic_name + "-in"), create_topic(admin, topic_name + "-out")
    events = traffic(0, 200)
    produce(broker.bootstrap, tin, events)
    args = [sys.executable, "-m", "kbroker.spark_jobs.pageviews", "--bootstrap-servers", broker.bootstrap]
    args += ["--input-topic", tin, "--output-topic", tout, "--checkpoint", str(tmp_path / "ckpt")]
    args += ["--source", "auto", "--shuffle-partitions", "2", "--master", "local[2]"]
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "auto chose Spark's Kafka connector" in proc.stderr
    want = model([[events]])
    summary = proc.stdout.strip().splitlines()[-1]
    assert summary.startswith(f"pageviews: done: {len(events)} events in "), summary
    assert f"{len(want)} windows written (connector)" in summary, summary
    assert output_windows(broker.bootstrap, tout) == want


def test_broker_kill9_mid_stream_loses_and_duplicates_nothing(kafka_spark, tmp_path) -> None:
    """The broker is killed (SIGKILL) while the query runs and restarted on the same port and data: the connector's
    consumer and producer retry, and the output (read read_committed, confluent-kafka's default) holds every
    window once with the right count."""
    b = BrokerProcess(tmp_path / "broker").start()
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        tin, tout = create_topic(admin, "kill-in", partitions=2), create_topic(admin, "kill-out")
        part1, part2 = traffic(0, 300), traffic(300, 300)
        produce(b.bootstrap, tin, part1)
        # Whole batches: split by maxOffsetsPerTrigger, a partition that falls behind the other by more than the
        # watermark (a loaded machine, a broker restart) has its events dropped as late, as Spark must.
        c = pageviews.JobConfig(b.bootstrap, tin, tout, str(tmp_path / "ckpt"), trigger="1", source="kafka")
        q = pageviews.start_query(kafka_spark, c)
        try:
            # Any batch with rows: with whole batches the one after it is empty, and lastProgress would show that.
            wait_for(lambda: any(p["numInputRows"] for p in q.recentProgress), 60, "a first batch", q)
            b.kill()
            time.sleep(2)
            b.start()
            produce(b.bootstrap, tin, part2)
            want = model([[part1 + part2]])
            wait_for(lambda: output_windows(b.bootstrap, tout) == want, 150, "every window with its count", q)
            time.sleep(3)  # anything duplicated would arrive now
            assert output_windows(b.bootstrap, tout) == want
            assert q.isActive and q.exception() is None
        finally:
            q.stop()
    finally:
        b.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    if (why := zookeeper_missing()) is not None:
        pytest.skip(why)
    zk = ZooKeeperServer(tmp_path / "zk").start()
    conf = {"zookeeper.connect": zk.connect, "default.replication.factor": "3", "min.insync.replicas": "2"}
    brokers = [BrokerProcess(tmp_path / f"b{i}", {**conf, "broker.id": str(i)}) for i in (1, 2, 3)]
    try:
        for b in brokers:
            b.start()
        wait_all_registered(brokers)
        yield brokers
    finally:
        for b in brokers:
            b.kill()
        zk.stop()


def test_three_brokers_rf3_job_keeps_running_through_a_broker_kill9(kafka_spark, cluster, tmp_path) -> None:
    bootstrap = ",".join(b.bootstrap for b in cluster)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [NewTopic("rf3-in", 2, 3), NewTopic("rf3-out", 1, 3)]
    for f in admin.create_topics(topics, operation_timeout=15).values():
        f.result(30)
    for t in ("rf3-in", "rf3-out"):
        wait_for_partitions(admin, t)
    part1, part2 = traffic(0, 240), traffic(240, 240)
    produce(bootstrap, "rf3-in", part1)
    c = pageviews.JobConfig(
        bootstrap, "rf3-in", "rf3-out", str(tmp_path / "ckpt"), trigger="1", source="kafka"
    )
    q = pageviews.start_query(kafka_spark, c)
    try:
        want1 = model([[part1]])
        wait_for(lambda: output_windows(bootstrap, "rf3-out") == want1, 90, "the first windows", q)
        leader = admin.list_topics("rf3-out", timeout=10).topics["rf3-out"].partitions[0].leader
        victim = next(b for b in cluster if b.overrides["broker.id"] == str(leader))
        victim.kill()
        produce(bootstrap, "rf3-in", part2)
        want = model([[part1 + part2]])
        wait_for(lambda: len(output_windows(bootstrap, "rf3-out")) >= len(want), 150, "every window", q)
        time.sleep(3)
        assert output_windows(bootstrap, "rf3-out") == want
        assert q.isActive and q.exception() is None
    finally:
        q.stop()


def wait_for_partitions(admin: AdminClient, topic: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        tm = admin.list_topics(topic, timeout=10).topics.get(topic)
        if (
            tm
            and tm.error is None
            and tm.partitions
            and all(len(p.isrs) == 3 for p in tm.partitions.values())
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"{topic}: not fully replicated")

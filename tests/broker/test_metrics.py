"""metrics.port: scrape the Prometheus endpoint around a produce / consume run with real clients and check that the
counters move by exactly what the clients did; the Grafana dashboard in configs/ only uses exposed metrics."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker_process import ROOT, BrokerProcess, free_port, wait_for_port
from tests.clients import wait_until

prometheus_parser = pytest.importorskip("prometheus_client.parser")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def metrics_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, int]]:
    port = free_port()
    b = BrokerProcess(tmp_path_factory.mktemp("metrics"), {
        # metrics.host unset: the endpoint takes the listener's host (127.0.0.1), not every interface.
        "metrics.port": str(port), "log.flush.interval.messages": "1",
        "offsets.topic.num.partitions": "1"})
    b.start()
    wait_for_port(port)
    yield b, port
    b.stop()


def scrape(port: int) -> Samples:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: Samples = {}
    for fam in prometheus_parser.text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def exposed_names(port: int) -> set[str]:
    """Every sample name the endpoint can produce, from its # TYPE lines (families may have no samples yet)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    suffixes = {"counter": ["_total"], "gauge": [""], "histogram": ["_bucket", "_sum", "_count"],
                "summary": ["", "_sum", "_count"]}
    out = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        base = name.removesuffix("_total") if kind == "counter" else name
        out |= {base + s for s in suffixes.get(kind, [""])}
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: Samples, name: str, **match: str) -> float:
    return sum(v for (n, labels), v in samples.items()
               if n == name and all(dict(labels).get(k) == x for k, x in match.items()))


def test_counters_follow_a_produce_consume_run(metrics_broker):
    b, port = metrics_broker
    topic, n = "metered", 300
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(15)
    before = scrape(port)
    assert value(before, "kafka_server_brokertopicmetrics_messagesin_total", topic=topic) == 0
    assert value(before, "kafka_server_replicamanager_underreplicatedpartitions") == 0
    assert value(before, "kafka_controller_kafkacontroller_offlinepartitionscount") == 0

    p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, key=str(i).encode(), value=b"x" * (i % 50))
    assert p.flush(30) == 0
    mid = scrape(port)
    assert value(mid, "kafka_server_brokertopicmetrics_messagesin_total", topic=topic) == n
    # Batches are stored as produced, so the bytes in are exactly what the partitions' logs grew by.
    log_bytes = total(mid, "kafka_log_log_size", topic=topic)
    assert log_bytes > 0
    assert value(mid, "kafka_server_brokertopicmetrics_bytesin_total", topic=topic) == log_bytes
    assert sum(value(mid, "kafka_log_log_logendoffset", topic=topic, partition=str(q)) for q in range(3)) == n
    assert all(value(mid, "kafka_log_log_numlogsegments", topic=topic, partition=str(q)) == 1 for q in range(3))
    assert value(mid, "kafka_server_replicamanager_produceridcount") >= 1
    produces = value(mid, "kafka_network_requestmetrics_requests_total", request="Produce") - \
        value(before, "kafka_network_requestmetrics_requests_total", request="Produce")
    assert produces >= 1
    assert value(mid, "kafka_network_requestmetrics_totaltimems_count", request="Produce") == \
        value(mid, "kafka_network_requestmetrics_requests_total", request="Produce")
    assert value(mid, "kafka_network_requestmetrics_totaltimems_bucket", request="Produce", le="+Inf") == \
        value(mid, "kafka_network_requestmetrics_totaltimems_count", request="Produce")
    # log.flush.interval.messages=1: every produce was fsynced before it was acknowledged.
    assert value(mid, "kafka_log_logflushstats_logflushrateandtimems_count") - \
        value(before, "kafka_log_logflushstats_logflushrateandtimems_count") >= produces

    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "metered-group", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    got = 0
    try:
        def consumed_all() -> bool:
            nonlocal got
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got += 1
            return got == n

        wait_until(consumed_all, timeout=60, interval=0, what=f"{n} records")
        c.commit(asynchronous=False)
        during = scrape(port)
        assert total(during, "kafka_server_socket_server_metrics_connection_count", listener="PLAINTEXT") >= 2
        assert value(during, "kafka_server_brokertopicmetrics_bytesout_total", topic=topic) >= log_bytes
        assert value(during, "kafka_network_requestmetrics_requests_total", request="Fetch") >= 1
        assert total(during, "kafka_consumergroup_current_offset", consumergroup="metered-group") == n
        assert total(during, "kafka_consumergroup_lag", consumergroup="metered-group") == 0

        for i in range(10):
            p.produce(topic, value=b"late", partition=i % 3)
        assert p.flush(30) == 0
        after = scrape(port)
        assert value(after, "kafka_server_brokertopicmetrics_messagesin_total", topic=topic) == n + 10
        assert total(after, "kafka_consumergroup_lag", consumergroup="metered-group") == 10
        assert all(value(after, "kafka_consumergroup_lag", consumergroup="metered-group", topic=topic,
                         partition=str(q)) in (3, 4) for q in range(3))
    finally:
        c.close()
    idle = value(after, "kafka_network_socketserver_networkprocessoravgidlepercent")
    assert 0 <= idle <= 1
    assert value(after, "kafka_network_requestchannel_requestqueuesize") >= 0


def test_grafana_dashboard_reads_exposed_metrics(metrics_broker):
    b, port = metrics_broker
    dashboard = json.loads((ROOT / "configs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert len(exprs) >= 10
    used = {m for e in exprs for m in re.findall(r"\b((?:kafka|process|python)_[a-z_]+)\b", e)}
    exposed = exposed_names(port)
    missing = sorted(m for m in used if m not in exposed)
    assert not missing, f"the dashboard queries metrics the broker does not expose: {missing}"
    for needed in ("kafka_server_brokertopicmetrics_messagesin_total", "kafka_consumergroup_lag",
                   "kafka_network_requestmetrics_totaltimems_bucket", "kafka_log_log_size",
                   "kafka_network_requestmetrics_totaltimems", "kafka_controller_kafkacontroller_activecontrollercount",
                   "process_resident_memory_bytes"):
        assert needed in used


def test_health_metrics_of_a_single_node(metrics_broker):
    """What standard Kafka alerts and JMX-exporter dashboards read: the controller count, leaders, ISR health,
    failed requests, queue time, latency percentiles, and the process itself."""
    b, port = metrics_broker
    assert f"Serving Prometheus metrics on http://127.0.0.1:{port}/metrics" in b.read_log()
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic("health", 2, 1)])["health"].result(15)
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
    for i in range(50):
        p.produce("health", value=b"v", partition=i % 2)
        p.poll(0)
    assert p.flush(30) == 0
    # A produce the broker refuses counts as a failed produce of its topic (no batch: INVALID_RECORD, which Kafka
    # checks before the acks=2 it would refuse next).
    from kbroker.protocol.messages import ProduceRequest as P

    from kbroker_tools.wire import WireClient

    refused = P(transactional_id=None, acks=2, timeout_ms=1000, topic_data=[P.TopicProduceData(
        name="health", partition_data=[P.PartitionProduceData(index=0, records=b"")])])
    # A valid batch with acks=2 takes the direct Produce path (broker/produce_codec.py), which counts it too.
    from kbroker.protocol.records import build_batch

    bad_acks = P(transactional_id=None, acks=2, timeout_ms=1000, topic_data=[P.TopicProduceData(
        name="health", partition_data=[P.PartitionProduceData(index=0, records=build_batch([(None, b"v", (), 0)]))])])
    with WireClient(b.bootstrap) as c:
        assert c.request(0, 9, refused).responses[0].partition_responses[0].error_code == 87
        assert c.request(0, 9, bad_acks).responses[0].partition_responses[0].error_code == 21
    s = scrape(port)
    # sum(activecontrollercount) == 1: the single node is its own controller
    assert value(s, "kafka_controller_kafkacontroller_activecontrollercount") == 1
    assert value(s, "kafka_server_replicamanager_leadercount") == \
        value(s, "kafka_server_replicamanager_partitioncount") >= 2
    assert value(s, "kafka_server_replicamanager_underminisrpartitioncount") == 0
    assert ("kafka_server_replicamanager_isrshrinks_total", ()) in s
    assert ("kafka_server_replicamanager_isrexpands_total", ()) in s
    assert value(s, "kafka_server_brokertopicmetrics_failedproducerequests_total", topic="health") == 2
    assert ("kafka_server_brokertopicmetrics_failedfetchrequests_total", (("topic", "health"),)) in s
    # RequestQueueTimeMs counts every request once (those not queued behind another in its first bucket)
    assert value(s, "kafka_network_requestmetrics_requestqueuetimems_count", request="Produce") == \
        value(s, "kafka_network_requestmetrics_requests_total", request="Produce")
    # The JMX exporter's percentile series beside the histogram's buckets, _sum and _count
    q = {x: value(s, "kafka_network_requestmetrics_totaltimems", request="Produce", quantile=x)
         for x in ("0.50", "0.75", "0.95", "0.98", "0.99", "0.999")}
    assert 0 < q["0.50"] <= q["0.75"] <= q["0.95"] <= q["0.98"] <= q["0.99"] <= q["0.999"] <= 30000, q
    assert value(s, "kafka_network_requestmetrics_totaltimems_bucket", request="Produce", le="+Inf") == \
        value(s, "kafka_network_requestmetrics_totaltimems_count", request="Produce") >= 2
    # The process collectors
    assert value(s, "process_resident_memory_bytes") > 10_000_000
    assert value(s, "process_open_fds") > 0
    assert value(s, "process_cpu_seconds_total") > 0
    assert total(s, "python_gc_collections_total") > 0


def test_metrics_port_is_off_by_default(broker):
    from kbroker.broker.config import KEYS

    assert KEYS["metrics.port"].default is None
    assert "Serving Prometheus metrics" not in broker.read_log()

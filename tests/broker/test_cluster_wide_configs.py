"""Cluster-wide dynamic broker configs (the default BROKER resource, `kafka-configs --entity-type brokers
--entity-default`): min.insync.replicas and the other keys Kafka changes at runtime take effect without a restart,
a topic override still wins, and deleting the default restores the static value.

Clients: Apache Kafka 3.9's own kafka-configs tool (kafka.admin.ConfigCommand, from the Maven cache), kafka-python's
protocol classes, raw frames, and confluent-kafka producers. The ZooKeeper cluster case (set through one broker,
in force on the others) is in tests/coordinator/test_replication_data.py.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin.configs import DescribeConfigsRequest, IncrementalAlterConfigsRequest
from kbroker.protocol import messages as M
from kbroker.protocol.errors import ErrorCode

from tests.clients import KpRaw, RawClient, wait_until

BROKER = 4
DYNAMIC_DEFAULT_BROKER_CONFIG = 3


@pytest.fixture(scope="module")
def kafka_tools_classpath() -> str:
    if shutil.which("java") is None:
        pytest.skip("no java on PATH: Kafka's kafka-configs tool cannot run")
    from bench.peers.kafka import ArtifactUnavailable, classpath

    try:
        return classpath("3.9")
    except ArtifactUnavailable as e:
        pytest.skip(f"Apache Kafka 3.9's jars cannot be fetched here: {e}")


def kafka_configs(cp: str, bootstrap: str, *args: str) -> str:
    """Kafka 3.9's kafka-configs.sh on the cluster-wide default broker resource; its standard output."""
    cmd = [
        "java",
        "-cp",
        cp,
        "kafka.admin.ConfigCommand",
        "--bootstrap-server",
        bootstrap,
        "--entity-type",
        "brokers",
        "--entity-default",
        *args,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r.stdout


def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept referenced until the answer: librdkafka
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)


def acks_all_error(bootstrap: str, topic: str) -> KafkaError | None:
    """One record with acks=all through librdkafka: the delivery error, None when it was written."""
    result: list[KafkaError | None] = []
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "message.timeout.ms": 4000,
            "retries": 0,
            "enable.idempotence": False,
        }
    )
    p.produce(topic, b"v", partition=0, on_delivery=lambda err, _m: result.append(err))
    p.flush(15)
    assert len(result) == 1
    return result[0]


def topic_min_insync(bootstrap: str, topic: str) -> tuple[str, int]:
    """min.insync.replicas of a topic as DescribeConfigs (kafka-python) reports it: (value, config source)."""
    with KpRaw(bootstrap) as raw:
        resp = raw.send(
            DescribeConfigsRequest(resources=[(2, topic, ["min.insync.replicas"])], include_synonyms=False)
        )
    [r] = resp.results
    [c] = r.configs
    return c.value, c.config_source


def test_kafka_configs_sets_min_insync_replicas_cluster_wide(
    kafka_tools_classpath: str, broker: Any, topic_name: str
) -> None:
    create_topic(broker.bootstrap, topic_name)
    override = f"{topic_name}-override"
    create_topic(broker.bootstrap, override)
    with KpRaw(broker.bootstrap) as raw:
        resp = raw.send(
            IncrementalAlterConfigsRequest(
                resources=[(2, override, [("min.insync.replicas", 0, "1")])], validate_only=False
            )
        )
    assert resp.responses[0].error_code == 0
    assert acks_all_error(broker.bootstrap, topic_name) is None

    out = kafka_configs(
        kafka_tools_classpath, broker.bootstrap, "--alter", "--add-config", "min.insync.replicas=2"
    )
    assert "Completed updating default config for brokers in the cluster." in out
    try:
        described = kafka_configs(kafka_tools_classpath, broker.bootstrap, "--describe")
        assert (
            "min.insync.replicas=2 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:min.insync.replicas=2}"
            in described
        ), described
        # One broker in the ISR, two required: refused (Kafka's NOT_ENOUGH_REPLICAS), the override topic still takes.
        err = acks_all_error(broker.bootstrap, topic_name)
        assert err is not None and err.code() == KafkaError.NOT_ENOUGH_REPLICAS, err
        assert acks_all_error(broker.bootstrap, override) is None
        assert topic_min_insync(broker.bootstrap, topic_name) == ("2", DYNAMIC_DEFAULT_BROKER_CONFIG)
    finally:
        kafka_configs(
            kafka_tools_classpath, broker.bootstrap, "--alter", "--delete-config", "min.insync.replicas"
        )
    assert acks_all_error(broker.bootstrap, topic_name) is None
    assert topic_min_insync(broker.bootstrap, topic_name)[0] == "1"


def _alter_default(raw: RawClient, key: str, value: str | None) -> int:
    op = 0 if value is not None else 1  # SET / DELETE
    req = M.IncrementalAlterConfigsRequest(
        resources=[
            M.IncrementalAlterConfigsRequest.AlterConfigsResource(
                resource_type=BROKER,
                resource_name="",
                configs=[
                    M.IncrementalAlterConfigsRequest.AlterableConfig(
                        name=key, config_operation=op, value=value
                    )
                ],
            )
        ]
    )
    [res] = raw.request(44, 1, req).responses
    return res.error_code


def test_max_connections_per_ip_changes_at_runtime(broker: Any) -> None:
    """Raw frames: with max.connections.per.ip set to 1 cluster-wide, a second connection from 127.0.0.1 is closed
    at once while the first keeps working; deleting the default lets it in again."""
    with RawClient(broker.bootstrap) as held:
        assert _alter_default(held, "max.connections.per.ip", "1") == ErrorCode.NONE
        try:

            def refused() -> bool:
                with RawClient(broker.bootstrap) as second:
                    return second.closed_by_peer(2)

            wait_until(refused, timeout=20, what="a second connection refused")
        finally:
            assert _alter_default(held, "max.connections.per.ip", None) == ErrorCode.NONE
    with RawClient(broker.bootstrap) as first, RawClient(broker.bootstrap) as second:
        for raw in (first, second):
            assert (
                raw.request(
                    18, 3, M.ApiVersionsRequest(client_software_name="t", client_software_version="1")
                ).error_code
                == ErrorCode.NONE
            )


@pytest.mark.parametrize(
    "key,value",
    [
        ("producer.id.expiration.ms", "3600000"),
        ("log.cleaner.backoff.ms", "5000"),
        ("unclean.leader.election.enable", "true"),
        ("transaction.partition.verification.enable", "false"),
    ],
)
def test_other_runtime_keys_accepted_and_described(broker: Any, key: str, value: str) -> None:
    with RawClient(broker.bootstrap) as raw:
        assert _alter_default(raw, key, value) == ErrorCode.NONE
        try:
            req = M.DescribeConfigsRequest(
                resources=[
                    M.DescribeConfigsRequest.DescribeConfigsResource(
                        resource_type=BROKER, resource_name=str(0), configuration_keys=[key]
                    )
                ]
            )
            [r] = raw.request(32, 4, req).results
            assert [(c.name, c.value, c.config_source) for c in r.configs] == [
                (key, value, DYNAMIC_DEFAULT_BROKER_CONFIG)
            ]
        finally:
            assert _alter_default(raw, key, None) == ErrorCode.NONE

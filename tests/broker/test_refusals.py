"""Refused requests leave one INFO line in the broker log with the client id, the API and the reason, and a client
repeating the same refusal cannot flood the log.

Clients: confluent-kafka's AdminClient, kafka-python's KafkaAdminClient and protocol classes, raw frames.
"""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from kafka import KafkaAdminClient
from kafka.admin import AlterConfigOp
from kafka.admin import ConfigResource as KConfigResource
from kafka.admin import ConfigResourceType as KType
from kbroker.broker.refusals import RefusalLog
from kbroker.protocol.errors import ErrorCode

from tests.clients import RawClient, wait_until

T = 15


def refusal_lines(broker, needle: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [ln for ln in broker.read_log().splitlines() if "Refused" in ln and needle in ln]


def test_invalid_config_is_logged_once_per_interval_confluent(broker, topic_name):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "client.id": "refusal-ck"})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(T)
    res = ConfigResource("topic", topic_name, incremental_configs=[
        ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET)])
    for _ in range(20):
        with pytest.raises(KafkaException):
            next(iter(admin.incremental_alter_configs([res]).values())).result(T)
    lines = wait_until(lambda: refusal_lines(broker, "'refusal-ck'"), what="the refusal in the broker log")
    assert len(lines) == 1, lines
    [line] = lines
    assert " INFO " in line or "INFO" in line
    assert "IncrementalAlterConfigs" in line and "INVALID_CONFIG" in line and "retention.ms" in line
    assert f"topic '{topic_name}'" in line


def test_invalid_config_and_unknown_resource_type_kafka_python(broker, topic_name):
    from kafka.protocol.admin.configs import DescribeConfigsRequest

    from tests.clients import KpRaw

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="refusal-kp", request_timeout_ms=10000)
    try:
        admin.create_topics({topic_name: {"num_partitions": 1, "replication_factor": 1}})
        r = admin.alter_configs([KConfigResource(KType.TOPIC, topic_name, {
            "compression.type": (AlterConfigOp.SET, "brotli")})], incremental=True)
        assert "InvalidConfiguration" in r["topic"][topic_name]
    finally:
        admin.close()
    line = wait_until(lambda: refusal_lines(broker, "'refusal-kp'"), what="kafka-python's refusal")[0]
    assert "IncrementalAlterConfigs" in line and "compression.type" in line and "INVALID_CONFIG" in line
    # A resource type kbroker does not serve (CLIENT_METRICS, 16): INVALID_REQUEST, logged.
    with KpRaw(broker.bootstrap) as raw:
        resp = raw.send(DescribeConfigsRequest(resources=[(16, "some-metrics", None)], include_synonyms=False))
    assert resp.results[0].error_code == ErrorCode.INVALID_REQUEST
    line = wait_until(lambda: refusal_lines(broker, "resource type 16"), what="the unknown resource type")[0]
    assert "DescribeConfigs" in line and "INVALID_REQUEST" in line and "Unsupported resource type" in line


def test_unsupported_version_logged_raw(broker):
    from kbroker.protocol.messages import ApiVersionsRequest, CreateDelegationTokenRequest

    with RawClient(broker.bootstrap) as raw:
        # Delegation tokens are not supported (and never advertised).
        raw.send_bytes(raw.frame(38, 1, CreateDelegationTokenRequest(renewers=[], max_lifetime_ms=-1),
                                 client_id="refusal-raw"))
        raw.recv_frame()
        # KIP-511: an ApiVersions version from the future gets the v0 answer, and a line.
        body = ApiVersionsRequest(client_software_name="future", client_software_version="9")
        frame = bytearray(raw.frame(18, 3, body, client_id="refusal-raw"))
        frame[6:8] = (9).to_bytes(2, "big")  # request_api_version
        raw.send_bytes(bytes(frame))
        raw.recv_frame()
    lines = wait_until(lambda: len(refusal_lines(broker, "'refusal-raw'")) >= 2 and
                       refusal_lines(broker, "'refusal-raw'"), what="both refusals")
    assert any("CreateDelegationToken v1" in ln and "UNSUPPORTED_VERSION" in ln and "not supported" in ln
               for ln in lines)
    assert any("ApiVersions v9" in ln and "UNSUPPORTED_VERSION" in ln and "0-4" in ln for ln in lines)


def test_rate_limit_counts_what_it_did_not_log(caplog):
    now = [0.0]
    refusals = RefusalLog(interval_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="kbroker.refusals"):
        assert refusals.refused("c", "1.2.3.4:5", "AlterConfigs v2", ErrorCode.INVALID_CONFIG, "bad")
        assert not any(refusals.refused("c", "1.2.3.4:5", "AlterConfigs v2", ErrorCode.INVALID_CONFIG, "bad")
                       for _ in range(7))
        # Another client, API or error is its own line.
        assert refusals.refused("d", "1.2.3.4:6", "AlterConfigs v2", ErrorCode.INVALID_CONFIG, "bad")
        assert refusals.refused("c", "1.2.3.4:5", "CreateTopics v7", ErrorCode.INVALID_CONFIG, "bad")
        # Errors of normal operation are not refusals.
        assert not refusals.refused("c", "1.2.3.4:5", "Fetch v12", ErrorCode.NOT_LEADER_OR_FOLLOWER, "moved")
        now[0] = 10.5
        assert refusals.refused("c", "1.2.3.4:5", "AlterConfigs v2", ErrorCode.INVALID_CONFIG, "bad")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4
    assert "7 more like it" in lines[-1]

"""Group configs (config resource type GROUP, 32; Kafka's GroupConfig for KIP-848 consumer groups) with
confluent-kafka's and kafka-python's admin clients and raw frames against a real kbroker process: describe with
sources and synonyms, set / delete / validate-only, Kafka's error codes, persistence across a restart, and a
lowered `consumer.session.timeout.ms` that fences a SIGKILLed confluent-kafka member in that time.

The Java AdminClient 3.9.1 has no ConfigResource.Type.GROUP (it arrived in kafka-clients 4.0), so it is not used.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    AlterConfigsRequest,
    ConsumerGroupDescribeRequest,
    ConsumerGroupHeartbeatRequest,
    DescribeConfigsRequest,
    IncrementalAlterConfigsRequest,
)

from tests.broker_process import BrokerProcess
from tests.clients import RawClient, wait_until
from tests.group_helpers import kip848_broker

SESSION, HEARTBEAT = "consumer.session.timeout.ms", "consumer.heartbeat.interval.ms"
OVERRIDES = kip848_broker()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("broker"), OVERRIDES)
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def ck_describe(a: AdminClient, group: str) -> dict[str, Any]:
    [f] = a.describe_configs([ConfigResource(ResourceType.GROUP, group)]).values()
    return f.result(10)  # type: ignore[no-any-return]


def ck_alter(a: AdminClient, group: str, *ops: tuple[str, str | None, AlterConfigOpType],
             validate_only: bool = False) -> None:
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=op) for name, value, op in ops])
    [f] = a.incremental_alter_configs([res], validate_only=validate_only).values()
    f.result(10)


def ck_alter_error(a: AdminClient, group: str, name: str, value: str) -> tuple[int, str]:
    with pytest.raises(KafkaException) as info:
        ck_alter(a, group, (name, value, AlterConfigOpType.SET))
    err = info.value.args[0]
    return err.code(), err.str()


def test_confluent_describe_set_delete(admin: AdminClient, topic_name: str) -> None:
    group = "g-" + topic_name
    d = ck_describe(admin, group)
    # The share.* keys (KIP-932) have tests of their own in tests/broker/share/.
    assert {k: (e.value, e.source) for k, e in d.items() if k.startswith("consumer.")} == {
        SESSION: ("6000", ConfigSource.STATIC_BROKER_CONFIG.value),
        HEARTBEAT: ("300", ConfigSource.STATIC_BROKER_CONFIG.value)}
    ck_alter(admin, group, (SESSION, "2000", AlterConfigOpType.SET))
    ck_alter(admin, group, (HEARTBEAT, "500", AlterConfigOpType.SET), validate_only=True)
    d = ck_describe(admin, group)
    assert (d[SESSION].value, d[SESSION].source, d[SESSION].is_default) == ("2000", ConfigSource.GROUP_CONFIG.value,
                                                                            False)
    # confluent-kafka keeps one synonym per name (the broker key's static value and default share theirs).
    assert SESSION in d[SESSION].synonyms and "group.consumer.session.timeout.ms" in d[SESSION].synonyms
    assert (d[HEARTBEAT].value, d[HEARTBEAT].source) == ("300", ConfigSource.STATIC_BROKER_CONFIG.value)
    ck_alter(admin, group, (SESSION, None, AlterConfigOpType.DELETE))
    assert ck_describe(admin, group)[SESSION].value == "6000"
    # Kafka's GroupConfig validation: names, INT values, the broker's group.consumer.min/max bounds.
    assert ck_alter_error(admin, group, "session.timeout.ms", "2000") == (
        ErrorCode.INVALID_CONFIG, "Unknown group config name: session.timeout.ms")
    assert ck_alter_error(admin, group, SESSION, "soon") == (
        ErrorCode.INVALID_CONFIG, f"Invalid value soon for configuration {SESSION}: Not a number of type INT")
    assert ck_alter_error(admin, group, SESSION, "999") == (
        ErrorCode.INVALID_CONFIG, f"{SESSION} must be greater than or equal to group.consumer.min.session.timeout.ms")
    assert ck_alter_error(admin, group, SESSION, "60001") == (
        ErrorCode.INVALID_CONFIG, f"{SESSION} must be less than or equal to group.consumer.max.session.timeout.ms")
    assert ck_alter_error(admin, group, HEARTBEAT, "15001") == (
        ErrorCode.INVALID_CONFIG, f"{HEARTBEAT} must be less than or equal to group.consumer.max.heartbeat.interval.ms")
    assert ck_alter_error(admin, group, HEARTBEAT, "0") == (
        ErrorCode.INVALID_CONFIG, f"Invalid value 0 for configuration {HEARTBEAT}: Value must be at least 1")


def test_kafka_python_incremental_and_legacy_alter(broker: BrokerProcess, topic_name: str) -> None:
    group = "kp-" + topic_name
    a = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        r = a.alter_configs([KpConfigResource(ConfigResourceType.GROUP, group, {SESSION: "3000", HEARTBEAT: "400"})],
                            incremental=True)
        assert r == {"group": {group: None}} or "Error" not in str(r), r
        d = a.describe_configs([KpConfigResource(ConfigResourceType.GROUP, group)], include_synonyms=True,
                               config_filter="all")["group"][group]
        assert (d[SESSION]["value"], d[SESSION]["config_source"], d[SESSION]["config_type"]) == (
            "3000", "DYNAMIC_GROUP_CONFIG", "INT")
        assert d[HEARTBEAT]["value"] == "400"
        assert [(x["name"], x["value"], x["source"]) for x in d[SESSION]["synonyms"]] == [
            (SESSION, "3000", "DYNAMIC_GROUP_CONFIG"), ("group.consumer.session.timeout.ms", "6000", "STATIC_BROKER_CONFIG"),
            ("group.consumer.session.timeout.ms", "45000", "DEFAULT_CONFIG")]
        # Legacy AlterConfigs (Kafka's KRaft brokers accept GROUP); kafka-python sends the other overrides along.
        a.alter_configs([KpConfigResource(ConfigResourceType.GROUP, group, {HEARTBEAT: "450"})], incremental=False,
                        raise_on_unknown=False)
        d = a.describe_configs([KpConfigResource(ConfigResourceType.GROUP, group)],
                               config_filter="all")["group"][group]
        assert {k: (v["value"], v["config_source"]) for k, v in d.items() if k.startswith("consumer.")} == {
            SESSION: ("3000", "DYNAMIC_GROUP_CONFIG"), HEARTBEAT: ("450", "DYNAMIC_GROUP_CONFIG")}
        r = a.alter_configs([KpConfigResource(ConfigResourceType.GROUP, group, {SESSION: "100"})], incremental=True)
        assert "InvalidConfigurationError" in str(r) and "group.consumer.min.session.timeout.ms" in str(r), r
    finally:
        a.close()


def raw_alter(raw: RawClient, group: str, *ops: tuple[str, str | None, int]) -> Any:
    R = IncrementalAlterConfigsRequest
    req = R(resources=[R.AlterConfigsResource(resource_type=32, resource_name=group, configs=[
        R.AlterableConfig(name=n, config_operation=op, value=v) for n, v, op in ops])], validate_only=False)
    return raw.request(44, 1, req).responses[0]


def test_raw_frames_documentation_and_request_errors(broker: BrokerProcess, topic_name: str) -> None:
    group = "raw-" + topic_name
    D = DescribeConfigsRequest
    with RawClient(broker.bootstrap) as raw:
        r = raw.request(32, 4, D(resources=[D.DescribeConfigsResource(resource_type=32, resource_name=group,
                                                                     configuration_keys=[SESSION])],
                                 include_synonyms=False, include_documentation=True)).results[0]
        assert r.error_code == 0 and [(c.name, c.value, c.config_type, c.read_only, c.documentation)
                                      for c in r.configs] == [
            (SESSION, "6000", 3, False, "The timeout to detect client failures when using the consumer group protocol.")]
        r = raw.request(32, 4, D(resources=[D.DescribeConfigsResource(resource_type=32, resource_name="",
                                                                     configuration_keys=None)])).results[0]
        assert (r.error_code, r.error_message) == (ErrorCode.INVALID_REQUEST, "Group name must not be empty")
        r = raw_alter(raw, "", (SESSION, "2000", 0))
        assert (r.error_code, r.error_message) == (ErrorCode.INVALID_REQUEST,
                                                   "Default group resources are not allowed.")
        r = raw_alter(raw, group, (SESSION, None, 0))
        assert (r.error_code, r.error_message) == (ErrorCode.INVALID_REQUEST, f"Null value not supported for : {SESSION}")
        r = raw_alter(raw, group, (SESSION, "2000", 0), (SESSION, "3000", 0))
        assert (r.error_code, r.error_message) == (ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys")
        r = raw_alter(raw, group, (SESSION, "2000", 2))
        assert (r.error_code, r.error_message) == (
            ErrorCode.INVALID_CONFIG, f"Can't APPEND to key {SESSION} because its type is not LIST.")
        assert raw_alter(raw, group, (SESSION, "2500", 0)).error_code == 0
        # Legacy AlterConfigs replaces the group's whole set of overrides.
        A = AlterConfigsRequest
        assert raw.request(33, 2, A(resources=[A.AlterConfigsResource(resource_type=32, resource_name=group, configs=[
            A.AlterableConfig(name=HEARTBEAT, value="350")])], validate_only=False)).responses[0].error_code == 0
        r = raw.request(32, 4, D(resources=[D.DescribeConfigsResource(resource_type=32, resource_name=group,
                                                                     configuration_keys=None)])).results[0]
        assert sorted((c.name, c.value, c.config_source) for c in r.configs if c.name.startswith("consumer.")) == [
                                                                                 (HEARTBEAT, "350", 8),
                                                                                 (SESSION, "6000", 4)]


def test_group_configs_survive_a_restart(broker: BrokerProcess, admin: AdminClient, topic_name: str) -> None:
    group = "restart-" + topic_name
    ck_alter(admin, group, (HEARTBEAT, "700", AlterConfigOpType.SET))
    broker.restart()
    a = AdminClient({"bootstrap.servers": broker.bootstrap})
    d = ck_describe(a, group)
    assert (d[HEARTBEAT].value, d[HEARTBEAT].source) == ("700", ConfigSource.GROUP_CONFIG.value)


MEMBER = """
import sys
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "group.protocol": "consumer",
              "auto.offset.reset": "earliest"})
c.subscribe([sys.argv[3]])
announced = False
while True:
    c.poll(0.1)
    if c.assignment() and not announced:
        print("ASSIGNED", flush=True)
        announced = True
"""


def members(raw: RawClient, group: str) -> list[Any]:
    d = raw.request(69, 0, ConsumerGroupDescribeRequest(group_ids=[group])).groups[0]
    return list(d.members)


def test_lowered_session_timeout_fences_a_dead_member_in_that_time(broker: BrokerProcess, admin: AdminClient,
                                                                   topic_name: str) -> None:
    admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(30)
    group = "fence-" + topic_name
    child = subprocess.Popen([sys.executable, "-c", MEMBER, broker.bootstrap, group, topic_name],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ASSIGNED"
        # It joined under the broker's 6 s session; the lowered timeout applies from its next heartbeat (300 ms).
        ck_alter(admin, group, (SESSION, "1500", AlterConfigOpType.SET), (HEARTBEAT, "250", AlterConfigOpType.SET))
        time.sleep(0.8)
        with RawClient(broker.bootstrap) as raw:
            assert len(members(raw, group)) == 1
            child.send_signal(signal.SIGKILL)
            child.wait(10)
            killed = time.monotonic()
            wait_until(lambda: not members(raw, group), timeout=10, what="the dead member fenced")
            took = time.monotonic() - killed
            # The broker's own 6 s would be far later.
            assert took < 3.5, took
            # New heartbeats are told the group's interval.
            j = raw.request(68, 0, ConsumerGroupHeartbeatRequest(
                group_id=group, member_id="", member_epoch=0, rebalance_timeout_ms=5000,
                subscribed_topic_names=[topic_name], topic_partitions=[]))
            assert (j.error_code, j.heartbeat_interval_ms) == (0, 250)
        assert "fenced: session timeout (1500 ms)" in broker.read_log()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)

"""KIP-714 client telemetry: kbroker answers as Apache Kafka does without a metrics plugin (GetTelemetrySubscriptions
and PushTelemetry not advertised), so clients that push metrics by default stay quiet and lose nothing.

Clients: raw frames, confluent-kafka (librdkafka 2.5+ pushes metrics when a broker offers it); the Java client 3.9
(enable.metrics.push defaults to true) is checked in tests/java/test_java_client.py.
"""

from __future__ import annotations

import logging
from typing import Any

from kbroker.protocol.messages import ApiVersionsRequest

from tests.clients import Msg, RawClient, ck_consume, ck_produce

GET_TELEMETRY_SUBSCRIPTIONS, PUSH_TELEMETRY = 71, 72


def test_telemetry_apis_not_advertised_in_any_api_versions_version(broker: Any) -> None:
    for version in (0, 3):
        body = ApiVersionsRequest(client_software_name="telemetry-test", client_software_version="1")
        with RawClient(broker.bootstrap) as raw:
            resp = raw.request(18, version, body)
        assert resp.error_code == 0
        keys = {k.api_key for k in resp.api_keys}
        assert 0 in keys and 1 in keys, keys  # the answer is a real list, not an empty one
        assert not keys & {GET_TELEMETRY_SUBSCRIPTIONS, PUSH_TELEMETRY}, (version, sorted(keys))


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_librdkafka_pushing_metrics_by_default_logs_nothing_and_loses_nothing(
    broker: Any, topic_name: str
) -> None:
    handler = _Collect()
    log = logging.getLogger(f"rdkafka.{topic_name}")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    conf = {"enable.metrics.push": True, "debug": "telemetry,feature", "logger": log}
    try:
        msgs = [Msg(None, f"v{i}".encode(), partition=0) for i in range(50)]
        ck_produce(broker.bootstrap, topic_name, msgs, **conf)
        recs = ck_consume(broker.bootstrap, topic_name, [0], len(msgs), **conf)
    finally:
        log.removeHandler(handler)
    assert [r.value for r in recs] == [m.value for m in msgs]
    # librdkafka said which features it enabled from our ApiVersions (the debug log reached us) ...
    assert any("protocol features" in r.getMessage() for r in handler.records), handler.records[:5]
    # ... and nothing of its telemetry, and nothing at all, rose to a warning.
    loud = [r.getMessage() for r in handler.records if r.levelno >= logging.WARNING]
    assert not loud, loud
    broker_log = broker.read_log().splitlines()
    assert not [ln for ln in broker_log if "Telemetry" in ln], [ln for ln in broker_log if "Telemetry" in ln]

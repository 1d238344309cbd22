"""Several listeners: Metadata answers with the endpoints of the listener a request arrived on (as Kafka)."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient

from tests.broker_process import BrokerProcess, free_port


def test_metadata_uses_the_listener_of_the_request(tmp_path: Path) -> None:
    internal, external = free_port(), free_port()
    b = BrokerProcess(tmp_path, {
        "listeners": f"INTERNAL://127.0.0.1:{internal},EXTERNAL://127.0.0.1:{external}",
        "advertised.listeners": f"INTERNAL://127.0.0.1:{internal},EXTERNAL://127.0.0.1:{external}",
        "listener.security.protocol.map": "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT",
    }, port=internal)
    b.start()
    try:
        for port in (internal, external):
            md = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=10)
            assert [(x.host, x.port) for x in md.brokers.values()] == [("127.0.0.1", port)]
            kp = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}")
            try:
                nodes = kp.describe_cluster()["brokers"]
            finally:
                kp.close()
            assert [(n["host"], n["port"]) for n in nodes] == [("127.0.0.1", port)]
    finally:
        b.stop()


def test_listener_without_a_security_protocol_stops_startup(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path, {"listeners": f"OUTSIDE://127.0.0.1:{free_port()}"})
    try:
        b.start(timeout=10)
    except RuntimeError as e:
        assert "listener.security.protocol.map" in str(e)
    else:
        b.stop()
        raise AssertionError("a listener with no security protocol was accepted")

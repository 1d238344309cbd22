"""The registry on a broker with only a SASL_SSL listener: https with the broker's certificate, HTTP basic auth
against the broker's SASL users, the registry's own Kafka connections signed in as the broker; confluent-kafka's
client and serializer with basic.auth.user.info and a CA."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.broker_process import BrokerProcess, free_port
from tests.schema_registry.registry_http import wait_for_port
from tests.security_setup import PLAIN_USERS, make_pki, plain_jaas

SCHEMA = json.dumps({"type": "record", "name": "Secret", "fields": [{"name": "x", "type": "int"}]})


def test_https_and_basic_auth_with_the_brokers_sasl_users(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    kafka_port, http_port = free_port(), free_port()
    b = BrokerProcess(
        tmp_path / "broker",
        {
            "listeners": f"SASL_SSL://127.0.0.1:{kafka_port}",
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL",
            "inter.broker.listener.name": "SASL_SSL",
            "sasl.enabled.mechanisms": "PLAIN",
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": plain_jaas(PLAIN_USERS),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(pki.broker_keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(pki.ca),
            "schema.registry.listeners": f"https://127.0.0.1:{http_port}",
        },
        port=kafka_port,
    ).start()
    try:
        wait_for_port(http_port)
        url = f"https://127.0.0.1:{http_port}"
        context = ssl.create_default_context(cafile=str(pki.ca))

        def status(user: str | None, password: str = "") -> tuple[int, dict]:
            req = urllib.request.Request(url + "/subjects")
            if user is not None:
                req.add_header(
                    "Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
                )
            try:
                with urllib.request.urlopen(req, timeout=30, context=context) as resp:
                    return resp.status, json.loads(resp.read())
            except urllib.error.HTTPError as e:
                assert e.headers["WWW-Authenticate"] == 'Basic realm="SchemaRegistry"'
                return e.code, json.loads(e.read())

        assert status(None) == (401, {"error_code": 401, "message": "Unauthorized"})
        assert status("alice", "wrong")[0] == 401
        assert status("nobody", "x")[0] == 401
        assert status("alice", PLAIN_USERS["alice"]) == (200, [])

        client = SchemaRegistryClient(
            {"url": url, "ssl.ca.location": str(pki.ca), "basic.auth.user.info": f"bob:{PLAIN_USERS['bob']}"}
        )
        serialize = AvroSerializer(client, SCHEMA)
        p = Producer(
            {
                "bootstrap.servers": f"127.0.0.1:{kafka_port}",
                "security.protocol": "SASL_SSL",
                "ssl.ca.location": str(pki.ca),
                "sasl.mechanism": "PLAIN",
                "sasl.username": "bob",
                "sasl.password": PLAIN_USERS["bob"],
            }
        )
        p.produce("secrets", value=serialize({"x": 7}, SerializationContext("secrets", MessageField.VALUE)))
        assert p.flush(30) == 0
        assert client.get_subjects() == ["secrets-value"]

        stranger = SchemaRegistryClient(
            {"url": url, "ssl.ca.location": str(pki.ca), "basic.auth.user.info": "bob:not-his"}
        )
        with pytest.raises(SchemaRegistryError) as e:
            stranger.get_subjects()
        assert e.value.http_status_code == 401
    finally:
        assert b.stop() == 0

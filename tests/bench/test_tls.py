"""bench.tls gives Apache Kafka kbroker's SASL_SSL listener: both listeners, PEM keystore, TLS 1.3, SCRAM, and on KRaft
a protocol map that still names the controller listener."""

from __future__ import annotations

from pathlib import Path

from bench.peers.kafka import KafkaPeer
from bench.tls import sasl_ssl_overrides


def _listeners(value: str) -> dict[str, str]:
    return dict(item.split("://", 1) for item in value.split(","))


def test_zookeeper_mode_keeps_plaintext_and_adds_sasl_ssl(tmp_path: Path) -> None:
    peer = KafkaPeer("3.9", mode="zk", zookeeper="127.0.0.1:1", base=tmp_path)
    out = sasl_ssl_overrides(peer.properties(), 40001, tmp_path / "ks.pem")
    assert _listeners(out["listeners"]) == {
        "PLAINTEXT": f"127.0.0.1:{peer.port}",
        "SASL_SSL": "127.0.0.1:40001",
    }
    assert _listeners(out["advertised.listeners"]) == _listeners(out["listeners"])
    assert out["ssl.keystore.type"] == "PEM" and out["ssl.keystore.location"] == str(tmp_path / "ks.pem")
    assert out["ssl.enabled.protocols"] == out["ssl.protocol"] == "TLSv1.3"
    assert out["sasl.enabled.mechanisms"] == "SCRAM-SHA-256"
    assert "ScramLoginModule required" in out["listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config"]
    assert "listener.security.protocol.map" not in out  # Kafka's default map already has SASL_SSL


def test_kraft_maps_every_listener(tmp_path: Path) -> None:
    peer = KafkaPeer("4", mode="kraft", base=tmp_path)
    out = sasl_ssl_overrides(peer.properties(), 40002, tmp_path / "ks.pem")
    names = set(_listeners(out["listeners"]))
    assert names == {"PLAINTEXT", "CONTROLLER", "SASL_SSL"}
    mapped = dict(kv.split(":") for kv in out["listener.security.protocol.map"].split(","))
    assert set(mapped) == names and mapped["SASL_SSL"] == "SASL_SSL"
    assert set(_listeners(out["advertised.listeners"])) == {"PLAINTEXT", "SASL_SSL"}

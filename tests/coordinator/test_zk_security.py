"""Security in ZooKeeper mode: two brokers that talk to each other over a SASL_SSL inter-broker listener
(SCRAM-SHA-512, its credentials stored in ZooKeeper as Kafka's kafka-configs writes them), and SCRAM users
altered through one broker that the other uses at once."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from kazoo.client import KazooClient

from tests.broker_process import BrokerProcess, free_port, wait_all_registered
from tests.clients import Msg, ck_consume, ck_produce, wait_until
from tests.security_setup import Pki, make_pki
from tests.zookeeper import ZooKeeperServer, zookeeper_missing

pytestmark = pytest.mark.skipif(zookeeper_missing() is not None, reason=zookeeper_missing() or "")

PARTITIONS = 4


def kafka_scram_credential(mechanism: str, password: str, iterations: int = 4096) -> str:
    """What Kafka's ScramCredentialUtils.credentialToString writes (computed here independently of the broker)."""
    h = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
    salt = os.urandom(24)
    salted = hashlib.pbkdf2_hmac(h, password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", h).digest()
    stored_key = hashlib.new(h, client_key).digest()
    server_key = hmac.new(salted, b"Server Key", h).digest()
    b64 = base64.b64encode
    return (f"salt={b64(salt).decode()},stored_key={b64(stored_key).decode()},"
            f"server_key={b64(server_key).decode()},iterations={iterations}")


def broker_overrides(zk: ZooKeeperServer, broker_id: int, pki: Pki, ports: dict[str, int]) -> dict[str, str]:
    scram_jaas = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" ' \
                 'password="broker-secret";'
    return {
        "zookeeper.connect": zk.connect,
        "broker.id": str(broker_id),
        "zookeeper.session.timeout.ms": "4000",
        "zookeeper.connection.timeout.ms": "5000",
        "num.partitions": "1",
        "listeners": ",".join(f"{n}://127.0.0.1:{p}" for n, p in ports.items()),
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:SASL_SSL,EXTERNAL:SASL_SSL",
        "inter.broker.listener.name": "INTERNAL",
        "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
        "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.internal.scram-sha-512.sasl.jaas.config": scram_jaas,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.certificate.chain": pki.broker_cert.read_text(),  # KIP-651 inline PEM
        "ssl.keystore.key": pki.broker_key.read_text(),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(pki.ca),
        "connections.max.reauth.ms": "3000",
    }


class SecureCluster:
    def __init__(self, zk: ZooKeeperServer, base: Path, pki: Pki) -> None:
        self.brokers: list[BrokerProcess] = []
        self.ports: list[dict[str, int]] = []
        for broker_id in (1, 2):
            ports = {"PLAINTEXT": free_port(), "INTERNAL": free_port(), "EXTERNAL": free_port()}
            self.ports.append(ports)
            self.brokers.append(BrokerProcess(base / f"b{broker_id}", broker_overrides(zk, broker_id, pki, ports),
                                              port=ports["PLAINTEXT"]))

    def external(self, i: int) -> str:
        return f"127.0.0.1:{self.ports[i]['EXTERNAL']}"


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    zk = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper")).start()
    yield zk
    zk.stop()


@pytest.fixture(scope="module")
def zk_client(zookeeper: ZooKeeperServer) -> Iterator[KazooClient]:
    c = KazooClient(zookeeper.connect, timeout=10)
    c.start(10)
    yield c
    c.stop()
    c.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperServer, zk_client: KazooClient, pki: Pki,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    # The brokers' own SCRAM user exists before they start, written as `kafka-configs --zookeeper ... --alter
    # --add-config 'SCRAM-SHA-512=[password=...]' --entity-type users --entity-name broker` writes it.
    doc = {"version": 1, "config": {"SCRAM-SHA-512": kafka_scram_credential("SCRAM-SHA-512", "broker-secret")}}
    zk_client.create("/config/users/broker", json.dumps(doc).encode(), makepath=True)
    c = SecureCluster(zookeeper, tmp_path_factory.mktemp("zksecure"), pki)
    try:
        for b in c.brokers:
            b.start()
        # Both registered with the controller before topics are created: else every partition lands on broker 1.
        wait_all_registered(c.brokers)
        yield c
    finally:
        for b in c.brokers:
            try:
                b.stop()
            except RuntimeError:
                b.kill()


def sasl_conf(pki: Pki, user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> dict[str, str]:
    return {"security_protocol": "SASL_SSL", "ssl_ca_location": str(pki.ca), "sasl_mechanism": mechanism,
            "sasl_username": user, "sasl_password": password}


def test_brokers_talk_over_the_sasl_ssl_inter_broker_listener(cluster: SecureCluster, pki: Pki) -> None:
    b1, b2 = cluster.brokers
    admin = AdminClient({"bootstrap.servers": b1.bootstrap})
    admin.create_topics([NewTopic("zk-secure", PARTITIONS, 1)], operation_timeout=10)["zk-secure"].result(20)

    def leaders() -> set[int]:
        md = AdminClient({"bootstrap.servers": b2.bootstrap}).list_topics(topic="zk-secure", timeout=10)
        t = md.topics.get("zk-secure")
        return set() if t is None or t.error else {p.leader for p in t.partitions.values()}

    wait_until(lambda: leaders() == {1, 2}, timeout=20, what="partitions led by both brokers")
    up = UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"carol-pw")
    admin.alter_user_scram_credentials([up])["carol"].result(timeout=30)
    msgs = [Msg(f"k{i}".encode(), f"v{i}".encode(), partition=i % PARTITIONS) for i in range(40)]
    ck_produce(cluster.external(0), "zk-secure", msgs, **sasl_conf(pki, "carol", "carol-pw"))
    got = ck_consume(cluster.external(1), "zk-secure", range(PARTITIONS), 40, **sasl_conf(pki, "carol", "carol-pw"))
    assert sorted(r.value for r in got) == sorted(m.value for m in msgs)
    # The controller reached broker 2 over the inter-broker listener, authenticated as the `broker` user.
    controller = b1 if "Connected to broker 2" in b1.read_log() else b2
    assert "(SASL_SSL)" in controller.read_log().split("Connected to broker", 1)[1].splitlines()[0]
    for b in cluster.brokers:
        assert "authentication failed for" not in b.read_log()


def test_inter_broker_connections_outlive_their_session(cluster: SecureCluster) -> None:
    """connections.max.reauth.ms=3000 on every listener: the channel replaces its connection before the broker on
    the other end would close it, so controller requests keep flowing."""
    b1, _ = cluster.brokers
    admin = AdminClient({"bootstrap.servers": b1.bootstrap})
    for i in range(3):
        time.sleep(1.6)
        name = f"zk-reauth-{i}"
        admin.create_topics([NewTopic(name, PARTITIONS, 1)], operation_timeout=10)[name].result(20)
        md = wait_until(lambda n=name: (AdminClient({"bootstrap.servers": cluster.brokers[1].bootstrap})
                                         .list_topics(topic=n, timeout=10).topics.get(n)), timeout=20)
        wait_until(lambda n=name: {p.leader for p in AdminClient({"bootstrap.servers": cluster.brokers[1].bootstrap})
                                   .list_topics(topic=n, timeout=10).topics[n].partitions.values()} == {1, 2},
                   timeout=20, what="leaders on both brokers")
        assert md is not None
    for b in cluster.brokers:
        assert "expired (connections.max.reauth.ms)" not in b.read_log()


def test_credentials_altered_through_one_broker_are_used_by_the_other(cluster: SecureCluster, pki: Pki,
                                                                      zk_client: KazooClient) -> None:
    a1 = AdminClient({"bootstrap.servers": cluster.brokers[0].bootstrap})
    a2 = AdminClient({"bootstrap.servers": cluster.brokers[1].bootstrap})
    up = UserScramCredentialUpsertion("dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"dave-pw")
    a1.alter_user_scram_credentials([up])["dave"].result(timeout=30)
    # Kafka's layout in ZooKeeper, and its change notification.
    config = json.loads(zk_client.get("/config/users/dave")[0])["config"]
    assert set(config) == {"SCRAM-SHA-512"}
    fields = dict(item.split("=", 1) for item in config["SCRAM-SHA-512"].split(","))
    assert set(fields) == {"salt", "stored_key", "server_key", "iterations"} and fields["iterations"] == "8192"
    changes = [json.loads(zk_client.get(f"/config/changes/{c}")[0]) for c in zk_client.get_children("/config/changes")]
    assert {"version": 2, "entity_path": "users/dave"} in changes
    t0 = time.monotonic()
    wait_until(lambda: "dave" in {d for d in a2.describe_user_scram_credentials().result(timeout=10)}, timeout=5)
    assert time.monotonic() - t0 < 1.5
    ck_produce(cluster.external(1), "zk-dave", [Msg(b"k", b"v")], **sasl_conf(pki, "dave", "dave-pw", "SCRAM-SHA-512"))
    # Deleted through broker 2: broker 1 refuses dave from then on.
    a2.alter_user_scram_credentials([UserScramCredentialDeletion("dave", ScramMechanism.SCRAM_SHA_512)])[
        "dave"].result(timeout=30)

    def refused() -> bool:
        errors: list[KafkaError] = []
        p = Producer({"bootstrap.servers": cluster.external(0), "error_cb": errors.append,
                      **{k.replace("_", "."): v for k, v in sasl_conf(pki, "dave", "dave-pw", "SCRAM-SHA-512").items()}})
        p.produce("zk-dave", b"x")
        p.flush(3)
        p.purge()
        return any(e.code() == KafkaError._AUTHENTICATION for e in errors)

    wait_until(refused, timeout=10, what="dave refused by broker 1")


def test_credentials_written_by_kafka_tools_are_used(cluster: SecureCluster, pki: Pki,
                                                     zk_client: KazooClient) -> None:
    """A user added straight to ZooKeeper, as Kafka's tools do, with the change notification they write."""
    doc = {"version": 1, "config": {"SCRAM-SHA-256": kafka_scram_credential("SCRAM-SHA-256", "erin-pw", 4096)}}
    zk_client.create("/config/users/erin", json.dumps(doc).encode())
    zk_client.create("/config/changes/config_change_", json.dumps({"version": 2, "entity_path": "users/erin"}).encode(),
                     sequence=True)

    def works() -> bool:
        try:
            ck_produce(cluster.external(0), "zk-erin", [Msg(b"k", b"v")], timeout=5,
                       **sasl_conf(pki, "erin", "erin-pw"))
            return True
        except Exception:  # noqa: BLE001  (not yet seen: try again)
            return False

    wait_until(works, timeout=10, interval=0.3, what="erin accepted")

"""The web console's JSON API against a real broker: its numbers are what real clients did (confluent-kafka,
kafka-python), sign-in with the broker's SASL users, what the authorizer allows, and bad input."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kafka import KafkaAdminClient, KafkaProducer

from tests.broker_process import ROOT, BrokerProcess, free_port, wait_for_port
from tests.security_setup import plain_jaas


class Http:
    def __init__(self, port: int, user: str | None = None, password: str = "") -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.auth = None if user is None else "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        req = urllib.request.Request(self.base + path, method=method,
                                     data=None if body is None else json.dumps(body).encode())
        if self.auth:
            req.add_header("Authorization", self.auth)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def get(self, path: str) -> Any:
        status, body = self.call("GET", path)
        assert status == 200, (path, status, body)
        return body


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, Http]]:
    port = free_port()
    b = BrokerProcess(tmp_path_factory.mktemp("console"), {
        "console.listeners": f"http://127.0.0.1:{port}", "offsets.topic.num.partitions": "2",
        "transaction.state.log.num.partitions": "2", "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1"}).start()
    wait_for_port(port)
    try:
        yield b, Http(port)
    finally:
        assert b.stop() == 0


def test_static_pages_are_served(broker: tuple[BrokerProcess, Http]) -> None:
    _, http = broker
    for path, marker in (("/", b"<title>kbroker console</title>"), ("/app.js", b"const pages"),
                         ("/style.css", b"svg.chart")):
        with urllib.request.urlopen(http.base + path, timeout=30) as resp:
            assert resp.status == 200 and marker in resp.read()


def test_topics_messages_groups_and_producers_match_the_clients(broker: tuple[BrokerProcess, Http]) -> None:
    b, http = broker
    admin = AdminClient({"bootstrap.servers": b.bootstrap})  # held: a collected client cancels its requests
    admin.create_topics([NewTopic("orders", 3, 1)])["orders"].result(30)
    p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    t0 = int(time.time() * 1000)
    for i in range(90):
        p.produce("orders", key=f"k{i}".encode(), value=json.dumps({"n": i}).encode(), partition=i % 3,
                  headers=[("source", b"ck")], timestamp=t0 + i)
    assert p.flush(30) == 0
    kp = KafkaProducer(bootstrap_servers=b.bootstrap)
    for i in range(10):
        kp.send("events", value=bytes([0xff, i]), partition=0)  # not UTF-8: shown as base64
    kp.flush(30)
    kp.close()

    topics = {t["name"]: t for t in http.get("/api/topics")["topics"]}
    assert topics["orders"]["partitions"] == 3 and topics["orders"]["messages"] == 90
    assert topics["events"]["messages"] == 10 and topics["orders"]["size_bytes"] > 0
    detail = http.get("/api/topics/orders")
    assert [p["end_offset"] for p in detail["partitions"]] == [30, 30, 30]
    assert all(p["leader"] == 0 and p["isr"] == [0] for p in detail["partitions"])
    assert {"name": "cleanup.policy", "value": "delete"}.items() <= {
        k: v for c in detail["configs"] if c["name"] == "cleanup.policy" for k, v in c.items()}.items()

    page = http.get("/api/topics/orders/messages?partition=1&offset=10&limit=5")
    assert [r["offset"] for r in page["records"]] == [10, 11, 12, 13, 14]
    first = page["records"][0]
    assert first["key"] == {"encoding": "text", "data": "k31"}  # partition 1 holds i = 1, 4, 7, ...: offset 10 is 31
    assert json.loads(first["value"]["data"]) == {"n": 31} and first["value"]["encoding"] == "json"
    assert first["headers"] == [{"key": "source", "value": {"encoding": "text", "data": "ck"}}]
    by_time = http.get(f"/api/topics/orders/messages?partition=0&timestamp={t0 + 60}&limit=2")
    assert [r["offset"] for r in by_time["records"]] == [20, 21] and by_time["records"][0]["timestamp"] == t0 + 60
    last = http.get("/api/topics/events/messages?partition=0&limit=3")
    assert [r["offset"] for r in last["records"]] == [7, 8, 9]
    assert last["records"][0]["value"] == {"encoding": "base64", "data": base64.b64encode(b"\xff\x07").decode()}
    producers = http.get("/api/topics/orders/producers")["producers"]
    assert {(x["partition"], x["last_sequence"]) for x in producers} == {(0, 29), (1, 29), (2, 29)}

    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "billing", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe(["orders"])
    seen = 0
    deadline = time.monotonic() + 60
    while seen < 45 and time.monotonic() < deadline:
        m = c.poll(1)
        if m is not None and not m.error():
            seen += 1
            if seen == 45:
                c.commit(m, asynchronous=False)  # commits the position of that one partition only
    group = http.get("/api/groups/billing")
    assert group["type"] == "classic" and group["state"] == "Stable" and len(group["members"]) == 1
    assert sorted(group["members"][0]["assignment"]["orders"]) == [0, 1, 2]
    (committed,) = group["offsets"]
    assert committed["lag"] == 30 - committed["committed_offset"] and committed["end_offset"] == 30
    c.close()
    listed = {g["group_id"]: g for g in http.get("/api/groups")["groups"]}
    assert listed["billing"]["lag"] == committed["lag"] and listed["billing"]["type"] == "classic"


def test_a_kip848_group_is_shown_with_its_members_and_lag(broker: tuple[BrokerProcess, Http]) -> None:
    """A confluent-kafka consumer with group.protocol=consumer (KIP-848): the console lists the group as a consumer
    group, describes it with ConsumerGroupDescribe (member, epoch, assignment, assignor) and shows the lag of the
    offsets that client committed, per partition."""
    b, http = broker
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic("shipments", 2, 1)])["shipments"].result(30)
    p = Producer({"bootstrap.servers": b.bootstrap})
    for i in range(24):
        p.produce("shipments", f"s{i}".encode(), partition=i % 2)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "kip848-readers", "group.protocol": "consumer",
                  "client.id": "kip848-client", "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        c.subscribe(["shipments"])
        seen: dict[int, int] = {}
        deadline = time.monotonic() + 60
        while len(seen) < 2 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                seen.setdefault(m.partition(), m.offset())
        assert sorted(seen) == [0, 1], seen
        c.commit(offsets=[TopicPartition("shipments", 0, 5), TopicPartition("shipments", 1, 9)], asynchronous=False)

        group = http.get("/api/groups/kip848-readers")
        assert (group["type"], group["protocol_type"], group["state"]) == ("consumer", "consumer", "Stable")
        assert group["assignor"] in ("uniform", "range") and group["group_epoch"] >= 1
        (member,) = group["members"]
        assert member["client_id"] == "kip848-client" and member["epoch"] >= 1
        assert member["assignment"] == {"shipments": [0, 1]} and member["subscribed_topics"] == ["shipments"]
        assert [(o["partition"], o["committed_offset"], o["end_offset"], o["lag"]) for o in group["offsets"]] == [
            (0, 5, 12, 7), (1, 9, 12, 3)]
        listed = {g["group_id"]: g for g in http.get("/api/groups")["groups"]}
        assert listed["kip848-readers"]["type"] == "consumer" and listed["kip848-readers"]["lag"] == 10
        assert listed["kip848-readers"]["protocol_type"] == "consumer"
    finally:
        c.close()
    # The member left: the group is Empty, its committed offsets and lag stay.
    group = http.get("/api/groups/kip848-readers")
    assert group["state"] == "Empty" and group["members"] == []
    assert sum(o["lag"] for o in group["offsets"]) == 10


def test_transactions_page_shows_an_open_transaction(broker: tuple[BrokerProcess, Http]) -> None:
    b, http = broker
    p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "console-tx", "linger.ms": 0})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("tx-topic", b"v")
    p.flush(30)
    txns = {t["transactional_id"]: t for t in http.get("/api/transactions")["transactions"]}
    assert txns["console-tx"]["state"] == "Ongoing" and txns["console-tx"]["partitions"] == ["tx-topic-0"]
    p.commit_transaction(30)
    txns = {t["transactional_id"]: t for t in http.get("/api/transactions")["transactions"]}
    assert txns["console-tx"]["state"] in ("CompleteCommit", "PrepareCommit")


def test_throughput_comes_from_the_broker_counters(broker: tuple[BrokerProcess, Http]) -> None:
    b, http = broker
    p = Producer({"bootstrap.servers": b.bootstrap})
    deadline = time.monotonic() + 60
    series: list[dict[str, float]] = []
    while time.monotonic() < deadline:
        for _ in range(200):
            p.produce("rates", b"x" * 100)
        p.flush(30)
        series = http.get("/api/throughput")["topics"].get("rates", [])
        if sum(s["records_in"] for s in series) > 0:
            break
        time.sleep(1)
    assert series and sum(s["records_in"] for s in series) > 0 and all(s["bytes_in"] >= 0 for s in series)


def test_create_and_delete_a_topic_seen_by_kafka_python(broker: tuple[BrokerProcess, Http]) -> None:
    b, http = broker
    status, body = http.call("POST", "/api/topics", {"name": "made-in-console", "partitions": 2,
                                                     "replication_factor": 1})
    assert status == 200 and body == {"created": "made-in-console", "partitions": 2, "replication_factor": 1}
    admin = KafkaAdminClient(bootstrap_servers=b.bootstrap)
    try:
        assert "made-in-console" in admin.list_topics()
        status, body = http.call("POST", "/api/topics", {"name": "made-in-console", "partitions": 2,
                                                         "replication_factor": 1})
        assert status == 409 and "TOPIC_ALREADY_EXISTS" in body["error"]
        assert http.call("DELETE", "/api/topics/made-in-console")[0] == 200
        deadline = time.monotonic() + 30
        while "made-in-console" in admin.list_topics() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "made-in-console" not in admin.list_topics()
    finally:
        admin.close()


@pytest.mark.parametrize("method,path,body,status", [
    ("GET", "/api/topics/no-such-topic", None, 404),
    ("GET", "/api/topics/no-such-topic/messages", None, 404),
    ("GET", "/api/topics/orders/messages?offset=ten", None, 400),
    ("GET", "/api/groups/no-such-group", None, 404),
    ("GET", "/api/nothing", None, 404),
    ("PUT", "/api/topics", None, 405),
    ("POST", "/api/topics", {"name": 5}, 400),
    ("POST", "/api/topics", {"name": "x", "partitions": "many"}, 400),
    ("POST", "/api/topics", {"name": "bad/name", "partitions": 1, "replication_factor": 1}, 400),
    ("GET", "/elsewhere", None, 404),
])
def test_bad_requests_get_an_error_and_the_broker_keeps_serving(broker: tuple[BrokerProcess, Http], method: str,
                                                                path: str, body: Any, status: int) -> None:
    b, http = broker
    got, answer = http.call(method, path, body)
    assert got == status and answer["error"], (got, answer)
    assert http.get("/api/brokers")["brokers"][0]["node_id"] == 0
    assert b.proc is not None and b.proc.poll() is None


def test_a_bad_console_listener_stops_startup_naming_the_key(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "kbroker.broker", str(ROOT / "configs" / "server.properties"),
                        "--override", "console.listeners=https://127.0.0.1:1", "--override",
                        f"log.dirs={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "console.listeners" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------ sign-in and the authorizer

USERS = {"admin": "admin-secret", "alice": "alice-secret"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, int]]:
    kafka_port, console_port = free_port(), free_port()
    b = BrokerProcess(tmp_path_factory.mktemp("console-sasl"), {
        "listeners": f"SASL_PLAINTEXT://127.0.0.1:{kafka_port}",
        "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT",
        "inter.broker.listener.name": "SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN", "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": plain_jaas(USERS),
        "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer", "super.users": "User:admin",
        "console.listeners": f"http://127.0.0.1:{console_port}", "offsets.topic.num.partitions": "2",
    }, port=kafka_port).start()
    wait_for_port(console_port)
    try:
        yield b, console_port
    finally:
        assert b.stop() == 0


def _sasl(b: BrokerProcess, user: str) -> dict[str, str]:
    return {"bootstrap.servers": b.bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": user, "sasl.password": USERS[user]}


def test_console_signs_in_with_sasl_users_and_shows_what_the_authorizer_allows(
        secured: tuple[BrokerProcess, int]) -> None:
    b, port = secured
    admin = AdminClient(_sasl(b, "admin"))
    for f in admin.create_topics([NewTopic("visible", 1, 1), NewTopic("hidden", 1, 1)]).values():
        f.result(30)
    for f in admin.create_acls([AclBinding(ResourceType.TOPIC, "visible", ResourcePatternType.LITERAL, "User:alice",
                                           "*", op, AclPermissionType.ALLOW)
                                for op in (AclOperation.DESCRIBE, AclOperation.READ)]).values():
        f.result(30)

    assert Http(port).call("GET", "/api/topics")[0] == 401
    assert Http(port, "alice", "wrong").call("GET", "/api/topics")[0] == 401
    assert Http(port, "nobody", "x").call("GET", "/api/topics")[0] == 401
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as resp:  # the page itself is public
        assert resp.status == 200

    alice = Http(port, "alice", USERS["alice"])
    assert alice.get("/api/whoami") == {"user": "alice", "login_required": True, "listener": "SASL_PLAINTEXT"}
    assert [t["name"] for t in alice.get("/api/topics")["topics"]] == ["visible"]
    assert alice.call("GET", "/api/topics/hidden")[0] in (403, 404)
    status, body = alice.call("POST", "/api/topics", {"name": "alices", "partitions": 1, "replication_factor": 1})
    assert status == 403 and "AUTHORIZATION" in body["error"]
    status, _ = alice.call("DELETE", "/api/topics/visible")
    assert status == 403

    boss = Http(port, "admin", USERS["admin"])
    assert {"hidden", "visible"} <= {t["name"] for t in boss.get("/api/topics")["topics"]}
    assert boss.call("POST", "/api/topics", {"name": "admins", "partitions": 1, "replication_factor": 1})[0] == 200
    p = Producer(_sasl(b, "admin"))
    p.produce("visible", b"for alice")
    assert p.flush(30) == 0
    records = alice.get("/api/topics/visible/messages?partition=0&offset=0")["records"]
    assert [r["value"]["data"] for r in records] == ["for alice"]

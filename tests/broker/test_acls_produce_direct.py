"""Produce with an authorizer, on the direct path (handle_produce_frame with a connection's cache of allowed Writes,
broker/security/write_allowed.py) and on the Python references (KBROKER_PURE_PYTHON=1: handle_produce for every
request), with real clients:

- confluent-kafka and kafka-python producers (plain, idempotent, transactional) allowed to Write one topic and
  denied another get their records into the first and TOPIC_AUTHORIZATION_FAILED for the second; a transactional
  id denied Write is refused (TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
- an ACL deleted while a producer keeps producing on the same connection takes effect on its next Produce (no
  stale allow), and one created lets the denied producer through on its next Produce: topics (both clients) and a
  transactional id (Produce's own check: the partition is already in the transaction).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)
from kbroker.protocol.accelerators import PURE_PYTHON_ENV

from tests.broker.test_acls import (
    AUTHORIZER,
    acls_cleared,
    allow,
    create_acls,
    create_topic,
    deny,
    produce_error,
)
from tests.broker_process import BrokerProcess
from tests.clients import Msg, ck_conf, ck_consume, ck_produce, kp_produce
from tests.txn_support import TXN_BROKER_OVERRIDES, ck_txn_producer

ANON = "User:ANONYMOUS"


@pytest.fixture(scope="module", params=["compiled", "pure-python"])
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    env = {PURE_PYTHON_ENV: "1"} if request.param == "pure-python" else None
    b = BrokerProcess(
        tmp_path_factory.mktemp(f"acl-produce-{request.param}"),
        {
            "authorizer.class.name": AUTHORIZER,
            "allow.everyone.if.no.acl.found": "true",
            **TXN_BROKER_OVERRIDES,
        },
        env=env,
    )
    b.start()
    yield b
    b.stop()


@pytest.fixture
def adm(broker: BrokerProcess) -> Iterator[Any]:
    yield from acls_cleared(broker.bootstrap)


def _delete(a: Any, rtype: ResourceType, name: str, op: AclOperation, permission: AclPermissionType) -> None:
    flt = AclBindingFilter(rtype, name, ResourcePatternType.LITERAL, ANON, None, op, permission)
    for f in a.delete_acls([flt]).values():
        assert len(f.result(10)) == 1


def _two_topics(a: Any, topic_name: str) -> tuple[str, str]:
    """Topic A open to everyone (no ACL names it), topic B denied Write to the clients' principal."""
    allowed, denied = f"{topic_name}-a", f"{topic_name}-b"
    create_topic(a, allowed)
    create_topic(a, denied)
    create_acls(a, [deny(ResourceType.TOPIC, denied, AclOperation.WRITE)])
    return allowed, denied


def _values(bootstrap: str, topic: str, count: int) -> list[bytes]:
    return [r.value for r in ck_consume(bootstrap, topic, [0], count)]


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
def test_confluent_allowed_topic_and_denied_topic(
    broker: BrokerProcess, adm: Any, topic_name: str, idempotent: bool
) -> None:
    allowed, denied = _two_topics(adm, topic_name)
    conf = {"enable_idempotence": idempotent}
    ck_produce(broker.bootstrap, allowed, [Msg(b"k", b"v%d" % i) for i in range(3)], **conf)
    assert produce_error(broker.bootstrap, denied, **conf) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    ck_produce(broker.bootstrap, allowed, [Msg(b"k", b"v3")], **conf)
    assert _values(broker.bootstrap, allowed, 4) == [b"v0", b"v1", b"v2", b"v3"]


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
def test_kafka_python_allowed_topic_and_denied_topic(
    broker: BrokerProcess, adm: Any, topic_name: str, idempotent: bool
) -> None:
    from kafka.errors import TopicAuthorizationFailedError

    allowed, denied = _two_topics(adm, topic_name)
    kp_produce(
        broker.bootstrap, allowed, [Msg(b"k", b"v%d" % i) for i in range(3)], enable_idempotence=idempotent
    )
    with pytest.raises(TopicAuthorizationFailedError):
        kp_produce(broker.bootstrap, denied, [Msg(b"k", b"v")], enable_idempotence=idempotent)
    assert _values(broker.bootstrap, allowed, 3) == [b"v0", b"v1", b"v2"]


def test_confluent_transactional_allowed_topic_and_denied_topic(
    broker: BrokerProcess, adm: Any, topic_name: str
) -> None:
    allowed, denied = _two_topics(adm, topic_name)
    p = ck_txn_producer(broker.bootstrap, f"tx-{topic_name}")
    p.begin_transaction()
    p.produce(allowed, b"committed", partition=0)
    p.commit_transaction(30)
    p.begin_transaction()
    errors: list[KafkaError] = []
    p.produce(denied, b"refused", partition=0, on_delivery=lambda err, _m: errors.append(err))
    with pytest.raises(KafkaException):  # "1 message(s) failed delivery": the delivery report says why
        p.commit_transaction(30)
    assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    p.abort_transaction(30)
    assert _values(broker.bootstrap, allowed, 1) == [b"committed"]
    create_acls(adm, [deny(ResourceType.TRANSACTIONAL_ID, f"tx-{topic_name}-denied", AclOperation.WRITE)])
    with pytest.raises(KafkaException) as info:
        ck_txn_producer(broker.bootstrap, f"tx-{topic_name}-denied")
    assert info.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_kafka_python_transactional_allowed_topic_and_denied_topic(
    broker: BrokerProcess, adm: Any, topic_name: str
) -> None:
    from kafka import KafkaProducer
    from kafka.errors import TopicAuthorizationFailedError, TransactionalIdAuthorizationFailedError

    allowed, denied = _two_topics(adm, topic_name)
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=f"tx-{topic_name}", linger_ms=5)
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send(allowed, b"committed", partition=0).get(30)
        p.commit_transaction()
        p.begin_transaction()
        f = p.send(denied, b"refused", partition=0)
        with pytest.raises(TopicAuthorizationFailedError):
            f.get(30)
        p.abort_transaction()
    finally:
        p.close(timeout=10)
    assert _values(broker.bootstrap, allowed, 1) == [b"committed"]
    create_acls(adm, [deny(ResourceType.TRANSACTIONAL_ID, f"tx-{topic_name}-denied", AclOperation.WRITE)])
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=f"tx-{topic_name}-denied")
    try:
        with pytest.raises(TransactionalIdAuthorizationFailedError):
            p.init_transactions()
    finally:
        p.close(timeout=10)


def _guarded_topic(a: Any, topic_name: str) -> str:
    """A topic whose ACLs let the clients' principal Write, Describe and Read it: with the Write deleted, ACLs
    remain (allow.everyone.if.no.acl.found does not apply), so the principal is denied Write."""
    create_topic(a, topic_name)
    create_acls(
        a,
        [
            allow(ResourceType.TOPIC, topic_name, AclOperation.WRITE),
            allow(ResourceType.TOPIC, topic_name, AclOperation.DESCRIBE),
            allow(ResourceType.TOPIC, topic_name, AclOperation.READ),
        ],
    )
    return topic_name


def _ck_send(p: Producer, topic: str, value: bytes) -> KafkaError | None:
    """One record by a long-lived producer (one connection to the broker), its delivery error or None."""
    result: list[KafkaError | None] = []
    p.produce(topic, value, partition=0, on_delivery=lambda err, _m: result.append(err))
    assert p.flush(30) == 0
    return result[0]


def _ck_send_once_allowed(p: Producer, topic: str, value: bytes) -> None:
    """librdkafka keeps a topic's TOPIC_AUTHORIZATION_FAILED and refuses produce() itself until its next Metadata
    (topic.metadata.refresh.interval.ms): the record goes out once it has asked again."""
    deadline = time.monotonic() + 20
    while True:
        try:
            assert _ck_send(p, topic, value) is None
            return
        except KafkaException as e:
            assert (
                e.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED and time.monotonic() < deadline
            ), e
            time.sleep(0.1)


def test_confluent_write_deleted_and_created_between_requests(
    broker: BrokerProcess, adm: Any, topic_name: str
) -> None:
    topic = _guarded_topic(adm, topic_name)
    p = Producer(
        ck_conf(
            broker.bootstrap,
            **{
                "enable.idempotence": False,
                "linger.ms": 0,
                "retries": 0,
                "topic.metadata.refresh.interval.ms": 300,
            },
        )
    )
    for i in range(3):
        assert _ck_send(p, topic, b"before-%d" % i) is None
    _delete(adm, ResourceType.TOPIC, topic, AclOperation.WRITE, AclPermissionType.ALLOW)
    err = _ck_send(p, topic, b"refused")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    create_acls(adm, [allow(ResourceType.TOPIC, topic, AclOperation.WRITE)])
    _ck_send_once_allowed(p, topic, b"after")
    # A deny beside the allow: refused again on the next request.
    create_acls(adm, [deny(ResourceType.TOPIC, topic, AclOperation.WRITE)])
    err = _ck_send(p, topic, b"refused")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    _delete(adm, ResourceType.TOPIC, topic, AclOperation.WRITE, AclPermissionType.DENY)
    _ck_send_once_allowed(p, topic, b"last")
    p.flush(10)
    assert _values(broker.bootstrap, topic, 5) == [b"before-0", b"before-1", b"before-2", b"after", b"last"]


def test_kafka_python_write_deleted_and_created_between_requests(
    broker: BrokerProcess, adm: Any, topic_name: str
) -> None:
    from kafka import KafkaProducer
    from kafka.errors import TopicAuthorizationFailedError

    topic = _guarded_topic(adm, topic_name)
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=False, linger_ms=0, retries=0)
    try:
        for i in range(3):
            p.send(topic, b"before-%d" % i, partition=0).get(30)
        _delete(adm, ResourceType.TOPIC, topic, AclOperation.WRITE, AclPermissionType.ALLOW)
        with pytest.raises(TopicAuthorizationFailedError):
            p.send(topic, b"refused", partition=0).get(30)
        create_acls(adm, [allow(ResourceType.TOPIC, topic, AclOperation.WRITE)])
        p.send(topic, b"after", partition=0).get(30)
    finally:
        p.close(timeout=10)
    assert _values(broker.bootstrap, topic, 4) == [b"before-0", b"before-1", b"before-2", b"after"]


def test_transactional_id_write_denied_mid_transaction(
    broker: BrokerProcess, adm: Any, topic_name: str
) -> None:
    """The partition is in the transaction already: the next Produce is the first request to meet the deny."""
    create_topic(adm, topic_name)
    txn_id = f"tx-{topic_name}"
    p = ck_txn_producer(broker.bootstrap, txn_id, **{"linger.ms": 0})
    p.begin_transaction()
    for i in range(3):
        assert _ck_send(p, topic_name, b"in-txn-%d" % i) is None
    create_acls(adm, [deny(ResourceType.TRANSACTIONAL_ID, txn_id, AclOperation.WRITE)])
    err = _ck_send(p, topic_name, b"refused")
    assert err is not None and err.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    # A denied transactional id is fatal for librdkafka's producer: a new one, once the deny is gone.
    _delete(adm, ResourceType.TRANSACTIONAL_ID, txn_id, AclOperation.WRITE, AclPermissionType.DENY)
    deadline = time.monotonic() + 30
    while True:
        try:
            p = ck_txn_producer(broker.bootstrap, txn_id)
            break
        except KafkaException:  # the fenced transaction's abort may still be under way
            assert time.monotonic() < deadline
            time.sleep(0.5)
    p.begin_transaction()
    assert _ck_send(p, topic_name, b"after") is None
    p.commit_transaction(30)

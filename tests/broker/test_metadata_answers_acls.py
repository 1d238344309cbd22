"""Remembered Metadata answers with an ACL authorizer (broker/metadata_answers.py, keyed by principal, host and the
authorizer's generation): confluent-kafka and kafka-python, each on one long-lived connection, see an ACL that
hides a topic, and its removal, on their next Metadata request (no stale answer), and the same request answered
twice in a row (the second remembered) is the same bytes."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AclOperation, ResourceType
from kafka import KafkaAdminClient
from kbroker.protocol import codec
from kbroker.protocol.messages import MetadataRequest, RequestHeader

from tests.broker.test_acls import AUTHORIZER, admin, create_acls, create_topic, delete_all_acls, deny
from tests.broker_process import BrokerProcess
from tests.clients import RawClient

OPEN, HIDDEN = "mz-open", "mz-hidden"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        tmp_path_factory.mktemp("answers-acls"),
        {
            "authorizer.class.name": AUTHORIZER,
            "allow.everyone.if.no.acl.found": "true",
            "auto.create.topics.enable": "false",
        },
        env={"KBROKER_METADATA_CACHE": "1"},
    )
    b.start()
    yield b
    b.stop()


def _twice(raw: RawClient, cid: int) -> tuple[bytes, bytes]:
    """An all-topics Metadata v12 with the authorized operations, twice: both answers without correlation ids."""
    out = []
    for again in (0, 1):
        header = RequestHeader(
            request_api_key=3, request_api_version=12, correlation_id=cid + again, client_id="t"
        )
        req = MetadataRequest(
            topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=True
        )
        raw.send_bytes(bytes(codec.encode_request(header, req)))
        frame = raw.recv_frame()
        assert struct.unpack(">i", frame[:4])[0] == cid + again
        out.append(frame[4:])
    return out[0], out[1]


def _names(answer: bytes) -> set[str]:
    _, body = codec.decode_response(3, 12, bytes(4) + answer)
    return {t.name for t in body.topics}


def test_an_acl_change_shows_in_the_next_answer(broker: BrokerProcess) -> None:
    ck = admin(broker.bootstrap)
    kp = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
    delete_all_acls(ck)
    try:
        for name in (OPEN, HIDDEN):
            create_topic(ck, name)
        with RawClient(broker.bootstrap) as raw:
            first, again = _twice(raw, 0)
            assert first == again and {OPEN, HIDDEN} <= _names(first)

            def views(hidden_seen: bool) -> None:
                assert (HIDDEN in set(ck.list_topics(timeout=10).topics)) is hidden_seen
                assert (HIDDEN in set(kp.list_topics())) is hidden_seen
                a, b = _twice(raw, 10)
                assert a == b and (HIDDEN in _names(a)) is hidden_seen and OPEN in _names(a)

            views(True)
            views(True)  # remembered now, for every connection's principal
            create_acls(ck, [deny(ResourceType.TOPIC, HIDDEN, AclOperation.DESCRIBE)])
            views(False)
            views(False)
            delete_all_acls(ck)
            views(True)
    finally:
        kp.close()
        delete_all_acls(ck)

"""Remembered Metadata answers (broker/metadata_answers.py) on one real broker: the same bytes as the answer built
anew (the same broker's data dir and ports, run once with KBROKER_METADATA_CACHE=0 and once with it on), on both
listeners, for every version and request shape; and no stale answer to confluent-kafka or kafka-python after a topic
is created, gets partitions, changes a config or is deleted."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)
from kafka import KafkaAdminClient
from kbroker.protocol import codec
from kbroker.protocol.messages import MetadataRequest, RequestHeader

from tests.broker_process import BrokerProcess, free_port
from tests.clients import RawClient

TOPICS = {"ma-one": 1, "ma-three": 3, "ma-five": 5}
MISSING = "ma-missing"
T = MetadataRequest.MetadataRequestTopic


def _listeners(inside: int, outside: int) -> dict[str, str]:
    both = f"INSIDE://127.0.0.1:{inside},OUTSIDE://127.0.0.1:{outside}"
    return {
        "listeners": both,
        "advertised.listeners": both,
        "listener.security.protocol.map": "INSIDE:PLAINTEXT,OUTSIDE:PLAINTEXT",
        "inter.broker.listener.name": "INSIDE",
        # v1-3 cannot say no to auto-creation: the missing topic must stay missing in both runs.
        "auto.create.topics.enable": "false",
    }


def _requests(ids: dict[str, bytes]) -> list[tuple[int, MetadataRequest]]:
    """Every version, and the shapes clients send: all topics, named ones (in another order, twice), a missing one
    (an error: never remembered), by topic id (v12), the authorized-operations flags, auto-creation off."""
    out: list[tuple[int, MetadataRequest]] = [
        (0, MetadataRequest(topics=[])),
        (0, MetadataRequest(topics=[T(name="ma-three")])),
    ]
    named = [T(name=n) for n in TOPICS]
    for v in range(1, 13):
        out += [
            (v, MetadataRequest(topics=None, allow_auto_topic_creation=False)),
            (v, MetadataRequest(topics=named, allow_auto_topic_creation=False)),
            (
                v,
                MetadataRequest(
                    topics=[T(name="ma-five"), T(name="ma-one"), T(name="ma-five")],
                    allow_auto_topic_creation=False,
                ),
            ),
            (v, MetadataRequest(topics=[T(name="ma-one"), T(name=MISSING)], allow_auto_topic_creation=False)),
        ]
        if v >= 8:
            out += [
                (
                    v,
                    MetadataRequest(
                        topics=named,
                        allow_auto_topic_creation=False,
                        include_cluster_authorized_operations=True,
                        include_topic_authorized_operations=True,
                    ),
                ),
                (
                    v,
                    MetadataRequest(
                        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=True
                    ),
                ),
            ]
    out.append(
        (
            12,
            MetadataRequest(
                topics=[T(topic_id=ids["ma-three"], name=None), T(topic_id=ids["ma-one"], name=None)]
            ),
        )
    )
    out.append((12, MetadataRequest(topics=[T(topic_id=uuid.uuid4().bytes, name=None)])))
    return out


def _answers(bootstrap: str, requests: list[tuple[int, MetadataRequest]]) -> list[tuple[bytes, bytes]]:
    """Each request twice on one connection (the second answer may be remembered): both answers without their
    correlation ids, which are checked here."""
    out = []
    with RawClient(bootstrap) as raw:
        for cid, (v, req) in enumerate(requests):
            pair = []
            for again in (0, 1):
                header = RequestHeader(
                    request_api_key=3,
                    request_api_version=v,
                    correlation_id=2 * cid + again,
                    client_id="metadata-answers",
                )
                raw.send_bytes(bytes(codec.encode_request(header, req)))
                frame = raw.recv_frame()
                assert struct.unpack(">i", frame[:4])[0] == 2 * cid + again
                pair.append(frame[4:])
            out.append((pair[0], pair[1]))
    return out


def test_remembered_answers_are_the_bytes_built_anew(tmp_path: Path) -> None:
    inside, outside = free_port(), free_port()
    broker = BrokerProcess(
        tmp_path / "b", _listeners(inside, outside), port=inside, env={"KBROKER_METADATA_CACHE": "0"}
    ).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for f in admin.create_topics([NewTopic(n, p, 1) for n, p in TOPICS.items()]).values():
            f.result(15)
        meta = RawClient(broker.bootstrap)
        with meta:
            resp = meta.request(
                3, 12, MetadataRequest(topics=[T(name=n) for n in TOPICS], allow_auto_topic_creation=False)
            )
        ids = {t.name: t.topic_id for t in resp.topics}
        del admin
        # Both runs from the topics as a start-up reads them (the store's file is in name order, the map before a
        # restart in order of creation, and an all-topics answer lists them in the map's order).
        broker.restart()
        requests = _requests(ids)
        built = {port: _answers(f"127.0.0.1:{port}", requests) for port in (inside, outside)}
    finally:
        broker.stop()
    broker.env = {"KBROKER_METADATA_CACHE": "1"}
    broker.start()
    try:
        remembered = {port: _answers(f"127.0.0.1:{port}", requests) for port in (inside, outside)}
    finally:
        broker.stop()
    for port in (inside, outside):
        for (v, req), (first, second), (cfirst, csecond) in zip(
            requests, built[port], remembered[port], strict=True
        ):
            assert first == second, (v, req)
            assert cfirst == first and csecond == first, (port, v, req)
    # The listener is part of what is remembered: the same request answers each listener's own endpoint.
    all_topics = requests.index((12, MetadataRequest(topics=None, allow_auto_topic_creation=False)))
    assert remembered[inside][all_topics] != remembered[outside][all_topics]
    _, body = codec.decode_response(3, 12, bytes(4) + remembered[outside][all_topics][1])
    assert [(b.host, b.port) for b in body.brokers] == [("127.0.0.1", outside)]
    assert sorted(t.name for t in body.topics) == sorted(TOPICS)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    # No auto-creation: asking for the deleted topic must not bring it back.
    b = BrokerProcess(
        tmp_path_factory.mktemp("answers"),
        {"auto.create.topics.enable": "false"},
        env={"KBROKER_METADATA_CACHE": "1"},
    )
    b.start()
    yield b
    b.stop()


def _ck_view(admin: AdminClient, topic: str) -> tuple[set[str], int | None]:
    """confluent-kafka: the topics of an all-topics Metadata, and the topic's partition count from one for it."""
    names = set(admin.list_topics(timeout=10).topics)
    t = admin.list_topics(topic=topic, timeout=10).topics[topic]
    return names, (None if t.error is not None else len(t.partitions))


def _kp_view(admin: KafkaAdminClient, topic: str) -> tuple[set[str], int | None]:
    """kafka-python: the same two Metadata requests, as that client sends them."""
    names = set(admin.list_topics())
    (t,) = admin.describe_topics([topic])
    return names, (None if t["error_code"] else len(t["partitions"]))


def test_clients_see_every_topic_change_at_once(broker: BrokerProcess) -> None:
    """Each client asks the same Metadata before and after every change (remembered in between); the change is
    done and answered on this broker before the next ask, so the next answer must show it: no waiting, no retry."""
    topic = "ma-changing"
    ck = AdminClient({"bootstrap.servers": broker.bootstrap})
    kp = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
    try:
        for f in ck.create_topics([NewTopic("ma-steady", 1, 1)]).values():
            f.result(15)

        def both(expected_in: bool, partitions: int | None) -> None:
            for _ in range(3):  # asked again and again: the later ones are answered from what was remembered
                for view in (_ck_view(ck, topic), _kp_view(kp, topic)):
                    names, count = view
                    assert (topic in names) == expected_in and "ma-steady" in names, view
                    assert count == partitions, view

        both(False, None)
        ck.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)
        both(True, 1)
        ck.create_partitions([NewPartitions(topic, 4)])[topic].result(15)
        both(True, 4)
        # A producer told of 4 partitions writes to the last one added.
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        delivered: list[object] = []
        producer.produce(topic, b"v", partition=3, on_delivery=lambda err, msg: delivered.append(err))
        assert producer.flush(15) == 0 and delivered == [None]
        res = ConfigResource(
            ConfigResource.Type.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)
            ],
        )
        ck.incremental_alter_configs([res])[res].result(15)
        both(True, 4)
        ck.delete_topics([topic])[topic].result(15)
        both(False, None)
        ck.create_topics([NewTopic(topic, 2, 1)])[topic].result(15)  # the same name again: a new topic id
        both(True, 2)
    finally:
        kp.close()

"""Client quotas: AlterClientQuotas / DescribeClientQuotas and byte-rate throttling of real clients."""

from __future__ import annotations

import json
import socket
import struct
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from kbroker.protocol import codec
from kbroker.protocol.messages import (
    AlterClientQuotasRequest,
    DescribeClientQuotasRequest,
    RequestHeader,
)

from tests.broker_process import BrokerProcess
from tests.clients import KpRaw


def _raw(bootstrap: str, api_key: int, version: int, body: object) -> object:
    host, port = bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(codec.encode_request(RequestHeader(api_key, version, 1, "quota-test"), body))
        (size,) = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))
        frame = s.recv(size, socket.MSG_WAITALL)
    return codec.decode_response(api_key, version, frame)[1]


def _alter_kafka_python(bootstrap: str, client_id: str | None, key: str, value: float | None) -> int:
    from kafka.protocol.admin import AlterClientQuotasRequest as KAlter

    E = KAlter.EntryData
    entry = E(entity=[E.EntityData(entity_type="client-id", entity_name=client_id)],
              ops=[E.OpData(key=key, value=value or 0.0, remove=value is None)])
    req = KAlter[1](entries=[entry], validate_only=False)
    with KpRaw(bootstrap) as raw:
        resp = raw.send(req)
    return int(resp.entries[0].error_code)


def _describe(bootstrap: str) -> dict[str | None, dict[str, float]]:
    r = _raw(bootstrap, 48, 1, DescribeClientQuotasRequest(components=[], strict=False))
    assert r.error_code == 0  # type: ignore[attr-defined]
    return {e.entity[0].entity_name: {v.key: v.value for v in e.values} for e in r.entries}  # type: ignore[attr-defined]


def test_alter_and_describe_client_quotas(broker: BrokerProcess) -> None:
    assert _alter_kafka_python(broker.bootstrap, "quota-a", "producer_byte_rate", 1048576.0) == 0
    assert _alter_kafka_python(broker.bootstrap, None, "consumer_byte_rate", 2048.0) == 0
    quotas = _describe(broker.bootstrap)
    assert quotas["quota-a"] == {"producer_byte_rate": 1048576.0}
    assert quotas[None] == {"consumer_byte_rate": 2048.0}

    # kafka-python's DescribeClientQuotas sees the same, with an exact-match filter.
    from kafka.protocol.admin import DescribeClientQuotasRequest as KDescribe

    with KpRaw(broker.bootstrap) as raw:
        component = KDescribe.ComponentData(entity_type="client-id", match_type=0, match="quota-a")
        resp = raw.send(KDescribe[1](components=[component], strict=True))
    assert resp.error_code == 0
    assert [(e.entity[0].entity_name, [(v.key, v.value) for v in e.values]) for e in resp.entries] == [
        ("quota-a", [("producer_byte_rate", 1048576.0)])
    ]
    # match type 1 = the default entity only
    r = _raw(broker.bootstrap, 48, 1, DescribeClientQuotasRequest(
        components=[DescribeClientQuotasRequest.ComponentData(entity_type="client-id", match_type=1, match=None)],
        strict=True))
    assert [e.entity[0].entity_name for e in r.entries] == [None]  # type: ignore[attr-defined]

    # Bad input is refused per entry; removing a quota removes it.
    assert _alter_kafka_python(broker.bootstrap, "quota-a", "no_such_quota", 5.0) == 42
    assert _alter_kafka_python(broker.bootstrap, "quota-a", "request_percentage", -5.0) == 42
    assert _alter_kafka_python(broker.bootstrap, "quota-a", "producer_byte_rate", -1.0) == 42
    bad_entity = _raw(broker.bootstrap, 49, 1, AlterClientQuotasRequest(entries=[AlterClientQuotasRequest.EntryData(
        entity=[AlterClientQuotasRequest.EntityData(entity_type="user", entity_name="alice")],
        ops=[AlterClientQuotasRequest.OpData(key="producer_byte_rate", value=10.0, remove=False)])]))
    assert bad_entity.entries[0].error_code == 42  # type: ignore[attr-defined]
    assert _alter_kafka_python(broker.bootstrap, "quota-a", "producer_byte_rate", None) == 0
    assert _alter_kafka_python(broker.bootstrap, None, "consumer_byte_rate", None) == 0
    assert _describe(broker.bootstrap) == {}


def test_quotas_survive_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    b = BrokerProcess(tmp_path)
    b.start()
    try:
        assert _alter_kafka_python(b.bootstrap, "kept", "consumer_byte_rate", 4096.0) == 0
        b.restart()
        assert _describe(b.bootstrap) == {"kept": {"consumer_byte_rate": 4096.0}}
    finally:
        b.stop()


def _stats_throttle(stats_json: str) -> float:
    stats = json.loads(stats_json)
    return max((b.get("throttle", {}).get("max", 0) for b in stats.get("brokers", {}).values()), default=0)


def test_producer_over_its_byte_rate_is_throttled(broker: BrokerProcess) -> None:
    topic = "quota-produce"
    assert _alter_kafka_python(broker.bootstrap, "slow-producer", "producer_byte_rate", 100_000.0) == 0
    throttles: list[float] = []
    p = Producer({"bootstrap.servers": broker.bootstrap, "client.id": "slow-producer", "linger.ms": 5,
                  "statistics.interval.ms": 100, "stats_cb": lambda s: throttles.append(_stats_throttle(s))})
    # 1.6 MB at once: 160 kB/s over the 10 s minimum window, 60% over the quota.
    for _ in range(160):
        p.produce(topic, value=b"q" * 10_000)
    t0 = time.monotonic()
    assert p.flush(60) == 0
    deadline = time.monotonic() + 5
    while max(throttles, default=0) <= 0 and time.monotonic() < deadline:
        p.poll(0.1)
    assert max(throttles, default=0) > 0, "librdkafka never saw throttle_time_ms"
    # The throttled connection is muted (and the client backs off), so the next produce waits.
    t1 = time.monotonic()
    p.produce(topic, value=b"after")
    assert p.flush(30) == 0
    assert time.monotonic() - t1 > 0.5, f"next produce took {time.monotonic() - t1:.3f}s, flush took {t1 - t0:.3f}s"
    _alter_kafka_python(broker.bootstrap, "slow-producer", "producer_byte_rate", None)


def test_consumer_over_its_byte_rate_is_throttled(broker: BrokerProcess) -> None:
    topic = "quota-fetch"
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for _ in range(600):
        p.produce(topic, value=b"f" * 10_000)
    assert p.flush(30) == 0

    def read_for(client_id: str, seconds: float) -> int:
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": client_id, "client.id": client_id,
                      "enable.auto.commit": False, "fetch.wait.max.ms": 50})
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        n = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            m = c.poll(0.1)
            if m is not None and not m.error():
                n += len(m.value())
        c.close()
        return n

    assert _alter_kafka_python(broker.bootstrap, "slow-consumer", "consumer_byte_rate", 200_000.0) == 0
    free = read_for("free-consumer", 2.0)
    limited = read_for("slow-consumer", 2.0)
    assert free == 6_000_000
    assert limited < free / 2, f"throttled consumer read {limited} bytes, unthrottled {free}"
    _alter_kafka_python(broker.bootstrap, "slow-consumer", "consumer_byte_rate", None)


def test_client_over_its_request_percentage_is_throttled(broker: BrokerProcess) -> None:
    # Kafka's request-time quota: 0.01 % of one request handler's time (100 us per second) is spent within a few
    # Metadata requests; every later response carries throttle_time_ms and the connection waits that long. Another
    # client id (no quota) is not throttled, and ApiVersions is exempt.
    from kbroker.protocol.messages import ApiVersionsRequest, MetadataRequest

    assert _alter_kafka_python(broker.bootstrap, "busy-client", "request_percentage", 0.01) == 0
    try:
        assert _describe(broker.bootstrap)["busy-client"] == {"request_percentage": 0.01}

        def metadata_throttles(client_id: str, n: int) -> tuple[list[int], float]:
            host, port = broker.bootstrap.split(":")
            out: list[int] = []
            with socket.create_connection((host, int(port)), timeout=30) as s:
                started = time.monotonic()
                for cid in range(1, n + 1):
                    s.sendall(codec.encode_request(RequestHeader(3, 12, cid, client_id),
                                                   MetadataRequest(topics=None)))
                    (size,) = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))
                    got_cid, resp = codec.decode_response(3, 12, s.recv(size, socket.MSG_WAITALL))
                    assert got_cid == cid
                    out.append(resp.throttle_time_ms)
                    if resp.throttle_time_ms:
                        break
                # the connection is muted for the throttle time: the next answer (exempt ApiVersions) waits
                s.sendall(codec.encode_request(RequestHeader(18, 3, 999, client_id), ApiVersionsRequest(
                    client_software_name="t", client_software_version="1")))
                (size,) = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))
                _, versions = codec.decode_response(18, 3, s.recv(size, socket.MSG_WAITALL))
                assert versions.throttle_time_ms == 0
                return out, time.monotonic() - started

        throttles, took = metadata_throttles("busy-client", 200)
        assert throttles[-1] > 0, throttles
        assert took >= throttles[-1] / 1000 * 0.8, (took, throttles[-1])
        free, _ = metadata_throttles("free-client", 20)
        assert free == [0] * 20
    finally:
        assert _alter_kafka_python(broker.bootstrap, "busy-client", "request_percentage", None) == 0

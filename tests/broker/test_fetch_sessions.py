"""KIP-227 incremental fetch sessions over real sockets, raw frames built with protocol.codec: a session made by a
full fetch, incremental fetches answering only what changed, forgotten topics, session errors, closing, a full
cache, a long poll woken by a partition the request did not name, topic-id sessions (v13+), and the gauges."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import FetchRequest, MetadataRequest
from kbroker.protocol.records import iter_batch_headers

from tests.broker_process import BrokerProcess, free_port
from tests.clients import Msg, RawClient, ck_produce, wait_until

T = 15
V_NAMES, V_IDS = 12, 17
FINAL = -1


@pytest.fixture(scope="module")
def sbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, int]]:
    """A broker with the metrics endpoint, for the session gauges."""
    port = free_port()
    b = BrokerProcess(tmp_path_factory.mktemp("fetch-sessions"), {"metrics.port": str(port),
                                                                  "metrics.host": "127.0.0.1"})
    b.start()
    yield b, port
    b.stop()


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the result is in
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(T)


def produce(bootstrap: str, topic: str, per_partition: dict[int, int], tag: str = "v") -> None:
    msgs = [Msg(b"k", f"{tag}-{p}-{i}".encode(), partition=p) for p, n in per_partition.items() for i in range(n)]
    ck_produce(bootstrap, topic, msgs)


def topic_id(raw: RawClient, topic: str) -> bytes:
    resp = raw.request(3, 12, MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)]))
    [t] = resp.topics
    assert t.error_code == 0
    return t.topic_id


def fetch(raw: RawClient, version: int, session_id: int, epoch: int, parts: list[tuple[Any, int, int]],
          forgotten: list[tuple[Any, int]] = (), max_wait_ms: int = 0, min_bytes: int = 1) -> Any:
    """parts: (topic name, or topic id from v13, partition, fetch offset)."""
    by_id = version >= 13
    topics: dict[Any, list[FetchRequest.FetchPartition]] = {}
    for t, p, offset in parts:
        topics.setdefault(t, []).append(FetchRequest.FetchPartition(partition=p, fetch_offset=offset,
                                                                    partition_max_bytes=1 << 20))
    gone: dict[Any, list[int]] = {}
    for t, p in forgotten:
        gone.setdefault(t, []).append(p)
    req = FetchRequest(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=50 << 20,
                       isolation_level=0, session_id=session_id, session_epoch=epoch,
                       topics=[FetchRequest.FetchTopic(topic="" if by_id else t, topic_id=t if by_id else b"\0" * 16,
                                                       partitions=ps) for t, ps in topics.items()],
                       forgotten_topics_data=[FetchRequest.ForgottenTopic(topic="" if by_id else t,
                                                                          topic_id=t if by_id else b"\0" * 16,
                                                                          partitions=ps) for t, ps in gone.items()])
    return raw.request(1, version, req)


def answered(resp: Any) -> dict[int, Any]:
    """partition -> PartitionData (the tests use one topic per session)."""
    return {p.partition_index: p for t in resp.responses for p in t.partitions}


def record_count(pd: Any) -> int:
    return sum(h.last_offset_delta + 1 for _, h in iter_batch_headers(pd.records or b""))


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
            if line.startswith("kafka_server_fetchsessioncache_")}


def test_full_fetch_creates_a_session_and_incremental_fetches_answer_only_changes(sbroker, topic_name):
    b, _ = sbroker
    create_topic(b.bootstrap, topic_name, 4)
    produce(b.bootstrap, topic_name, {0: 3, 1: 2, 2: 1, 3: 4})
    with RawClient(b.bootstrap) as raw:
        full = fetch(raw, V_NAMES, 0, 0, [(topic_name, p, 0) for p in range(4)])
        assert full.error_code == 0 and full.session_id != 0
        sid = full.session_id
        got = answered(full)
        assert {p: record_count(d) for p, d in got.items()} == {0: 3, 1: 2, 2: 1, 3: 4}

        # The client moves its offsets to the ends: nothing new, so nothing in the answer.
        inc = fetch(raw, V_NAMES, sid, 1, [(topic_name, p, n) for p, n in {0: 3, 1: 2, 2: 1, 3: 4}.items()])
        assert (inc.error_code, inc.session_id, inc.responses) == (0, sid, [])

        # Records on partition 2 only: the answer names partition 2 alone, though the request names nothing.
        produce(b.bootstrap, topic_name, {2: 5})
        inc = fetch(raw, V_NAMES, sid, 2, [])
        got = answered(inc)
        assert list(got) == [2] and record_count(got[2]) == 5 and got[2].high_watermark == 6
        # Its high watermark was sent: with the offset moved on, the partition is quiet again.
        inc = fetch(raw, V_NAMES, sid, 3, [(topic_name, 2, 6)])
        assert (inc.error_code, inc.responses) == (0, [])


def test_forgotten_partitions_leave_the_session(sbroker, topic_name):
    b, port = sbroker
    create_topic(b.bootstrap, topic_name, 3)
    with RawClient(b.bootstrap) as raw:
        sid = fetch(raw, V_NAMES, 0, 0, [(topic_name, p, 0) for p in range(3)]).session_id
        assert sid != 0
        assert scrape(port)["kafka_server_fetchsessioncache_numincrementalfetchpartitionscached"] >= 3
        inc = fetch(raw, V_NAMES, sid, 1, [], forgotten=[(topic_name, 1), (topic_name, 2)])
        assert (inc.error_code, inc.responses) == (0, [])
        produce(b.bootstrap, topic_name, {0: 1, 1: 1, 2: 1})
        got = answered(fetch(raw, V_NAMES, sid, 2, []))
        assert list(got) == [0] and record_count(got[0]) == 1
        # Named again, a forgotten partition is back in the session. (The session keeps the fetch offsets the
        # client sent: partition 0 would answer its record again unless its new offset is sent.)
        got = answered(fetch(raw, V_NAMES, sid, 3, [(topic_name, 0, 1), (topic_name, 1, 0)]))
        assert list(got) == [1] and record_count(got[1]) == 1


def test_session_errors_wrong_epoch_and_unknown_id(sbroker, topic_name):
    b, _ = sbroker
    create_topic(b.bootstrap, topic_name, 1)
    produce(b.bootstrap, topic_name, {0: 2})
    with RawClient(b.bootstrap) as raw:
        sid = fetch(raw, V_NAMES, 0, 0, [(topic_name, 0, 2)]).session_id
        assert sid != 0
        for epoch in (2, 7):
            bad = fetch(raw, V_NAMES, sid, epoch, [(topic_name, 0, 0)])
            assert (bad.error_code, bad.session_id, bad.responses) == (ErrorCode.INVALID_FETCH_SESSION_EPOCH, 0, [])
        unknown = fetch(raw, V_NAMES, sid ^ 0x5A5A5A5A or 1, 1, [(topic_name, 0, 0)])
        assert (unknown.error_code, unknown.responses) == (ErrorCode.FETCH_SESSION_ID_NOT_FOUND, [])
        # Errors leave the session as it was: epoch 1 is still the next one.
        ok = fetch(raw, V_NAMES, sid, 1, [(topic_name, 0, 0)])
        assert ok.error_code == 0 and ok.session_id == sid and record_count(answered(ok)[0]) == 2
        # A session made with names cannot go on with topic ids (v13+).
        wrong_kind = fetch(raw, V_IDS, sid, 2, [])
        assert wrong_kind.error_code == ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR


def test_session_survives_a_reconnect_and_epoch_minus_one_closes_it(sbroker, topic_name):
    b, _ = sbroker
    create_topic(b.bootstrap, topic_name, 2)
    produce(b.bootstrap, topic_name, {0: 1, 1: 1})
    with RawClient(b.bootstrap) as raw:
        sid = fetch(raw, V_NAMES, 0, 0, [(topic_name, 0, 1), (topic_name, 1, 1)]).session_id
    with RawClient(b.bootstrap) as raw:  # another connection, the same session
        produce(b.bootstrap, topic_name, {1: 1})
        got = answered(fetch(raw, V_NAMES, sid, 1, []))
        assert list(got) == [1] and record_count(got[1]) == 1
        # epoch -1 closes it: a full answer (every partition requested), no session id.
        closing = fetch(raw, V_NAMES, sid, FINAL, [(topic_name, 0, 0), (topic_name, 1, 0)])
        assert closing.error_code == 0 and closing.session_id == 0
        assert {p: record_count(d) for p, d in answered(closing).items()} == {0: 1, 1: 2}
        gone = fetch(raw, V_NAMES, sid, 2, [])
        assert gone.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
        # Session id 0 with epoch -1: a sessionless full fetch.
        sessionless = fetch(raw, V_NAMES, 0, FINAL, [(topic_name, 0, 0)])
        assert sessionless.session_id == 0 and record_count(answered(sessionless)[0]) == 1


def test_long_poll_wakes_on_a_session_partition_the_request_does_not_name(sbroker, topic_name):
    b, _ = sbroker
    create_topic(b.bootstrap, topic_name, 4)
    with RawClient(b.bootstrap, timeout=30) as raw:
        sid = fetch(raw, V_NAMES, 0, 0, [(topic_name, p, 0) for p in range(4)]).session_id
        assert sid != 0

        def later() -> None:
            time.sleep(1.0)
            produce(b.bootstrap, topic_name, {3: 1})

        t = threading.Thread(target=later)
        t.start()
        started = time.monotonic()
        # Names partition 0 only, waits up to 20 s for a byte.
        inc = fetch(raw, V_NAMES, sid, 1, [(topic_name, 0, 0)], max_wait_ms=20_000, min_bytes=1)
        waited = time.monotonic() - started
        t.join()
        got = answered(inc)
        assert inc.error_code == 0 and list(got) == [3] and record_count(got[3]) == 1
        assert 0.8 <= waited < 10, waited
        # And with nothing to come, the wait lasts max_wait_ms and the answer is empty.
        started = time.monotonic()
        inc = fetch(raw, V_NAMES, sid, 2, [(topic_name, 3, 1)], max_wait_ms=700)
        assert inc.responses == [] and time.monotonic() - started >= 0.6


def test_topic_id_sessions(sbroker, topic_name):
    b, _ = sbroker
    create_topic(b.bootstrap, topic_name, 2)
    produce(b.bootstrap, topic_name, {0: 2, 1: 1})
    unknown_id = b"\x42" * 16
    with RawClient(b.bootstrap) as raw:
        tid = topic_id(raw, topic_name)
        full = fetch(raw, V_IDS, 0, 0, [(tid, 0, 0), (tid, 1, 0), (unknown_id, 0, 0)])
        sid = full.session_id
        assert full.error_code == 0 and sid != 0
        by = {(t.topic_id, p.partition_index): p for t in full.responses for p in t.partitions}
        assert record_count(by[(tid, 0)]) == 2 and record_count(by[(tid, 1)]) == 1
        assert by[(unknown_id, 0)].error_code == ErrorCode.UNKNOWN_TOPIC_ID
        # The unknown id's partition stays in the session and answers its error every time; the rest is quiet.
        inc = fetch(raw, V_IDS, sid, 1, [(tid, 0, 2), (tid, 1, 1)])
        by = {(t.topic_id, p.partition_index): p for t in inc.responses for p in t.partitions}
        assert list(by) == [(unknown_id, 0)] and by[(unknown_id, 0)].error_code == ErrorCode.UNKNOWN_TOPIC_ID
        inc = fetch(raw, V_IDS, sid, 2, [], forgotten=[(unknown_id, 0)])
        assert inc.error_code == 0 and inc.responses == []
        # A v12 request cannot continue a topic-id session.
        assert fetch(raw, V_NAMES, sid, 3, []).error_code == ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR

        # The topic deleted and created again under its name: a new id, so the session's partitions are
        # inconsistent (Kafka's INCONSISTENT_TOPIC_ID), while a new session by the new id reads the new topic.
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.delete_topics([topic_name])[topic_name].result(T)
        wait_until(lambda: topic_name not in admin.list_topics(timeout=T).topics, what="topic deleted")
        create_topic(b.bootstrap, topic_name, 2)
        new_tid = topic_id(raw, topic_name)
        assert new_tid != tid
        inc = fetch(raw, V_IDS, sid, 3, [])
        errors = {p.partition_index: p.error_code for t in inc.responses for p in t.partitions}
        assert errors == {0: ErrorCode.INCONSISTENT_TOPIC_ID, 1: ErrorCode.INCONSISTENT_TOPIC_ID}
        fresh = fetch(raw, V_IDS, 0, 0, [(new_tid, 0, 0)])
        assert answered(fresh)[0].error_code == 0 and answered(fresh)[0].high_watermark == 0


def test_gauges_count_sessions_and_partitions(sbroker, topic_name):
    b, port = sbroker
    create_topic(b.bootstrap, topic_name, 5)
    before = scrape(port)
    with RawClient(b.bootstrap) as raw:
        sid = fetch(raw, V_NAMES, 0, 0, [(topic_name, p, 0) for p in range(5)]).session_id
        mid = scrape(port)
        assert mid["kafka_server_fetchsessioncache_numincrementalfetchsessions"] == \
            before["kafka_server_fetchsessioncache_numincrementalfetchsessions"] + 1
        assert mid["kafka_server_fetchsessioncache_numincrementalfetchpartitionscached"] == \
            before["kafka_server_fetchsessioncache_numincrementalfetchpartitionscached"] + 5
        fetch(raw, V_NAMES, sid, FINAL, [])
    after = scrape(port)
    assert after["kafka_server_fetchsessioncache_numincrementalfetchsessions"] == \
        before["kafka_server_fetchsessioncache_numincrementalfetchsessions"]
    assert after["kafka_server_fetchsessioncache_incrementalfetchsessionevictions_total"] == 0


def test_full_cache_answers_session_id_zero(tmp_path, topic_name):
    b = BrokerProcess(tmp_path, {"max.incremental.fetch.session.cache.slots": "2"})
    b.start()
    try:
        create_topic(b.bootstrap, topic_name, 3)
        produce(b.bootstrap, topic_name, {0: 1})
        with RawClient(b.bootstrap) as raw:
            first = fetch(raw, V_NAMES, 0, 0, [(topic_name, 0, 0)]).session_id
            second = fetch(raw, V_NAMES, 0, 0, [(topic_name, 1, 0)]).session_id
            assert 0 not in (first, second) and first != second
            # Full, and both sessions younger than the 120 s eviction time: even a larger session gets none,
            # and its full answer is still whole.
            third = fetch(raw, V_NAMES, 0, 0, [(topic_name, p, 0) for p in range(3)])
            assert third.error_code == 0 and third.session_id == 0
            assert record_count(answered(third)[0]) == 1 and sorted(answered(third)) == [0, 1, 2]
            # The first two still work; closing one makes room.
            assert fetch(raw, V_NAMES, first, 1, []).error_code == 0
            fetch(raw, V_NAMES, second, FINAL, [])
            assert fetch(raw, V_NAMES, 0, 0, [(topic_name, 2, 0)]).session_id not in (0, first)
        assert "Fetch session cache full" in b.read_log()
    finally:
        b.stop()


def test_bad_slot_count_stops_startup(tmp_path):
    b = BrokerProcess(tmp_path, {"max.incremental.fetch.session.cache.slots": "-1"})
    with pytest.raises(RuntimeError, match="max.incremental.fetch.session.cache.slots"):
        b.start()


def test_kafka_python_reads_many_partitions_exactly_once_through_a_session(sbroker, topic_name, caplog):
    """kafka-python's FetchSessionHandler against the broker: 60 partitions read while a producer keeps writing,
    every record exactly once and in order; its log shows the session made and incremental responses that left
    unchanged partitions out, and the broker's gauges show the session while the consumer is open."""
    import logging

    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    b, port = sbroker
    partitions, n = 60, 12_000
    create_topic(b.bootstrap, topic_name, partitions)
    before = scrape(port)
    caplog.set_level(logging.DEBUG, logger="kafka.consumer.fetcher")
    produced: list[Exception] = []

    def producing() -> None:
        try:
            for step in range(0, n, 1000):  # in steps, so that fetches meet quiet and busy partitions
                ck_produce(b.bootstrap, topic_name, [Msg(b"k", b"%d" % i, partition=i % partitions)
                                                     for i in range(step, step + 1000)])
                time.sleep(0.05)
        except Exception as e:  # noqa: BLE001 - reported by the test thread
            produced.append(e)

    c = KafkaConsumer(bootstrap_servers=b.bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest", fetch_max_wait_ms=100)
    try:
        c.assign([KTP(topic_name, p) for p in range(partitions)])
        c.poll(timeout_ms=200)
        writer = threading.Thread(target=producing)
        writer.start()
        seen: dict[int, tuple[int, int]] = {}  # record index -> (partition, offset)
        deadline = time.monotonic() + 90
        while len(seen) < n and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500, max_records=5000).values():
                for r in recs:
                    i = int(r.value)
                    assert i not in seen, f"record {i} read twice"
                    seen[i] = (r.partition, r.offset)
        writer.join(60)
        assert not produced, produced
        assert sorted(seen) == list(range(n))
        assert all(seen[i] == (i % partitions, i // partitions) for i in range(n))
        assert not [r for recs in c.poll(timeout_ms=500).values() for r in recs]
        during = scrape(port)
        assert during["kafka_server_fetchsessioncache_numincrementalfetchsessions"] >= \
            before["kafka_server_fetchsessioncache_numincrementalfetchsessions"] + 1
        assert during["kafka_server_fetchsessioncache_numincrementalfetchpartitionscached"] >= \
            before["kafka_server_fetchsessioncache_numincrementalfetchpartitionscached"] + partitions
    finally:
        c.close()
    messages = [r.getMessage() for r in caplog.records if r.name == "kafka.consumer.fetcher"]
    created = [m for m in messages if "created a new incremental fetch session" in m]
    incremental = [m for m in messages if "sent an incremental fetch response for session" in m]
    implied = [int(m.rsplit("(", 1)[1].split()[0]) for m in incremental]
    assert len(created) == 1, created
    assert len(incremental) >= 10 and max(implied) >= partitions - 5, (len(incremental), implied[:20])
    assert not [m for m in messages if "invalid" in m or "closing session" in m]

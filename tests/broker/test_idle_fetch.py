"""The idle long poll's direct path (broker/idle_fetch.py).

- The same Fetch frames sent to a broker with the direct path and to one without it (KBROKER_IDLE_FETCH=0: the
  general handle_fetch for every request) get identical answers: idle requests at every version 4-17, repeated and
  with their partitions rotated (the plan's cached answers), read_committed, and the requests the direct path hands
  to the general one (data to return, an offset out of range, an unknown partition, a fenced leader epoch, a
  partition named twice, no wait, a session). The topics get other ids on each broker: the answers are compared
  with the ids swapped.
- A fetch session's incremental Fetches (KIP-227) likewise, at v7, v12 and v17: idle ones, epoch errors, data,
  a parked one woken by data; kafka-python's consumer (sessions) reads the same records from both brokers.
- A parked Fetch is answered with the record as soon as it is produced, and an idle one with an empty answer once
  its max wait is over.
- Real clients (confluent-kafka and kafka-python) waiting with a long fetch.wait.max.ms get a record promptly when
  it is produced, and while idle their Fetch requests are answered after their max wait, not before.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kbroker.protocol import codec
from kbroker.protocol import records as R
from kbroker.protocol.messages import (
    CreateTopicsRequest,
    FetchRequest,
    FetchResponse,
    MetadataRequest,
    ProduceRequest,
)

from tests.broker_process import BrokerProcess
from tests.clients import RawClient, ck_conf, wait_until

F = FetchRequest
NOW = 1_700_000_000_000
TOPICS = {"a": 3, "b": 2}
# The records produced before the Fetches: (topic, partition) -> count; other partitions stay empty.
PRODUCED = {("a", 0): 3, ("a", 1): 2, ("b", 0): 4}


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    direct = BrokerProcess(tmp_path_factory.mktemp("direct")).start()
    general = BrokerProcess(tmp_path_factory.mktemp("general"), env={"KBROKER_IDLE_FETCH": "0"}).start()
    try:
        for b in (direct, general):
            _setup(b)
        yield direct, general
    finally:
        direct.stop()
        general.stop()


def _setup(b: BrokerProcess) -> None:
    with RawClient(b.bootstrap, timeout=15) as c:
        create = CreateTopicsRequest(
            topics=[
                CreateTopicsRequest.CreatableTopic(name=n, num_partitions=k, replication_factor=1)
                for n, k in TOPICS.items()
            ],
            timeout_ms=15000,
        )
        assert all(t.error_code == 0 for t in c.request(19, 7, create).topics)
        for (topic, partition), n in PRODUCED.items():
            _produce(c, topic, partition, n)


def _produce(c: RawClient, topic: str, partition: int, n: int) -> None:
    batch = R.build_batch([(None, b"v%d" % i, (), NOW + i) for i in range(n)])
    req = ProduceRequest(
        transactional_id=None,
        acks=1,
        timeout_ms=5000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic,
                partition_data=[ProduceRequest.PartitionProduceData(index=partition, records=batch)],
            )
        ],
    )
    resp = c.request(0, 9, req)
    assert resp.responses[0].partition_responses[0].error_code == 0


def _topic_ids(c: RawClient) -> dict[str, bytes]:
    meta = c.request(3, 12, MetadataRequest(topics=None, allow_auto_topic_creation=False))
    return {t.name: t.topic_id for t in meta.topics}


# A partition of a Fetch: (topic, partition, fetch offset, current leader epoch).
Part = tuple[str, int, int, int]


def _fetch(
    version: int,
    parts: list[Part],
    ids: dict[str, bytes],
    isolation: int = 0,
    max_wait: int = 20,
    min_bytes: int = 1,
    session: tuple[int, int] = (0, -1),
) -> F:
    topics: list[F.FetchTopic] = []
    for topic, partition, offset, epoch in parts:
        entry = F.FetchPartition(
            partition=partition,
            current_leader_epoch=epoch,
            fetch_offset=offset,
            log_start_offset=-1,
            partition_max_bytes=1 << 20,
        )
        # Consecutive partitions of a topic in one entry, as clients send them.
        if topics and topics[-1].topic == topic:
            topics[-1].partitions.append(entry)
        else:
            topics.append(F.FetchTopic(topic=topic, topic_id=ids[topic], partitions=[entry]))
    return F(
        replica_id=-1,
        max_wait_ms=max_wait,
        min_bytes=min_bytes,
        max_bytes=50 << 20,
        isolation_level=isolation,
        session_id=session[0],
        session_epoch=session[1],
        topics=topics,
    )


IDLE: list[Part] = [("a", 0, 3, -1), ("a", 1, 2, -1), ("a", 2, 0, -1), ("b", 0, 4, -1), ("b", 1, 0, -1)]


def _rotated(parts: list[Part], k: int) -> list[Part]:
    return parts[k:] + parts[:k]


def _requests() -> list[tuple[int, dict[str, Any]]]:
    """(version, _fetch arguments): idle requests the direct path answers (again, rotated, read_committed), then
    the ones it hands to the general path."""
    out: list[tuple[int, dict[str, Any]]] = []
    for v in range(4, 18):
        out += [(v, {"parts": IDLE}), (v, {"parts": IDLE}), (v, {"parts": _rotated(IDLE, 1)})]
    for v in (4, 11, 17):
        out += [(v, {"parts": IDLE, "isolation": 1}), (v, {"parts": _rotated(IDLE, 3), "isolation": 1})]
    # A cycle of two rotations, learned and then recognised by the body expected next (IdleFetch.take), then a frame
    # of the expected one's length that differs from it (data on b-0: the general path's), then the cycle again.
    rot = _rotated(IDLE, 1)
    data = [p if p[:2] != ("b", 0) else ("b", 0, 0, -1) for p in rot]
    out += [(12, {"parts": parts}) for parts in (IDLE, rot, IDLE, rot, IDLE, rot, IDLE, data, rot, IDLE)]
    out += [
        (12, {"parts": [("a", 2, 0, 0), ("b", 1, 0, 0)]}),  # the leader epoch named, and it is this one
        (12, {"parts": IDLE, "max_wait": 0}),
        (12, {"parts": IDLE, "min_bytes": 0}),
        (12, {"parts": [*IDLE[:2], ("b", 0, 0, -1)]}),  # data on b-0
        (13, {"parts": [*IDLE, ("a", 0, 1, -1)]}),  # a partition named twice
        (13, {"parts": [("a", 2, 7, -1)]}),  # an offset past the log end
        (11, {"parts": [("a", 2, 0, -1), ("a", 9, 0, -1)]}),  # a partition that does not exist
        (12, {"parts": [("a", 2, 0, 5)]}),  # a leader epoch ahead of the broker's: fenced
        (12, {"parts": IDLE, "session": (12345, -1)}),  # epoch -1 closing an unknown session: sessionless
        (12, {"parts": IDLE, "isolation": 3}),  # an isolation level Kafka throws on
        (12, {"parts": IDLE}),  # after all of them, the idle request again
        (17, {"parts": _rotated(IDLE, 2)}),
    ]
    return out


def test_direct_and_general_paths_answer_the_same_bytes(brokers: tuple[BrokerProcess, BrokerProcess]) -> None:
    conns = [RawClient(b.bootstrap, timeout=15) for b in brokers]
    ids = [_topic_ids(c) for c in conns]
    swap = [(ids[1][n], ids[0][n]) for n in TOPICS]
    for correlation_id, (version, kwargs) in enumerate(_requests(), start=100):
        for c, topic_ids in zip(conns, ids, strict=True):
            c.send_bytes(_frame(version, correlation_id, _fetch(version, ids=topic_ids, **kwargs)))
        direct, general = (c.recv_frame() for c in conns)
        for theirs, ours in swap:
            general = general.replace(theirs, ours)
        assert direct == general, (version, kwargs, codec.decode_response(1, version, general)[1])
        assert struct.unpack_from(">i", direct)[0] == correlation_id


def _frame(version: int, correlation_id: int, body: Any) -> bytes:
    from kbroker.protocol.messages import RequestHeader

    header = RequestHeader(
        request_api_key=1, request_api_version=version, correlation_id=correlation_id, client_id="t"
    )
    return bytes(codec.encode_request(header, body))


def _records(resp: FetchResponse) -> int:
    return sum(
        len(list(R.iter_batch_headers(bytes(p.records)))) if p.records else 0
        for t in resp.responses
        for p in t.partitions
    )


def test_a_parked_fetch_wakes_with_the_record_and_an_idle_one_answers_after_its_wait(
    brokers: tuple[BrokerProcess, BrokerProcess],
) -> None:
    for b in brokers:
        with RawClient(b.bootstrap, timeout=15) as c, RawClient(b.bootstrap, timeout=15) as p:
            ids = _topic_ids(c)
            end = c.request(1, 12, _fetch(12, [("b", 1, 0, -1)], ids, max_wait=0)).responses[0].partitions[0]
            parts = [("b", 1, end.high_watermark, -1)]
            # Idle: empty, after the wait.
            t0 = time.monotonic()
            resp = c.request(1, 12, _fetch(12, parts, ids, max_wait=300))
            waited = time.monotonic() - t0
            assert 0.28 <= waited < 3.0 and _records(resp) == 0 and resp.error_code == 0
            # Parked, then woken by the produce on another connection.
            c.send_bytes(c.frame(1, 12, _fetch(12, parts, ids, max_wait=20_000)))
            time.sleep(0.2)
            t0 = time.monotonic()
            _produce(p, "b", 1, 2)
            resp = codec.decode_response(1, 12, c.recv_frame())[1]
            assert time.monotonic() - t0 < 3.0
            assert (
                _records(resp) == 1
                and resp.responses[0].partitions[0].high_watermark == end.high_watermark + 2
            )


# ---------------------------------------------------------------- fetch sessions (KIP-227)


def _session_id_zeroed(frame: bytes, version: int) -> bytes:
    """The answer with its session id (random per broker) set to 0: after the correlation id, the header's tagged
    fields (v12+), throttle_time_ms and error_code."""
    at = 4 + (1 if version >= 12 else 0) + 4 + 2
    return frame[:at] + bytes(4) + frame[at + 4 :]


def _incremental(
    version: int, session: tuple[int, int], parts: list[Part], ids: dict[str, bytes], max_wait: int = 20
) -> F:
    return _fetch(version, parts, ids, max_wait=max_wait, session=session)


@pytest.mark.parametrize("version", [7, 12, 17])
def test_session_fetches_answer_as_the_general_path(
    brokers: tuple[BrokerProcess, BrokerProcess], version: int
) -> None:
    """A fetch session over the two partitions of a topic of its own, as the Java client and kafka-python drive one:
    the full fetch that creates it; idle incremental Fetches naming no partition (the direct path's once planned);
    a repeated epoch (INVALID_FETCH_SESSION_EPOCH) and an unknown session id (FETCH_SESSION_ID_NOT_FOUND), after which
    the session goes on; a record produced (the next incremental answer carries it), its partition's new offset
    sent, idle again; a parked incremental Fetch woken by a record. Both brokers give the same bytes but the session
    ids (and the topic ids, swapped)."""
    topic = f"sess{version}"
    for b in brokers:
        _new_topic(b, topic)
    conns = [RawClient(b.bootstrap, timeout=15) for b in brokers]
    producers = [RawClient(b.bootstrap, timeout=15) for b in brokers]
    ids = [_topic_ids(c) for c in conns]
    swap = [(ids[1][n], ids[0][n]) for n in [*TOPICS, topic]]
    correlation = iter(range(1000, 2000))

    def exchange(
        make: Callable[[dict[str, bytes], int], F], check: Callable[[FetchResponse], bool]
    ) -> list[FetchResponse]:
        cid = next(correlation)
        for c, topic_ids, sid in zip(conns, ids, sessions, strict=True):
            c.send_bytes(_frame(version, cid, make(topic_ids, sid)))
        answers = [c.recv_frame() for c in conns]
        direct, general = (_session_id_zeroed(a, version) for a in answers)
        for theirs, ours in swap:
            general = general.replace(theirs, ours)
        decoded = [codec.decode_response(1, version, a)[1] for a in answers]
        assert direct == general, (version, decoded[1])
        assert all(check(r) for r in decoded), decoded[0]
        return decoded

    def idle(r: FetchResponse) -> bool:
        return r.error_code == 0 and not r.responses

    sessions = [0, 0]
    created = exchange(
        lambda i, _: _incremental(version, (0, 0), [(topic, 0, 0, -1), (topic, 1, 0, -1)], i),
        lambda r: r.error_code == 0 and r.session_id != 0 and _records(r) == 0,
    )
    sessions = [r.session_id for r in created]
    epoch = 1
    for _ in range(4):
        exchange(lambda i, s, e=epoch: _incremental(version, (s, e), [], i), idle)
        epoch += 1
    # The epoch just used again, then an unknown session: errors, and the session is still at its epoch.
    exchange(lambda i, s: _incremental(version, (s, epoch - 1), [], i), lambda r: r.error_code == 71)
    exchange(lambda i, s: _incremental(version, (s ^ 0x5A5A, epoch), [], i), lambda r: r.error_code == 70)
    exchange(lambda i, s, e=epoch: _incremental(version, (s, e), [], i), idle)
    epoch += 1
    for p in producers:
        _produce(p, topic, 0, 2)
    exchange(lambda i, s: _incremental(version, (s, epoch), [], i), lambda r: _records(r) == 1)
    epoch += 1
    # The client's new position on partition 0 (altered), then idle again.
    exchange(lambda i, s: _incremental(version, (s, epoch), [(topic, 0, 2, -1)], i), idle)
    epoch += 1
    for _ in range(3):
        exchange(lambda i, s, e=epoch: _incremental(version, (s, e), [], i), idle)
        epoch += 1
    # Parked for 20 s, woken by a record on partition 1.
    cid = next(correlation)
    for c, topic_ids, sid in zip(conns, ids, sessions, strict=True):
        c.send_bytes(
            _frame(version, cid, _incremental(version, (sid, epoch), [], topic_ids, max_wait=20_000))
        )
    time.sleep(0.3)
    t0 = time.monotonic()
    for p in producers:
        _produce(p, topic, 1, 1)
    answers = [c.recv_frame() for c in conns]
    assert time.monotonic() - t0 < 5.0
    direct, general = (_session_id_zeroed(a, version) for a in answers)
    for theirs, ours in swap:
        general = general.replace(theirs, ours)
    assert direct == general
    assert _records(codec.decode_response(1, version, answers[0])[1]) == 1
    epoch += 1
    exchange(lambda i, s: _incremental(version, (s, epoch), [(topic, 1, 1, -1)], i), idle)
    epoch += 1
    exchange(lambda i, s, e=epoch: _incremental(version, (s, e), [], i), idle)
    for c in (*conns, *producers):
        c.close()


def test_a_parked_session_fetch_overtaken_on_another_connection(
    brokers: tuple[BrokerProcess, BrokerProcess],
) -> None:
    """An idle incremental Fetch parks on one connection; the session's next epoch comes on another connection
    meanwhile and is answered; the parked one then answers INVALID_FETCH_SESSION_EPOCH at the end of its wait (the
    general path's update_and_generate), and the session goes on at the epoch after the second: the same on both
    brokers."""
    version = 12
    topic = "overtaken"
    for b in brokers:
        _new_topic(b, topic)
    firsts = [RawClient(b.bootstrap, timeout=15) for b in brokers]
    seconds = [RawClient(b.bootstrap, timeout=15) for b in brokers]
    ids = [_topic_ids(c) for c in firsts]
    sessions = []
    for c, i in zip(firsts, ids, strict=True):
        created = c.request(
            1, version, _fetch(version, [(topic, 0, 0, -1), (topic, 1, 0, -1)], i, session=(0, 0))
        )
        sessions.append(created.session_id)
    outcomes: list[list[FetchResponse]] = [[], []]
    for k, (first, second, i, sid) in enumerate(zip(firsts, seconds, ids, sessions, strict=True)):
        for epoch in (1, 2):  # planned, then taken from the plan
            outcomes[k].append(first.request(1, version, _incremental(version, (sid, epoch), [], i)))
        first.send_bytes(first.frame(1, version, _incremental(version, (sid, 3), [], i, max_wait=1500)))
        time.sleep(0.3)
        outcomes[k].append(second.request(1, version, _incremental(version, (sid, 4), [], i, max_wait=0)))
        outcomes[k].append(codec.decode_response(1, version, first.recv_frame())[1])
        outcomes[k].append(first.request(1, version, _incremental(version, (sid, 5), [], i)))
    for rs, sid in zip(outcomes, sessions, strict=True):
        assert [(r.error_code, r.session_id == sid, len(r.responses)) for r in rs] == [
            (0, True, 0),
            (0, True, 0),
            (0, True, 0),
            (71, True, 0),
            (0, True, 0),
        ], rs
    for c in (*firsts, *seconds):
        c.close()


def test_kafka_python_sessions_read_the_same_on_both_paths(
    brokers: tuple[BrokerProcess, BrokerProcess], topic_name: str
) -> None:
    """kafka-python's consumer (incremental fetch sessions, Fetch v12) long-polls an idle topic on each broker, then
    gets the records produced meanwhile: the same records at the same offsets from both, promptly."""
    got: list[list[tuple[int, int, bytes]]] = []
    for b in brokers:
        _new_topic(b, topic_name)
        kp = _kafka_python_waiter(b.bootstrap, topic_name, 2_000)
        try:
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:  # idle incremental Fetches, parked
                assert not kp.poll(timeout_ms=200)
            with RawClient(b.bootstrap, timeout=15) as p:
                _produce(p, topic_name, 0, 2)
                _produce(p, topic_name, 1, 1)
            t0 = time.monotonic()
            seen: list[tuple[int, int, bytes]] = []
            while len(seen) < 3 and time.monotonic() - t0 < 10:
                for tp, recs in kp.poll(timeout_ms=200).items():
                    seen += [(tp.partition, r.offset, r.value) for r in recs]
            assert time.monotonic() - t0 < 5.0
            got.append(sorted(seen))
        finally:
            kp.close()
    assert got[0] == got[1] and len(got[0]) == 3, got


def test_idle_fetches_are_counted_once_each(tmp_path_factory: pytest.TempPathFactory) -> None:
    """RequestMetrics count every Fetch the direct path answers, once: planned, taken before the dispatch, answered
    at once (no wait) or after the wait, a session's; the latency histogram counts the same requests."""
    from tests.broker.test_metrics import scrape, value
    from tests.broker_process import free_port, wait_for_port

    port = free_port()
    b = BrokerProcess(tmp_path_factory.mktemp("metrics"), {"metrics.port": str(port)}).start()
    try:
        wait_for_port(port)
        _new_topic(b, "counted")
        with RawClient(b.bootstrap, timeout=15) as c:
            ids = _topic_ids(c)
            parts: list[Part] = [("counted", 0, 0, -1), ("counted", 1, 0, -1)]
            before = scrape(port)
            sent = 0
            for k in range(6):
                c.request(1, 12, _fetch(12, _rotated(parts, k), ids, max_wait=10))
                sent += 1
            for _ in range(4):
                c.request(1, 16, _fetch(16, parts, ids, max_wait=0))
                sent += 1
            sid = c.request(1, 12, _fetch(12, parts, ids, max_wait=10, session=(0, 0))).session_id
            sent += 1
            for epoch in range(1, 6):
                assert c.request(1, 12, _incremental(12, (sid, epoch), [], ids, max_wait=10)).error_code == 0
                sent += 1
            after = scrape(port)
    finally:
        b.stop()
    requests = "kafka_network_requestmetrics_requests_total"
    count = "kafka_network_requestmetrics_totaltimems_count"
    assert value(after, requests, request="Fetch") - value(before, requests, request="Fetch") == sent
    assert value(after, count, request="Fetch") == value(after, requests, request="Fetch")
    assert value(
        after, "kafka_network_requestmetrics_totaltimems_bucket", request="Fetch", le="+Inf"
    ) == value(after, count, request="Fetch")


# ---------------------------------------------------------------- real clients


def _new_topic(b: BrokerProcess, name: str) -> None:
    with RawClient(b.bootstrap, timeout=15) as c:
        create = CreateTopicsRequest(
            topics=[CreateTopicsRequest.CreatableTopic(name=name, num_partitions=2, replication_factor=1)],
            timeout_ms=15000,
        )
        assert c.request(19, 7, create).topics[0].error_code == 0


def _confluent_waiter(bootstrap: str, topic: str, max_wait_ms: int) -> tuple[Any, Callable[[], int]]:
    import json

    from confluent_kafka import OFFSET_END, Consumer, TopicPartition

    fetches = [0]

    def stats(js: str) -> None:
        fetches[0] = sum(b.get("req", {}).get("Fetch", 0) for b in json.loads(js).get("brokers", {}).values())

    conf = ck_conf(
        bootstrap,
        **{
            "group.id": "idle-fetch-tests",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": max_wait_ms,
            "statistics.interval.ms": 200,
        },
    )
    c = Consumer({**conf, "stats_cb": stats})  # ck_conf would spell it stats.cb
    c.assign([TopicPartition(topic, p, OFFSET_END) for p in range(2)])
    return c, lambda: fetches[0]


def _kafka_python_waiter(bootstrap: str, topic: str, max_wait_ms: int) -> Any:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        fetch_max_wait_ms=max_wait_ms,
        request_timeout_ms=max_wait_ms + 20_000,
        consumer_timeout_ms=100,
    )
    tps = [TopicPartition(topic, p) for p in range(2)]
    c.assign(tps)
    c.seek_to_end(*tps)
    for tp in tps:
        c.position(tp)
    return c


def test_real_consumers_get_a_record_promptly_while_long_polling(
    broker: BrokerProcess, topic_name: str
) -> None:
    """Two clients wait with fetch.wait.max.ms 10 s; a record produced then reaches both well before that."""
    woken_promptly(broker, topic_name)


def woken_promptly(broker: BrokerProcess, topic_name: str) -> None:
    """Two clients wait with fetch.wait.max.ms 10 s; a record produced then reaches both well before that (also
    tests/broker/test_delayed_fetch.py's, on the general long poll)."""
    _new_topic(broker, topic_name)
    ck, _ = _confluent_waiter(broker.bootstrap, topic_name, 10_000)
    kp = _kafka_python_waiter(broker.bootstrap, topic_name, 10_000)
    got: dict[str, float] = {}
    stop = threading.Event()

    def poll_ck() -> None:
        while not stop.is_set() and "ck" not in got:
            m = ck.poll(0.1)
            if m is not None and not m.error():
                got["ck"] = time.monotonic()

    def poll_kp() -> None:
        while not stop.is_set() and "kp" not in got:
            for recs in kp.poll(timeout_ms=100).values():
                if recs:
                    got["kp"] = time.monotonic()

    threads = [threading.Thread(target=poll_ck), threading.Thread(target=poll_kp)]
    try:
        for t in threads:
            t.start()
        time.sleep(3.0)  # both are parked in long polls by now
        with RawClient(broker.bootstrap, timeout=15) as p:
            t0 = time.monotonic()
            _produce(p, topic_name, 1, 1)
        wait_until(lambda: len(got) == 2, timeout=8.0, what="both consumers got the record")
        assert max(got.values()) - t0 < 5.0, got
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        ck.close()
        kp.close()


def test_idle_real_consumers_are_answered_after_their_max_wait(
    broker: BrokerProcess, topic_name: str
) -> None:
    """Idle, with fetch.wait.max.ms 500: each Fetch is answered (empty) once its wait is over, so the clients send
    about two a second: librdkafka's count and kafka-python's fetch latency show it."""
    answered_after_max_wait(broker, topic_name)


def answered_after_max_wait(broker: BrokerProcess, topic_name: str) -> None:
    """test_idle_real_consumers_are_answered_after_their_max_wait's check, on `broker` (also
    tests/broker/test_delayed_fetch.py's, on the general long poll)."""
    _new_topic(broker, topic_name)
    ck, fetches = _confluent_waiter(broker.bootstrap, topic_name, 500)
    kp = _kafka_python_waiter(broker.bootstrap, topic_name, 500)
    stop = threading.Event()

    def poll_ck() -> None:
        while not stop.is_set():
            ck.poll(0.1)

    def poll_kp() -> None:
        while not stop.is_set():
            kp.poll(timeout_ms=100)

    threads = [threading.Thread(target=poll_ck), threading.Thread(target=poll_kp)]
    try:
        for t in threads:
            t.start()
        wait_until(lambda: fetches() > 0, timeout=10.0, what="librdkafka's first Fetch")
        time.sleep(1.0)
        before = fetches()
        time.sleep(4.0)
        sent = fetches() - before
        latency = kp.metrics()["consumer-fetch-manager-metrics"]["fetch-latency-avg"]
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        ck.close()
        kp.close()
    # 4 s at one answer per ~500 ms: 8, with room for the statistics' 200 ms steps and a slow machine.
    assert 4 <= sent <= 14, sent
    assert 400 <= latency <= 2000, latency


# ---------------------------------------------------------------- hostile bytes


def _outcome(c: RawClient) -> bytes | None:
    """The answer frame, or None when the broker closed the connection."""
    try:
        return c.recv_frame()
    except (ConnectionError, OSError):
        return None


@pytest.mark.parametrize("version", [12, 16])
def test_mutated_fetches_get_what_the_general_path_gives(
    brokers: tuple[BrokerProcess, BrokerProcess], version: int
) -> None:
    """An idle Fetch primes each connection's plan, then copies with bytes of its partition list flipped, cut or
    set (lengths, partition numbers, offsets, tagged fields) follow on the same connection: the direct path's
    answer (or the connection closed) is the general path's, byte for byte."""
    import random

    rnd = random.Random(version)
    conns: list[RawClient | None] = [None, None]
    ids = [_topic_ids(RawClient(b.bootstrap, timeout=15)) for b in brokers]
    swap = [(ids[1][n], ids[0][n]) for n in TOPICS]
    idle = [_frame(version, 7, _fetch(version, IDLE, topic_ids)) for topic_ids in ids]
    # The partition list starts after the fixed fields (replica id before v15, max wait, min and max bytes,
    # isolation, session id and epoch), past the 4-byte size and the request header (key, version, correlation id,
    # client id "t", and from v12 the header's tagged fields).
    start = 4 + 8 + 2 + 1 + 1 + (4 if version < 15 else 0) + 4 + 4 + 4 + 1 + 4 + 4
    for k in range(60):
        kind = k % 3
        at = rnd.randrange(start, len(idle[0]))
        bit = rnd.randrange(8)
        value = rnd.choice([0, 1, 0x7F, 0x80, 0xFF])
        mutated = []
        for frame in idle:
            body = bytearray(frame)
            if kind == 0:
                body[at] ^= 1 << bit
            elif kind == 1:
                body = body[:at]
                struct.pack_into(">i", body, 0, len(body) - 4)
            else:
                body[at] = value
            mutated.append(bytes(body))
        if (mutated[0] == idle[0]) != (mutated[1] == idle[1]):
            # a byte of a topic id set to what one broker's id already has there: that request is unchanged and
            # the other names an unknown topic; not the same request to both
            continue
        # Each broker gets the same bytes at the same offsets (the topic ids differ, so the positions match).
        outcomes = []
        for i, b in enumerate(brokers):
            c = conns[i]
            if c is None:
                c = conns[i] = RawClient(b.bootstrap, timeout=15)
            c.send_bytes(idle[i])
            assert _outcome(c) is not None
            c.send_bytes(mutated[i])
            got = _outcome(c)
            if got is None:
                c.close()
                conns[i] = None
            outcomes.append(got)
        direct, general = outcomes
        if general is not None:
            for theirs, ours in swap:
                general = general.replace(theirs, ours)
        assert direct == general, (k, mutated[0].hex())
    for c in conns:
        if c is not None:
            c.close()

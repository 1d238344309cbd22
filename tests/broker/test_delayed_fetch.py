"""Parked Fetches (broker/delayed_fetch.py) on a real broker, all kinds but a follower's (that one:
tests/coordinator/test_delayed_fetch_follower.py): handle_fetch's long poll (a full Fetch creating a session, or any
Fetch with KBROKER_IDLE_FETCH=0), a consumer's idle Fetch parked from its connection's plan, a session's idle
incremental Fetch.

- A connection closed while its Fetches are parked (an idle one too after it was woken short of its min_bytes and
  went on in handle_fetch's long poll) leaves nothing behind: the purgatory's gauges (Kafka's
  DelayedOperationPurgatory PurgatorySize and NumDelayedOperations) return to 0 at once, well before the max wait,
  and each request is counted once (RequestMetrics), not again when its deadline passes.
- A broker shut down while Fetches are parked answers them at once (empty) and exits cleanly.
- Real clients on the general long poll (KBROKER_IDLE_FETCH=0): a record produced while they wait reaches them well
  before fetch.wait.max.ms, and idle, their Fetches are answered after fetch.wait.max.ms, not before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from kbroker.protocol.messages import FetchResponse

from tests.broker.test_idle_fetch import (
    _fetch,
    _incremental,
    _new_topic,
    _produce,
    _records,
    _topic_ids,
    answered_after_max_wait,
    woken_promptly,
)
from tests.broker.test_metrics import scrape, value
from tests.broker_process import BrokerProcess, free_port, wait_for_port
from tests.clients import RawClient, wait_until

SIZE = "kafka_server_delayedoperationpurgatory_purgatorysize"
DELAYED = "kafka_server_delayedoperationpurgatory_numdelayedoperations"
REQUESTS = "kafka_network_requestmetrics_requests_total"
COUNT = "kafka_network_requestmetrics_totaltimems_count"
MAX_WAIT_MS = 4000


@pytest.fixture(scope="module")
def metered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, int]]:
    port = free_port()
    b = BrokerProcess(tmp_path_factory.mktemp("delayed"), {"metrics.port": str(port)}).start()
    try:
        wait_for_port(port)
        yield b, port
    finally:
        b.stop()


def _purgatory(port: int) -> tuple[float, float]:
    got = scrape(port)
    return value(got, SIZE, delayedOperation="Fetch"), value(got, DELAYED, delayedOperation="Fetch")


def test_a_closed_connection_leaves_no_parked_fetch_behind(metered: tuple[BrokerProcess, int]) -> None:
    b, port = metered
    _new_topic(b, "closing")  # two empty partitions
    with RawClient(b.bootstrap, timeout=15) as c:
        ids = _topic_ids(c)
    parts = [("closing", 0, 0, -1), ("closing", 1, 0, -1)]
    assert _purgatory(port) == (0, 0)
    before = scrape(port)
    general, idle, session = (RawClient(b.bootstrap, timeout=15) for _ in range(3))
    try:
        # A session's idle incremental Fetch: the session made first (answered at once), then its next epoch parked.
        sid = session.request(1, 12, _fetch(12, parts, ids, max_wait=0, session=(0, 0))).session_id
        t0 = time.monotonic()
        session.send_bytes(session.frame(1, 12, _incremental(12, (sid, 1), [], ids, max_wait=MAX_WAIT_MS)))
        # A full Fetch creating a session: handle_fetch's long poll.
        general.send_bytes(general.frame(1, 12, _fetch(12, parts, ids, max_wait=MAX_WAIT_MS, session=(0, 0))))
        # A sessionless idle Fetch: parked from its connection's plan.
        idle.send_bytes(idle.frame(1, 12, _fetch(12, parts, ids, max_wait=MAX_WAIT_MS)))
        # Each watches both partitions: the long poll itself, the two plans for their requests.
        wait_until(lambda: _purgatory(port) == (6, 3), timeout=3.0, what="three Fetches parked")
    finally:
        for c in (general, idle, session):
            c.close()
    wait_until(lambda: _purgatory(port) == (0, 0), timeout=3.0, what="the purgatory empty again")
    assert time.monotonic() - t0 < MAX_WAIT_MS / 1000, (
        "released at their deadline, not when the connections closed"
    )
    time.sleep(max(0.0, t0 + MAX_WAIT_MS / 1000 + 1.0 - time.monotonic()))  # past the deadlines
    after = scrape(port)
    assert _purgatory(port) == (0, 0)
    fetches = value(after, REQUESTS, request="Fetch") - value(before, REQUESTS, request="Fetch")
    assert fetches == 4, "each Fetch counted once: the parked ones when their connections closed, not again"
    assert value(after, COUNT, request="Fetch") == value(after, REQUESTS, request="Fetch")


def test_an_idle_fetch_woken_short_of_min_bytes_waits_on_and_is_released(
    metered: tuple[BrokerProcess, int],
) -> None:
    """An idle Fetch (parked from its plan) woken by a record smaller than its min_bytes goes on in handle_fetch's
    long poll for what is left of its wait; its connection closed then, both leave the purgatory at once, and the
    request is counted once."""
    b, port = metered
    _new_topic(b, "short")
    with RawClient(b.bootstrap, timeout=15) as c:
        ids = _topic_ids(c)
    parts = [("short", 0, 0, -1), ("short", 1, 0, -1)]
    before = scrape(port)
    c = RawClient(b.bootstrap, timeout=15)
    try:
        t0 = time.monotonic()
        c.send_bytes(c.frame(1, 12, _fetch(12, parts, ids, max_wait=MAX_WAIT_MS, min_bytes=1 << 20)))
        wait_until(lambda: _purgatory(port) == (2, 1), timeout=3.0, what="the idle Fetch parked")
        with RawClient(b.bootstrap, timeout=15) as p:
            _produce(p, "short", 0, 1)
        # The plan left short-0's watchers when it was notified; the long poll watches both partitions.
        wait_until(lambda: _purgatory(port) == (3, 2), timeout=3.0, what="the long poll parked for the rest")
    finally:
        c.close()
    wait_until(lambda: _purgatory(port) == (0, 0), timeout=3.0, what="the purgatory empty again")
    assert time.monotonic() - t0 < MAX_WAIT_MS / 1000
    time.sleep(max(0.0, t0 + MAX_WAIT_MS / 1000 + 1.0 - time.monotonic()))
    after = scrape(port)
    assert value(after, REQUESTS, request="Fetch") - value(before, REQUESTS, request="Fetch") == 1


def test_a_broker_shutting_down_answers_its_parked_fetches(tmp_path_factory: pytest.TempPathFactory) -> None:
    b = BrokerProcess(tmp_path_factory.mktemp("shutdown")).start()
    clients: list[RawClient] = []
    try:
        _new_topic(b, "stopping")
        with RawClient(b.bootstrap, timeout=15) as c:
            ids = _topic_ids(c)
        parts = [("stopping", 0, 0, -1), ("stopping", 1, 0, -1)]
        clients = [RawClient(b.bootstrap, timeout=15) for _ in range(2)]
        clients[0].send_bytes(
            clients[0].frame(1, 12, _fetch(12, parts, ids, max_wait=30_000, session=(0, 0)))
        )
        clients[1].send_bytes(clients[1].frame(1, 12, _fetch(12, parts, ids, max_wait=30_000)))
        time.sleep(0.5)  # both parked
        t0 = time.monotonic()
        done: list[int] = []
        stopper = threading.Thread(target=lambda: done.append(b.stop()))
        stopper.start()
        answers = [c.recv_frame() for c in clients]
        assert time.monotonic() - t0 < 10.0
        stopper.join(30)
        assert done == [0], "a clean exit"
    finally:
        for c in clients:
            c.close()
        b.stop()
    from kbroker.protocol import codec

    for frame in answers:
        resp = codec.decode_response(1, 12, frame)[1]
        assert isinstance(resp, FetchResponse) and resp.error_code == 0 and _records(resp) == 0


@pytest.fixture(scope="module")
def general_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("general"), env={"KBROKER_IDLE_FETCH": "0"}).start()
    try:
        yield b
    finally:
        b.stop()


def test_the_general_long_poll_expires_at_max_wait(general_only: BrokerProcess, topic_name: str) -> None:
    """confluent-kafka and kafka-python consumers, idle on handle_fetch's long poll (no idle direct path): answered
    after fetch.wait.max.ms, not before."""
    answered_after_max_wait(general_only, topic_name)


def test_the_general_long_poll_wakes_on_a_produce(general_only: BrokerProcess, topic_name: str) -> None:
    """The same clients waiting with 10 s on handle_fetch's long poll: a record produced reaches them well before."""
    woken_promptly(general_only, topic_name)

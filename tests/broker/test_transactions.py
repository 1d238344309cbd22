"""Transactions (KIP-98/447/890) end to end with real clients: confluent-kafka, kafka-python and aiokafka
transactional producers, read back by read_committed and read_uncommitted consumers of every client and kcat;
the last stable offset, offsets sent to transactions, fencing, timeouts, restarts and misuse errors.

The Java client has its own module (tests/java/test_java_transactions.py); exactly-once consume-transform-produce
under kill -9 is in test_transactions_eos.py; two brokers on ZooKeeper in tests/coordinator.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from kbroker.protocol.errors import ErrorCode

from tests.broker.test_produce_consume import create_topic
from tests.broker_process import BrokerProcess
from tests.clients import Msg, RawClient, ck_conf, ck_produce, wait_until
from tests.conftest import have_kcat
from tests.txn_support import (
    PRODUCERS,
    READERS,
    TXN_BROKER_OVERRIDES,
    Planned,
    RawTxnProducer,
    Seen,
    TxnIndexEntry,
    ck_send,
    ck_txn_producer,
    end_offsets,
    expected_reads,
    find_coordinator,
    list_offsets,
    plan_transactions,
    read_ck,
    read_txn_indexes,
    txn_app,
)

OUTCOMES = [True, False, True]  # commit, abort, commit: the last committed records come after the aborted ones


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("broker"), TXN_BROKER_OVERRIDES)
    b.start()
    yield b
    b.stop()


def _topics(broker: BrokerProcess, base: str, layout: dict[str, int]) -> dict[str, int]:
    named = {f"{base}-{t}": n for t, n in layout.items()}
    for t, n in named.items():
        create_topic(broker.bootstrap, t, partitions=n)
    return named


def _tps(layout: dict[str, int]) -> list[tuple[str, int]]:
    return [(t, p) for t, n in layout.items() for p in range(n)]


# ---------------------------------------------------------------- commit and abort, read by every client


@pytest.mark.parametrize("producer", list(PRODUCERS))
def test_commit_and_abort_across_partitions_and_topics(broker: BrokerProcess, topic_name: str,
                                                       producer: str) -> None:
    layout = _topics(broker, topic_name, {"a": 3, "b": 2})
    txns = plan_transactions(producer, layout, 20, OUTCOMES)
    PRODUCERS[producer](broker.bootstrap, f"{topic_name}-txn", txns, OUTCOMES)

    ends = end_offsets(txns)
    for t, n in layout.items():
        # three markers per partition, nothing open (the last commit's markers follow its EndTxn answer)
        want = {p: ends[(t, p)] for p in range(n)}
        wait_until(lambda t=t, n=n, want=want: list_offsets(broker.bootstrap, t, range(n), 1) == want,
                   timeout=15, interval=0.05, what=f"LSO of {t} at {want}")
        assert list_offsets(broker.bootstrap, t, range(n), isolation_level=0) == want

    committed = expected_reads(txns, OUTCOMES, committed_only=True)
    everything = expected_reads(txns, OUTCOMES, committed_only=False)
    for reader, read in READERS.items():
        if reader == "kcat" and not have_kcat():
            continue
        # Markers hold offsets of their own that no client ever returns as records: the expected offsets
        # skip them, and an aborted record would appear between the committed ones.
        assert read(broker.bootstrap, _tps(layout), len(committed), True) == committed, f"{reader} read_committed"
        assert read(broker.bootstrap, _tps(layout), len(everything), False) == everything, \
            f"{reader} read_uncommitted"


def test_last_stable_offset_while_a_transaction_is_open(broker: BrokerProcess, topic_name: str) -> None:
    from confluent_kafka import IsolationLevel
    from confluent_kafka.admin import AdminClient, OffsetSpec

    create_topic(broker.bootstrap, topic_name, partitions=2)
    ck_produce(broker.bootstrap, topic_name, [Msg(None, f"plain-{i}".encode(), partition=0) for i in range(4)])
    p = ck_txn_producer(broker.bootstrap, f"{topic_name}-txn")
    p.begin_transaction()
    ck_send(p, [Planned(topic_name, 0, f"open-{i}".encode()) for i in range(6)])

    assert list_offsets(broker.bootstrap, topic_name, [0, 1], isolation_level=0) == {0: 10, 1: 0}
    assert list_offsets(broker.bootstrap, topic_name, [0, 1], isolation_level=1) == {0: 4, 1: 0}
    c = Consumer(ck_conf(broker.bootstrap, **{"group.id": "lso-watermarks", "isolation.level": "read_committed"}))
    try:
        assert c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10) == (0, 4)
    finally:
        c.close()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    tp = TopicPartition(topic_name, 0)
    for level, want in ((IsolationLevel.READ_COMMITTED, 4), (IsolationLevel.READ_UNCOMMITTED, 10)):
        got = admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=level)[tp].result(10)
        assert got.offset == want, level
    # read_committed stops at the LSO: the plain records only; read_uncommitted reads the open transaction too
    assert [s.value for s in read_ck(broker.bootstrap, [(topic_name, 0)], 4, True)] == \
        [f"plain-{i}".encode() for i in range(4)]
    assert len(read_ck(broker.bootstrap, [(topic_name, 0)], 10, False)) == 10

    p.commit_transaction(30)
    wait_until(lambda: list_offsets(broker.bootstrap, topic_name, [0], isolation_level=1) == {0: 11}, timeout=15,
               interval=0.05, what="LSO past the commit marker")
    assert [s.offset for s in read_ck(broker.bootstrap, [(topic_name, 0)], 10, True)] == list(range(10))


# ---------------------------------------------------------------- offsets sent to a transaction


def _offset_fetch(broker: BrokerProcess, group: str, topic: str, partition: int,
                  require_stable: bool) -> tuple[int, int]:
    """Raw OffsetFetch v7: (error code, committed offset) of one partition."""
    from kbroker.protocol.messages import OffsetFetchRequest

    req = OffsetFetchRequest(group_id=group, require_stable=require_stable, topics=[
        OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=[partition])])
    try:
        with RawClient(broker.bootstrap) as raw:
            resp = raw.request(9, 7, req)
    except TimeoutError:
        raise AssertionError(f"OffsetFetch (require_stable={require_stable}) not answered within 10 s; broker log "
                             f"tail:\n{broker.read_log()[-3000:]}") from None
    assert resp.error_code == 0, resp
    [pr] = resp.topics[0].partitions
    return pr.error_code, pr.committed_offset


def _wait_stable(broker: BrokerProcess, group: str, topic: str, offset: int) -> None:
    """EndTxn is answered once the transaction log says PrepareCommit/PrepareAbort (as Kafka): the marker that
    settles the pending offsets follows shortly after."""
    wait_until(lambda: _offset_fetch(broker, group, topic, 0, require_stable=True) == (0, offset),
               timeout=15, interval=0.05, what=f"committed offset {offset} without pending offsets")


def _group_consumer(bootstrap: str, group: str, topic: str, count: int) -> Consumer:
    """A member of `group` subscribed to `topic` that has read its first `count` records."""
    c = Consumer(ck_conf(bootstrap, **{"group.id": group, "enable.auto.commit": False,
                                       "auto.offset.reset": "earliest", "isolation.level": "read_committed"}))
    c.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 30
    while got < count and time.monotonic() < deadline:
        got += sum(1 for m in c.consume(count - got, 0.3) if m.error() is None)
    assert got == count
    return c


def test_send_offsets_to_transaction_confluent(broker: BrokerProcess, topic_name: str) -> None:
    """KIP-447 with a group member's metadata: pending until the commit (require_stable waits for it), gone
    after an abort."""
    output = f"{topic_name}-out"
    create_topic(broker.bootstrap, topic_name, partitions=1)
    create_topic(broker.bootstrap, output, partitions=1)
    ck_produce(broker.bootstrap, topic_name, [Msg(None, f"in-{i}".encode(), partition=0) for i in range(10)])
    group = f"{topic_name}-group"
    member = _group_consumer(broker.bootstrap, group, topic_name, 10)
    p = ck_txn_producer(broker.bootstrap, f"{topic_name}-txn")
    try:
        p.begin_transaction()
        ck_send(p, [Planned(output, 0, b"out-0")])
        p.send_offsets_to_transaction([TopicPartition(topic_name, 0, 5)], member.consumer_group_metadata(), 30)

        assert _offset_fetch(broker, group, topic_name, 0, require_stable=False) == (0, -1)
        assert _offset_fetch(broker, group, topic_name, 0, require_stable=True) == \
            (ErrorCode.UNSTABLE_OFFSET_COMMIT, -1)

        # librdkafka asks with require_stable when read_committed and retries UNSTABLE_OFFSET_COMMIT
        result: dict[str, Any] = {}

        def committed_read_committed() -> None:
            c = Consumer(ck_conf(broker.bootstrap, **{"group.id": group, "isolation.level": "read_committed"}))
            try:
                [tp] = c.committed([TopicPartition(topic_name, 0)], timeout=30)
                result.update(offset=tp.offset, at=time.monotonic())
            finally:
                c.close()

        waiter = threading.Thread(target=committed_read_committed)
        waiter.start()
        time.sleep(1.5)
        assert not result, f"committed() answered {result} while the offsets were pending"
        commit_at = time.monotonic()
        p.commit_transaction(30)
        waiter.join(40)
        assert result.get("offset") == 5 and result["at"] >= commit_at, result
        _wait_stable(broker, group, topic_name, 5)

        p.begin_transaction()
        ck_send(p, [Planned(output, 0, b"out-1")])
        p.send_offsets_to_transaction([TopicPartition(topic_name, 0, 8)], member.consumer_group_metadata(), 30)
        assert _offset_fetch(broker, group, topic_name, 0, require_stable=False) == (0, 5)
        p.abort_transaction(30)
        _wait_stable(broker, group, topic_name, 5)
    finally:
        member.close()
    assert [s.value for s in read_ck(broker.bootstrap, [(output, 0)], 1, True)] == [b"out-0"]


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka"])
def test_send_offsets_to_transaction_python_clients(broker: BrokerProcess, topic_name: str, client: str) -> None:
    create_topic(broker.bootstrap, topic_name, partitions=1)
    ck_produce(broker.bootstrap, topic_name, [Msg(None, f"in-{i}".encode(), partition=0) for i in range(10)])
    group = f"{topic_name}-group"
    txn_id = f"{topic_name}-txn"
    seen: list[tuple[int, int]] = []

    def check(pending: bool) -> None:
        if pending:
            seen.append(_offset_fetch(broker, group, topic_name, 0, require_stable=True))
        else:
            _wait_stable(broker, group, topic_name, 4)
            seen.append((0, 4))

    if client == "kafka-python":
        _kp_offsets_in_transactions(broker.bootstrap, topic_name, group, txn_id, check)
    else:
        _aio_offsets_in_transactions(broker.bootstrap, topic_name, group, txn_id, check)
    # pending while open (Kafka answers offset -1 with the error), committed after the commit, unchanged by the
    # aborted transaction
    assert seen == [(ErrorCode.UNSTABLE_OFFSET_COMMIT, -1), (0, 4), (ErrorCode.UNSTABLE_OFFSET_COMMIT, -1), (0, 4)]


def _kp_offsets_in_transactions(bootstrap: str, topic: str, group: str, txn_id: str, check: Any) -> None:
    from kafka import KafkaConsumer, KafkaProducer, OffsetAndMetadata
    from kafka import TopicPartition as KTP

    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                      auto_offset_reset="earliest", isolation_level="read_committed")
    p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id, enable_idempotence=True)
    try:
        got = 0
        deadline = time.monotonic() + 30
        while got < 10 and time.monotonic() < deadline:
            got += sum(len(v) for v in c.poll(timeout_ms=300).values())
        assert got == 10
        p.init_transactions()
        for offset, commit in ((4, True), (9, False)):
            p.begin_transaction()
            p.send_offsets_to_transaction({KTP(topic, 0): OffsetAndMetadata(offset, "", -1)}, c.group_metadata())
            check(True)
            if commit:
                p.commit_transaction()
            else:
                p.abort_transaction()
            check(False)
    finally:
        p.close(timeout=10)
        c.close()


def _aio_offsets_in_transactions(bootstrap: str, topic: str, group: str, txn_id: str, check: Any) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as ATP

    async def run() -> None:
        c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                             auto_offset_reset="earliest", isolation_level="read_committed")
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id, enable_idempotence=True)
        await c.start()
        await p.start()
        try:
            got = 0
            deadline = time.monotonic() + 30
            while got < 10 and time.monotonic() < deadline:
                got += sum(len(v) for v in (await c.getmany(timeout_ms=300)).values())
            assert got == 10
            for offset, commit in ((4, True), (9, False)):
                await p.begin_transaction()
                await p.send_offsets_to_transaction({ATP(topic, 0): offset}, group)
                await asyncio.get_running_loop().run_in_executor(None, check, True)
                if commit:
                    await p.commit_transaction()
                else:
                    await p.abort_transaction()
                await asyncio.get_running_loop().run_in_executor(None, check, False)
        finally:
            await p.stop()
            await c.stop()

    asyncio.run(run())


# ---------------------------------------------------------------- fencing


def test_zombie_fencing_confluent(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, partitions=1)
    txn_id = f"{topic_name}-txn"
    old = ck_txn_producer(broker.bootstrap, txn_id)
    old.begin_transaction()
    ck_send(old, [Planned(topic_name, 0, f"zombie-{i}".encode()) for i in range(5)])

    new = ck_txn_producer(broker.bootstrap, txn_id)  # bumps the epoch and aborts the old transaction
    new.begin_transaction()
    ck_send(new, [Planned(topic_name, 0, f"new-{i}".encode()) for i in range(3)])
    new.commit_transaction(30)

    with pytest.raises(KafkaException) as caught:
        old.produce(topic_name, value=b"zombie-late", partition=0)
        old.flush(10)
        old.commit_transaction(30)
    err: KafkaError = caught.value.args[0]
    assert err.fatal() and err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                          KafkaError.INVALID_PRODUCER_EPOCH), err

    committed = read_ck(broker.bootstrap, [(topic_name, 0)], 3, True)
    assert [s.value for s in committed] == [f"new-{i}".encode() for i in range(3)]
    everything = read_ck(broker.bootstrap, [(topic_name, 0)], 8, False)
    assert [s.value for s in everything] == [f"zombie-{i}".encode() for i in range(5)] + \
        [f"new-{i}".encode() for i in range(3)]
    # zombie 0..4, its abort marker at 5, the new records 6..8, their commit marker at 9
    assert [s.offset for s in everything] == [0, 1, 2, 3, 4, 6, 7, 8]
    wait_until(lambda: list_offsets(broker.bootstrap, topic_name, [0], 1) == {0: 10}, timeout=15, interval=0.05,
               what="LSO past the commit marker")


def test_zombie_fencing_kafka_python(broker: BrokerProcess, topic_name: str) -> None:
    from kafka import KafkaProducer
    from kafka.errors import ProducerFencedError

    create_topic(broker.bootstrap, topic_name, partitions=1)
    txn_id = f"{topic_name}-txn"
    old = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=txn_id, enable_idempotence=True)
    new = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=txn_id, enable_idempotence=True)
    try:
        old.init_transactions()
        old.begin_transaction()
        old.send(topic_name, value=b"zombie", partition=0).get(30)
        new.init_transactions()
        new.begin_transaction()
        new.send(topic_name, value=b"new", partition=0).get(30)
        new.commit_transaction()
        # EndTxn with the old epoch: PRODUCER_FENCED
        with pytest.raises(ProducerFencedError):
            old.commit_transaction()
    finally:
        new.close(timeout=10)
        old.close(timeout=5)
    assert [s.value for s in read_ck(broker.bootstrap, [(topic_name, 0)], 1, True)] == [b"new"]


def test_zombie_fencing_aiokafka(broker: BrokerProcess, topic_name: str) -> None:
    import asyncio

    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import InvalidProducerEpoch, ProducerFenced

    create_topic(broker.bootstrap, topic_name, partitions=1)
    txn_id = f"{topic_name}-txn"

    async def run() -> None:
        old = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=txn_id)
        new = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=txn_id)
        await old.start()
        try:
            await old.begin_transaction()
            await old.send_and_wait(topic_name, b"zombie", partition=0)
            await new.start()  # InitProducerId: bumps the epoch, aborts the old transaction
            try:
                async with new.transaction():
                    await new.send_and_wait(topic_name, b"new", partition=0)
            finally:
                await new.stop()
            with pytest.raises((ProducerFenced, InvalidProducerEpoch)):
                await asyncio.wait_for(old.commit_transaction(), 30)
        finally:
            await old.stop()

    asyncio.run(run())
    assert [s.value for s in read_ck(broker.bootstrap, [(topic_name, 0)], 1, True)] == [b"new"]
    assert [s.value for s in read_ck(broker.bootstrap, [(topic_name, 0)], 2, False)] == [b"zombie", b"new"]


# ---------------------------------------------------------------- transaction timeout


def test_transaction_of_a_killed_producer_aborts_after_its_timeout(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, partitions=1)
    app = txn_app("hang", broker.bootstrap, topic_name, "0", f"{topic_name}-txn", "6000", "10")
    try:
        assert app.stdout is not None
        line = app.stdout.readline()
        assert line.strip() == "READY", line + app.stdout.read()
    finally:
        app.kill()
        app.wait()
    killed_at = time.monotonic()
    ck_produce(broker.bootstrap, topic_name, [Msg(None, f"plain-{i}".encode(), partition=0) for i in range(5)])
    if time.monotonic() - killed_at < 4:  # well within the 6 s timeout: the transaction must still hold the LSO
        assert list_offsets(broker.bootstrap, topic_name, [0], isolation_level=1) == {0: 0}
    assert list_offsets(broker.bootstrap, topic_name, [0], isolation_level=0) == {0: 15}

    wait_until(lambda: list_offsets(broker.bootstrap, topic_name, [0], isolation_level=1) == {0: 16},
               timeout=40, interval=0.2, what="the timed-out transaction to be aborted (LSO past its marker)")
    assert time.monotonic() - killed_at >= 2, "aborted long before transaction.timeout.ms"
    committed = read_ck(broker.bootstrap, [(topic_name, 0)], 5, True)
    assert committed == [Seen(topic_name, 0, 10 + i, f"plain-{i}".encode()) for i in range(5)]
    assert len(read_ck(broker.bootstrap, [(topic_name, 0)], 15, False)) == 15


# ---------------------------------------------------------------- misuse


def test_misuse_answers_kafka_errors(broker: BrokerProcess, topic_name: str) -> None:
    from kbroker.protocol.messages import EndTxnRequest, InitProducerIdRequest

    create_topic(broker.bootstrap, topic_name, partitions=2)
    txn_id = f"{topic_name}-txn"
    assert find_coordinator(broker.bootstrap, txn_id)[0] >= 0
    with RawClient(broker.bootstrap) as raw:
        # EndTxn for a transactional id that never ran InitProducerId
        resp = raw.request(26, 3, EndTxnRequest(transactional_id=f"{txn_id}-never", producer_id=4242,
                                                producer_epoch=0, committed=True))
        assert resp.error_code == ErrorCode.INVALID_PRODUCER_ID_MAPPING
        for timeout_ms in (60001, 0):
            resp = raw.request(22, 4, InitProducerIdRequest(transactional_id=txn_id, transaction_timeout_ms=timeout_ms,
                                                            producer_id=-1, producer_epoch=-1))
            assert resp.error_code == ErrorCode.INVALID_TRANSACTION_TIMEOUT, (timeout_ms, resp)

    # The client's view of the same: init_transactions fails with the broker's error
    with pytest.raises(KafkaException) as caught:
        ck_txn_producer(broker.bootstrap, f"{txn_id}-long", **{"transaction.timeout.ms": 120000})
    assert caught.value.args[0].code() == KafkaError.INVALID_TRANSACTION_TIMEOUT

    first = RawTxnProducer(broker.bootstrap, txn_id)
    try:
        # no partition added yet: nothing to end
        assert first.end(commit=True) == ErrorCode.INVALID_TXN_STATE
        # KIP-890 part 1: a transactional batch to a partition not added to the transaction
        assert first.produce(topic_name, 1, [b"unverified"], version=10)[0] == ErrorCode.INVALID_TXN_STATE
        assert first.produce(topic_name, 1, [b"unverified"], version=11)[0] == ErrorCode.TRANSACTION_ABORTABLE
        # a partition that does not exist fails the whole request: the others are not attempted (Kafka)
        assert first.add_partitions(topic_name, [0, 7]) == {0: ErrorCode.OPERATION_NOT_ATTEMPTED,
                                                          7: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        assert first.end(commit=True) == ErrorCode.INVALID_TXN_STATE  # nothing was added
        assert first.add_partitions(topic_name, [0]) == {0: 0}
        assert first.produce(topic_name, 0, [b"verified"])[0] == 0
        assert first.produce(topic_name, 1, [b"unverified"], version=10)[0] == ErrorCode.INVALID_TXN_STATE
        # a wrong producer id for the transactional id
        pid = first.producer_id
        first.producer_id = pid + 1000
        assert first.end(commit=True) == ErrorCode.INVALID_PRODUCER_ID_MAPPING
        first.producer_id = pid
        second = RawTxnProducer(broker.bootstrap, txn_id)  # fences `first` and aborts its transaction
        try:
            assert second.producer_id == pid and second.producer_epoch > first.producer_epoch
            assert first.end(commit=True, version=3) == ErrorCode.PRODUCER_FENCED
            assert first.end(commit=True, version=1) == ErrorCode.INVALID_PRODUCER_EPOCH
            assert first.produce(topic_name, 0, [b"zombie"])[0] == ErrorCode.INVALID_PRODUCER_EPOCH
        finally:
            second.close()
    finally:
        first.close()
    assert read_ck(broker.bootstrap, [(topic_name, 0), (topic_name, 1)], 1, True, timeout=2) == []
    assert [s.value for s in read_ck(broker.bootstrap, [(topic_name, 0)], 1, False)] == [b"verified"]


# ---------------------------------------------------------------- restart with open and prepared transactions


def test_kill_9_with_open_and_prepared_transactions(tmp_path: Path, topic_name: str) -> None:
    """Committed data survives, the open transaction aborts after its timeout, the prepared one (EndTxn
    answered, markers possibly not yet written) completes; the .txnindex files hold Kafka's entries."""
    b = BrokerProcess(tmp_path, TXN_BROKER_OVERRIDES).start()
    try:
        create_topic(b.bootstrap, topic_name, partitions=2)
        per = 10
        committed_and_aborted = plan_transactions("ca", {topic_name: 2}, per, [True, False])
        p = ck_txn_producer(b.bootstrap, f"{topic_name}-ca")
        for recs, commit in zip(committed_and_aborted, [True, False], strict=True):
            p.begin_transaction()
            ck_send(p, recs)
            if commit:
                p.commit_transaction(30)
            else:
                p.abort_transaction(30)
        del p
        # partition 0: committed 0..9 + marker 10, aborted 11..20 + marker 21; the same in partition 1
        ca_pid = _producer_ids(b, topic_name, 0)[0]

        opened = RawTxnProducer(b.bootstrap, f"{topic_name}-open", timeout_ms=5000)
        assert opened.add_partitions(topic_name, [0]) == {0: 0}
        assert opened.produce(topic_name, 0, [f"open-{i}".encode() for i in range(5)]) == (0, 22)
        prepared = RawTxnProducer(b.bootstrap, f"{topic_name}-prepared")
        assert prepared.add_partitions(topic_name, [1]) == {1: 0}
        assert prepared.produce(topic_name, 1, [f"prepared-{i}".encode() for i in range(5)]) == (0, 22)
        assert prepared.end(commit=True) == 0
        b.kill()
        opened.close()
        prepared.close()

        b.start()
        # The open transaction's 5 s timeout runs from its start; the prepared one needs only its markers.
        want_committed = sorted(
            [Seen(topic_name, p, i, r.value) for p in (0, 1)
             for i, r in enumerate(x for x in committed_and_aborted[0] if x.partition == p)]
            + [Seen(topic_name, 1, 22 + i, f"prepared-{i}".encode()) for i in range(5)])
        # partition 0: the open transaction's abort marker at 27. Partition 1: the prepared commit's marker at 27,
        # and maybe a second one at 28: when the kill came after the marker but before CompleteCommit reached the
        # transaction log, the reloaded coordinator writes the markers again (as Kafka does; the second completes
        # nothing).
        def settled() -> bool:
            lso = list_offsets(b.bootstrap, topic_name, [0, 1], 1)
            return lso[0] == 28 and lso[1] in (28, 29) and lso == list_offsets(b.bootstrap, topic_name, [0, 1], 0)

        wait_until(settled, timeout=60, interval=0.2,
                   what="the open transaction aborted and the prepared one committed after restart")
        assert read_ck(b.bootstrap, _tps({topic_name: 2}), len(want_committed), True) == want_committed
        assert len(read_ck(b.bootstrap, _tps({topic_name: 2}), 50, False)) == 50
        b.stop()

        open_pid = _producer_ids(b, topic_name, 0)[-1]
        assert open_pid != ca_pid
        # Kafka's TransactionIndex entries: the aborted transaction's first offset, its marker's offset, and the
        # LSO right after the marker (no other transaction open in the partition at the time)
        assert read_txn_indexes(b.data_dir / "logs" / f"{topic_name}-0") == [
            TxnIndexEntry(ca_pid, 11, 21, 22), TxnIndexEntry(open_pid, 22, 27, 28)]
        assert read_txn_indexes(b.data_dir / "logs" / f"{topic_name}-1") == [TxnIndexEntry(ca_pid, 11, 21, 22)]
    finally:
        b.kill()


def _producer_ids(b: BrokerProcess, topic: str, partition: int) -> list[int]:
    """Producer ids of the stored batches of a partition, in log order, each once."""
    from kbroker.protocol.records import iter_batch_headers

    out: list[int] = []
    for seg in sorted((b.data_dir / "logs" / f"{topic}-{partition}").glob("*.log")):
        for _, h in iter_batch_headers(seg.read_bytes()):
            if h.producer_id not in out:
                out.append(h.producer_id)
    return out

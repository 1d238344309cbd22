"""Consumer groups against a real kbroker process with real clients (confluent-kafka, kafka-python, aiokafka, kcat).

Group membership, rebalances (eager range and cooperative-sticky), session-timeout failover of a SIGKILLed consumer,
static membership, committed offsets across a broker restart, and the group admin APIs.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, KafkaException, TopicPartition
from confluent_kafka import KafkaError as CKError
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, KafkaConsumer
from kafka import TopicPartition as KTP
from kafka.structs import OffsetAndMetadata as KOffsetAndMetadata

from tests.broker_process import ROOT, BrokerProcess
from tests.clients import Msg, ck_conf, ck_produce, kcat, wait_until
from tests.conftest import have_kcat

T = 15  # seconds for admin futures
SESSION_MS = 6000  # group.min.session.timeout.ms: the smallest session the broker accepts
HEARTBEAT_MS = 500


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    a = AdminClient({"bootstrap.servers": bootstrap})
    a.create_topics([NewTopic(name, partitions, 1)], operation_timeout=10)[name].result(T)


def produce_values(bootstrap: str, topic: str, n: int, partitions: int, tag: str = "v") -> set[tuple[int, int]]:
    """n records spread round-robin over the partitions; returns the (partition, offset) of every one."""
    delivered = ck_produce(bootstrap, topic, [Msg(None, f"{tag}-{i}".encode(), partition=i % partitions)
                                              for i in range(n)])
    assert len(delivered) == n
    return {(r.partition, r.offset) for r in delivered}


def group_conf(bootstrap: str, group: str, **conf: Any) -> dict[str, Any]:
    return ck_conf(bootstrap, **{
        "group.id": group, "auto.offset.reset": "earliest", "session.timeout.ms": SESSION_MS,
        "heartbeat.interval.ms": HEARTBEAT_MS, "fetch.wait.max.ms": 100, **conf,
    })


class CkMember(threading.Thread):
    """A confluent-kafka group member polling on its own thread.

    Records every rebalance callback as (kind, partitions, monotonic time) and the current assignment. With
    manual_commit, each consumed batch is committed synchronously with explicit offsets and only then counted
    in `committed` (a batch whose commit fails is not counted: it is redelivered from the committed offset).
    """

    def __init__(self, bootstrap: str, group: str, topic: str, *, manual_commit: bool = False,
                 close: bool = True, **conf: Any) -> None:
        super().__init__(daemon=True)
        self.topic = topic
        self.conf = group_conf(bootstrap, group, **({"enable.auto.commit": False} if manual_commit else {}), **conf)
        self.manual_commit = manual_commit
        self.cooperative = "cooperative" in str(self.conf.get("partition.assignment.strategy", ""))
        self.close_on_stop = close
        self.lock = threading.Lock()
        self.events: list[tuple[str, frozenset[int], float]] = []
        self.assignment: set[int] = set()
        self.consumed: list[tuple[int, int]] = []
        self.committed: list[tuple[int, int]] = []
        self.commit_failures: list[str] = []
        self.errors: list[Any] = []
        self.member_id: str | None = None
        self.stop_evt = threading.Event()
        self.started_evt = threading.Event()
        self.consumer: Consumer | None = None

    def snapshot(self) -> set[int]:
        with self.lock:
            return set(self.assignment)

    def n_events(self) -> int:
        with self.lock:
            return len(self.events)

    def _record(self, kind: str, parts: list[TopicPartition]) -> None:
        ps = frozenset(tp.partition for tp in parts)
        with self.lock:
            self.events.append((kind, ps, time.monotonic()))
            incremental = self.cooperative
            if kind == "assign":
                self.assignment = (self.assignment | ps) if incremental else set(ps)
            else:
                self.assignment = (self.assignment - ps) if incremental else set()

    def run(self) -> None:
        c = self.consumer = Consumer(self.conf)
        c.subscribe([self.topic], on_assign=lambda _c, ps: self._record("assign", ps),
                    on_revoke=lambda _c, ps: self._record("revoke", ps),
                    on_lost=lambda _c, ps: self._record("lost", ps))
        self.started_evt.set()
        try:
            while not self.stop_evt.is_set():
                msgs = c.consume(500, 0.1)
                batch = []
                for m in msgs:
                    if m.error():
                        if m.error().code() != CKError._PARTITION_EOF:
                            self.errors.append(m.error())
                        continue
                    batch.append((m.partition(), m.offset()))
                if not batch:
                    continue
                self.member_id = c.memberid()
                with self.lock:
                    self.consumed.extend(batch)
                if self.manual_commit:
                    self._commit(c, batch)
        except Exception as e:  # noqa: BLE001 - surfaced by the test
            self.errors.append(e)
        finally:
            if self.close_on_stop:
                c.close()

    def _commit(self, c: Consumer, batch: list[tuple[int, int]]) -> None:
        nxt: dict[int, int] = {}
        first: dict[int, int] = {}
        for p, o in batch:
            nxt[p] = max(nxt.get(p, 0), o + 1)
            first[p] = min(first.get(p, o), o)
        try:
            res = c.commit(offsets=[TopicPartition(self.topic, p, o) for p, o in nxt.items()], asynchronous=False)
            bad = [tp for tp in res or [] if tp.error]
            if bad:
                raise KafkaException(bad[0].error)
        except KafkaException as e:
            self.commit_failures.append(str(e))
            for p, o in first.items():  # read the uncounted batch again (if we still own the partition)
                try:
                    c.seek(TopicPartition(self.topic, p, o))
                except KafkaException:
                    pass
            return
        with self.lock:
            self.committed.extend(batch)

    def stop(self) -> None:
        self.stop_evt.set()
        self.join(30)
        assert not self.is_alive(), "consumer thread did not stop"


@pytest.fixture
def members() -> Iterator[Callable[..., CkMember]]:
    """Start CkMembers; any still running at teardown are stopped."""
    started: list[CkMember] = []

    def start(*args: Any, **kw: Any) -> CkMember:
        m = CkMember(*args, **kw)
        m.start()
        started.append(m)
        return m

    yield start
    for m in started:
        if m.is_alive():
            m.stop_evt.set()
    for m in started:
        m.join(30)


def settled(ms: list[CkMember], n_partitions: int, sizes: list[int] | None = None) -> bool:
    snaps = [m.snapshot() for m in ms]
    union = set().union(*snaps)
    if sum(len(s) for s in snaps) != len(union) or union != set(range(n_partitions)):
        return False
    return sizes is None or sorted(len(s) for s in snaps) == sorted(sizes)


def ck_admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def describe(bootstrap: str, group: str) -> Any:
    admin = ck_admin(bootstrap)  # keep the client alive until its future resolves
    return admin.describe_consumer_groups([group], request_timeout=10)[group].result(T)


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, TopicPartition]:
    from confluent_kafka import ConsumerGroupTopicPartitions

    req = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])
    admin = ck_admin(bootstrap)
    res = admin.list_consumer_group_offsets([req], request_timeout=10)[group].result(T)
    return {tp.partition: tp for tp in res.topic_partitions}


# ---------------------------------------------------------------- 1. failover after SIGKILL, exactly-once commits


KILLED_CONSUMER = r"""
import json, sys, time
from confluent_kafka import Consumer, KafkaException, TopicPartition
bootstrap, group, topic, out_path = sys.argv[1:5]
out = open(out_path, "a", buffering=1)
def emit(**kw):
    out.write(json.dumps(kw) + "\n")
    out.flush()
c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
              "auto.offset.reset": "earliest", "session.timeout.ms": SESSION_MS,
              "heartbeat.interval.ms": HEARTBEAT_MS, "fetch.wait.max.ms": 100,
              "partition.assignment.strategy": "range"})
c.subscribe([topic], on_assign=lambda _c, ps: emit(assign=[p.partition for p in ps]),
            on_revoke=lambda _c, ps: emit(revoke=[p.partition for p in ps]))
while True:
    batch = [[m.partition(), m.offset()] for m in c.consume(200, 0.1) if not m.error()]
    if not batch:
        continue
    emit(pending=batch)
    nxt = {}
    for p, o in batch:
        nxt[p] = max(nxt.get(p, 0), o + 1)
    try:
        res = c.commit(offsets=[TopicPartition(topic, p, o) for p, o in nxt.items()], asynchronous=False)
        if any(tp.error for tp in res):
            raise KafkaException(next(tp.error for tp in res if tp.error))
    except KafkaException as e:
        emit(commit_failed=str(e))
        continue
    emit(done=True)
    time.sleep(0.05)  # slow: it must still own unread records when it is killed
""".replace("SESSION_MS", str(SESSION_MS)).replace("HEARTBEAT_MS", str(HEARTBEAT_MS))


class KilledConsumerLog:
    """The subprocess's JSON lines: assignments, and each batch as pending (before commit) then done."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def parse(self) -> tuple[set[int], list[tuple[int, int]], list[tuple[int, int]]]:
        assignment: set[int] = set()
        done: list[tuple[int, int]] = []
        pending: list[tuple[int, int]] = []
        if not self.path.exists():
            return assignment, done, pending
        for line in self.path.read_text().splitlines():
            if not line.endswith("}"):
                continue  # torn last line
            ev = json.loads(line)
            if "assign" in ev:
                assignment = set(ev["assign"])
            elif "revoke" in ev:
                assignment = set()
            elif "pending" in ev:
                pending = [tuple(x) for x in ev["pending"]]  # type: ignore[misc]
            elif "done" in ev:
                done.extend(pending)
                pending = []
            elif "commit_failed" in ev:
                pending = []
        return assignment, done, pending


def test_three_consumers_failover_after_sigkill_exactly_once(broker, topic_name, members, tmp_path):
    """Three range members on 6 partitions get 2 each. One (a subprocess) is SIGKILLed mid-stream without
    LeaveGroup; its partitions move to the two survivors after its session times out.

    Every member commits each batch synchronously and counts a record only after its commit succeeded
    (the subprocess logs a batch as `pending` before committing and `done` after). Asserted:
      * the counted records of all members contain no duplicate: no committed record was delivered twice;
      * counted records plus the killed member's last unconfirmed batch (the one in flight at the kill,
        whose commit may or may not have landed) cover all 60,000 records; that batch is the only place
        redelivery is allowed;
      * the group's final committed offsets are the log end offsets.
    """
    n, parts = 60_000, 6
    create_topic(broker.bootstrap, topic_name, parts)
    group = f"g-{topic_name}"
    a = members(broker.bootstrap, group, topic_name, manual_commit=True, partition_assignment_strategy="range")
    b = members(broker.bootstrap, group, topic_name, manual_commit=True, partition_assignment_strategy="range")
    out = KilledConsumerLog(tmp_path / "killed.jsonl")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_CONSUMER, broker.bootstrap, group, topic_name,
                             str(out.path)], cwd=ROOT, stderr=subprocess.DEVNULL)
    try:
        def two_each() -> bool:
            owned = [a.snapshot(), b.snapshot(), out.parse()[0]]
            return [len(o) for o in owned] == [2, 2, 2] and set().union(*owned) == set(range(parts))

        wait_until(two_each, timeout=30, interval=0.1, what="three members with 2 partitions each")
        assert len(a.snapshot()) == len(b.snapshot()) == 2
        killed_parts = out.parse()[0]

        all_recs = produce_values(broker.bootstrap, topic_name, n, parts)
        wait_until(lambda: len(out.parse()[1]) >= 1000, timeout=30, what="killed member progress")
        os.kill(proc.pid, signal.SIGKILL)
        t_kill = time.monotonic()
        proc.wait(10)
        _, killed_done, killed_pending = out.parse()
        assert len(killed_done) < 2 * n // parts, "the killed member must still own unread records"

        wait_until(lambda: settled([a, b], parts, [3, 3]), timeout=20, what="failover of the killed partitions")
        moved_after = max(ev[2] for m in (a, b) for ev in m.events if ev[0] == "assign") - t_kill
        # Expired by the session timeout (heartbeats every 0.5 s before the kill, sweeps every 0.25 s), then
        # the survivors learn of the rebalance from their next heartbeat.
        assert SESSION_MS / 1000 - 1.0 <= moved_after <= SESSION_MS / 1000 + 4.0, moved_after
        assert killed_parts <= a.snapshot() | b.snapshot()

        def progress() -> bool:
            counted = set(a.committed) | set(b.committed) | set(killed_done) | set(killed_pending)
            return counted >= all_recs

        wait_until(progress, timeout=60, interval=0.1, what="all records committed")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    a.stop()
    b.stop()
    assert not a.errors and not b.errors, (a.errors, b.errors)
    assert a.committed and b.committed and killed_done
    counted = a.committed + b.committed + killed_done
    dupes = len(counted) - len(set(counted))
    assert dupes == 0, f"{dupes} committed records were delivered twice"
    assert set(counted) | set(killed_pending) == all_recs
    assert set(counted) <= all_recs
    assert len(killed_pending) <= 200
    # redelivery happened only inside the killed member's unconfirmed batch
    redelivered = (set(a.consumed) | set(b.consumed)) & (set(killed_done) | set(killed_pending))
    assert redelivered <= set(killed_pending)
    offs = committed_offsets(broker.bootstrap, group, topic_name, parts)
    assert {p: tp.offset for p, tp in offs.items()} == {p: n // parts for p in range(parts)}


# ---------------------------------------------------------------- 2. kafka-python / aiokafka, mixed group


def _kp_group_consume(bootstrap: str, topic: str, group: str, count: int) -> list[tuple[int, int]]:
    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=True,
                      auto_commit_interval_ms=200, auto_offset_reset="earliest", fetch_max_wait_ms=100,
                      session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS)
    out: list[tuple[int, int]] = []
    try:
        deadline = time.monotonic() + 30
        while len(out) < count and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=200).values():
                out.extend((r.partition, r.offset) for r in recs)
    finally:
        c.close()  # auto-commits the final positions
    return out


def _aio_group_consume(bootstrap: str, topic: str, group: str, count: int) -> list[tuple[int, int]]:
    from aiokafka import AIOKafkaConsumer

    async def run() -> list[tuple[int, int]]:
        c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=True,
                             auto_commit_interval_ms=200, auto_offset_reset="earliest", fetch_max_wait_ms=100,
                             session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS)
        await c.start()
        out: list[tuple[int, int]] = []
        try:
            deadline = time.monotonic() + 30
            while len(out) < count and time.monotonic() < deadline:
                for recs in (await c.getmany(timeout_ms=200)).values():
                    out.extend((r.partition, r.offset) for r in recs)
        finally:
            await c.stop()  # auto-commits the final positions
        return out

    return asyncio.run(run())


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka"])
def test_auto_commit_group_consumes_everything(broker, topic_name, client):
    parts, n = 3, 900
    create_topic(broker.bootstrap, topic_name, parts)
    recs = produce_values(broker.bootstrap, topic_name, n, parts)
    group = f"g-{topic_name}"
    consume = _kp_group_consume if client == "kafka-python" else _aio_group_consume
    got = consume(broker.bootstrap, topic_name, group, n)
    assert sorted(got) == sorted(recs)
    offs = committed_offsets(broker.bootstrap, group, topic_name, parts)
    assert {p: tp.offset for p, tp in offs.items()} == {p: n // parts for p in range(parts)}
    # the same group has nothing left to read; a new batch is read from the committed offsets
    more = produce_values(broker.bootstrap, topic_name, 30, parts, tag="more")
    assert sorted(consume(broker.bootstrap, topic_name, group, 30)) == sorted(more)


class KpMember(threading.Thread):
    """kafka-python group member (range assignor) on its own thread."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        super().__init__(daemon=True)
        self.args = (bootstrap, topic, group)
        self.assignment: set[int] = set()
        self.consumed: list[tuple[int, int]] = []
        self.errors: list[BaseException] = []
        self.stop_evt = threading.Event()

    def snapshot(self) -> set[int]:
        return set(self.assignment)

    def run(self) -> None:
        from kafka.coordinator.assignors.range import RangePartitionAssignor

        bootstrap, topic, group = self.args
        try:
            c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=True,
                              auto_commit_interval_ms=200, auto_offset_reset="earliest", fetch_max_wait_ms=100,
                              session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS,
                              partition_assignment_strategy=[RangePartitionAssignor])
            try:
                while not self.stop_evt.is_set():
                    for recs in c.poll(timeout_ms=100).values():
                        self.consumed.extend((r.partition, r.offset) for r in recs)
                    self.assignment = {tp.partition for tp in c.assignment()}
            finally:
                c.close()
        except BaseException as e:  # noqa: BLE001
            self.errors.append(e)


class AioMember(KpMember):
    """aiokafka group member (range assignor) with its own event loop on its own thread."""

    def run(self) -> None:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.coordinator.assignors.range import RangePartitionAssignor

        bootstrap, topic, group = self.args

        async def main() -> None:
            c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=True,
                                 auto_commit_interval_ms=200, auto_offset_reset="earliest", fetch_max_wait_ms=100,
                                 session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS,
                                 partition_assignment_strategy=(RangePartitionAssignor,))
            await c.start()
            try:
                while not self.stop_evt.is_set():
                    for recs in (await c.getmany(timeout_ms=100)).values():
                        self.consumed.extend((r.partition, r.offset) for r in recs)
                    self.assignment = {tp.partition for tp in c.assignment()}
            finally:
                await c.stop()

        try:
            asyncio.run(main())
        except BaseException as e:  # noqa: BLE001
            self.errors.append(e)


def test_mixed_client_group_range(broker, topic_name, members):
    """confluent + kafka-python + aiokafka in one group with the range assignor: 2 partitions each, disjoint,
    covering all 6; every record produced after the group settled is consumed exactly once, by its owner."""
    parts, n = 6, 1200
    create_topic(broker.bootstrap, topic_name, parts)
    group = f"g-{topic_name}"
    ck = members(broker.bootstrap, group, topic_name, partition_assignment_strategy="range")
    kp = KpMember(broker.bootstrap, topic_name, group)
    aio = AioMember(broker.bootstrap, topic_name, group)
    kp.start()
    aio.start()
    try:
        trio = [ck, kp, aio]
        wait_until(lambda: settled(trio, parts, [2, 2, 2]), timeout=40, interval=0.1, what="mixed group settled")
        time.sleep(1.0)  # no further rebalance
        assert settled(trio, parts, [2, 2, 2])
        owned = [m.snapshot() for m in trio]
        recs = produce_values(broker.bootstrap, topic_name, n, parts)
        wait_until(lambda: sum(len(m.consumed) for m in trio) >= n, timeout=30, what="all consumed")
        time.sleep(0.3)
        for m, mine in zip(trio, owned, strict=True):
            assert {p for p, _ in m.consumed} == mine
        everything = [r for m in trio for r in m.consumed]
        assert len(everything) == len(set(everything)) == n
        assert set(everything) == recs
        assert [m.snapshot() for m in trio] == owned
        desc = describe(broker.bootstrap, group)
        assert desc.state == ConsumerGroupState.STABLE and desc.partition_assignor == "range"
        assert len(desc.members) == 3
        assert sorted(tp.partition for mem in desc.members for tp in mem.assignment.topic_partitions) == list(
            range(parts))
    finally:
        kp.stop_evt.set()
        aio.stop_evt.set()
        kp.join(30)
        aio.join(30)
    assert not kp.errors and not aio.errors and not ck.errors, (kp.errors, aio.errors, ck.errors)


# ---------------------------------------------------------------- 3. restart, describe/list/delete, offsets


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "own").start()
    yield b
    b.kill()


def test_restart_resume_describe_list_delete(own_broker, topic_name, members):
    b = own_broker
    parts, n = 2, 200
    create_topic(b.bootstrap, topic_name, parts)
    recs = produce_values(b.bootstrap, topic_name, n, parts)
    group, meta_group = f"g-{topic_name}", f"meta-{topic_name}"

    # commit 60 of each partition's 100 with a metadata string, through a real group member
    c = Consumer(group_conf(b.bootstrap, group, **{"enable.auto.commit": False}))
    c.subscribe([topic_name])
    seen: dict[int, list[Any]] = {0: [], 1: []}
    deadline = time.monotonic() + 30
    while min(len(v) for v in seen.values()) < 60 and time.monotonic() < deadline:
        for m in c.consume(100, 0.2):
            if not m.error():
                seen[m.partition()].append(m)
    assert min(len(v) for v in seen.values()) >= 60
    res = c.commit(offsets=[TopicPartition(topic_name, p, 60, metadata=f"meta-{p}",
                                           leader_epoch=seen[p][59].leader_epoch())
                            for p in range(parts)], asynchronous=False)
    assert not any(tp.error for tp in res)
    c.close()

    # a simple (generation -1) commit with metadata and a leader epoch, through kafka-python
    kc = KafkaConsumer(bootstrap_servers=b.bootstrap, group_id=meta_group, enable_auto_commit=False)
    kc.assign([KTP(topic_name, 1)])
    kc.commit({KTP(topic_name, 1): KOffsetAndMetadata(42, "hello-\u00e9t\u00e9", 7)})
    kc.close(autocommit=False)

    b.restart()  # SIGTERM, then start on the same data dir
    cadmin = ck_admin(b.bootstrap)

    # offsets and metadata survived, as both admin clients see them
    offs = committed_offsets(b.bootstrap, group, topic_name, parts)
    assert {p: (tp.offset, tp.metadata) for p, tp in offs.items()} == {0: (60, "meta-0"), 1: (60, "meta-1")}
    epochs = {p: seen[p][59].leader_epoch() for p in range(parts)}
    assert all(e is not None and e >= 0 for e in epochs.values()), epochs
    assert {p: tp.leader_epoch for p, tp in offs.items()} == epochs
    # (confluent's AdminClient.list_consumer_group_offsets sometimes decodes bytes past the end of a non-ASCII
    # metadata string -- a client-side read of an unterminated buffer -- so read that one as a consumer does.)
    probe = Consumer(group_conf(b.bootstrap, meta_group))
    try:
        meta_offs = {tp.partition: tp for tp in probe.committed(
            [TopicPartition(topic_name, p) for p in range(parts)], timeout=T)}
    finally:
        probe.close()
    assert (meta_offs[1].offset, meta_offs[1].metadata, meta_offs[1].leader_epoch) == (42, "hello-\u00e9t\u00e9", 7)
    assert meta_offs[0].offset < 0
    kadmin = KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=10000)
    try:
        kp_offs = kadmin.list_group_offsets({meta_group: None, group: None})
        assert kp_offs[meta_group] == {KTP(topic_name, 1): KOffsetAndMetadata(42, "hello-\u00e9t\u00e9", 7)}
        # confluent-kafka commits a metadata string with its C terminator; the broker keeps the bytes as sent
        assert {tp.partition: (o.offset, o.metadata) for tp, o in kp_offs[group].items()} == {
            0: (60, "meta-0\x00"), 1: (60, "meta-1\x00")}

        # a member of the group resumes at the committed offsets: no committed record comes back
        m = members(b.bootstrap, group, topic_name, manual_commit=True)
        wait_until(lambda: len(m.committed) >= n - 120, timeout=30, what="the rest consumed")
        time.sleep(0.3)
        assert sorted(m.consumed) == sorted(r for r in recs if r[1] >= 60)

        # DescribeGroups: Stable, one member owning both partitions
        desc = describe(b.bootstrap, group)
        assert desc.state == ConsumerGroupState.STABLE and not desc.is_simple_consumer_group
        assert desc.partition_assignor == "range" and len(desc.members) == 1
        assert desc.members[0].member_id == m.member_id
        assert sorted(tp.partition for tp in desc.members[0].assignment.topic_partitions) == [0, 1]
        kd = kadmin.describe_groups([group])
        kd = kd[group] if isinstance(kd, dict) else kd[0]
        kd = kd if isinstance(kd, dict) else kd._asdict()
        assert kd["group_state"] == "Stable" and kd["protocol_type"] == "consumer" and kd["protocol_data"] == "range"
        assert [mm["member_id"] for mm in kd["members"]] == [m.member_id]
        assignment = kd["members"][0]["member_assignment"]
        assignment = assignment if isinstance(assignment, dict) else assignment.to_dict()
        assert str(assignment).count(topic_name) >= 1

        # ListGroups
        listed = cadmin.list_consumer_groups(request_timeout=10).result(T)
        states = {g.group_id: g.state for g in listed.valid}
        assert states[group] == ConsumerGroupState.STABLE and states[meta_group] == ConsumerGroupState.EMPTY
        kl = {g["group_id"] if isinstance(g, dict) else g[0]: g for g in kadmin.list_groups()}
        assert {group, meta_group} <= set(kl)

        # DeleteGroups: refused while the group has members, fine once it is empty
        fut = cadmin.delete_consumer_groups([group], request_timeout=10)[group]
        with pytest.raises(KafkaException) as ei:
            fut.result(T)
        assert ei.value.args[0].code() == CKError.NON_EMPTY_GROUP
        kdel = dict(kadmin.delete_groups([group]))
        assert "NonEmptyGroup" in str(kdel[group]), kdel
        m.stop()  # LeaveGroup: the group becomes Empty
        wait_until(lambda: describe(b.bootstrap, group).state == ConsumerGroupState.EMPTY, timeout=10,
                   what="empty group")
        offs = committed_offsets(b.bootstrap, group, topic_name, parts)
        assert {p: tp.offset for p, tp in offs.items()} == {0: 100, 1: 100}
        cadmin.delete_consumer_groups([group], request_timeout=10)[group].result(T)
        kdel = dict(kadmin.delete_groups([meta_group]))
        assert str(kdel[meta_group]) == "OK", kdel
        listed = cadmin.list_consumer_groups(request_timeout=10).result(T)
        assert not {group, meta_group} & {g.group_id for g in listed.valid}
        assert all(tp.offset < 0 for tp in committed_offsets(b.bootstrap, group, topic_name, parts).values())
    finally:
        kadmin.close()

    # deletions are durable too
    b.restart()
    listed = cadmin.list_consumer_groups(request_timeout=10).result(T)
    assert not {group, meta_group} & {g.group_id for g in listed.valid}


# ---------------------------------------------------------------- 4. kcat -G


@pytest.mark.skipif(not have_kcat(), reason="kcat not installed")
def test_kcat_balanced_consumer_commits(broker, topic_name):
    parts = 2
    create_topic(broker.bootstrap, topic_name, parts)
    group = f"g-{topic_name}"
    args = ("-G", group, topic_name, "-e", "-q", "-f", "%p:%o:%s\n", "-X", "auto.offset.reset=earliest")

    def run() -> list[str]:
        return kcat(broker.bootstrap, *args, timeout=60).stdout.decode().split()

    produce_values(broker.bootstrap, topic_name, 50, parts, tag="a")
    first = run()
    assert sorted(first) == sorted(f"{i % 2}:{i // 2}:a-{i}" for i in range(50))
    assert run() == []
    produce_values(broker.bootstrap, topic_name, 10, parts, tag="b")
    assert sorted(run()) == sorted(f"{i % 2}:{25 + i // 2}:b-{i}" for i in range(10))
    offs = committed_offsets(broker.bootstrap, group, topic_name, parts)
    assert {p: tp.offset for p, tp in offs.items()} == {0: 30, 1: 30}


# ---------------------------------------------------------------- 5. cooperative-sticky


def test_cooperative_sticky_moves_only_what_must_move(broker, topic_name, members):
    parts = 6
    create_topic(broker.bootstrap, topic_name, parts)
    group = f"g-{topic_name}"
    conf = {"partition_assignment_strategy": "cooperative-sticky"}
    c1 = members(broker.bootstrap, group, topic_name, **conf)
    wait_until(lambda: c1.snapshot() == set(range(parts)), timeout=20, what="c1 owns all")
    c2 = members(broker.bootstrap, group, topic_name, **conf)
    wait_until(lambda: settled([c1, c2], parts, [3, 3]), timeout=30, what="3/3")
    # c1 gave up exactly three, incrementally: it never had everything revoked
    revoked_1 = [ev[1] for ev in c1.events if ev[0] == "revoke"]
    assert revoked_1 and set().union(*revoked_1) == set(range(parts)) - c1.snapshot()
    before = {1: c1.snapshot(), 2: c2.snapshot()}
    n1, n2 = c1.n_events(), c2.n_events()

    c3 = members(broker.bootstrap, group, topic_name, **conf)
    wait_until(lambda: settled([c1, c2, c3], parts, [2, 2, 2]), timeout=30, what="2/2/2")
    time.sleep(1.0)
    assert settled([c1, c2, c3], parts, [2, 2, 2])
    after = {1: c1.snapshot(), 2: c2.snapshot()}
    for i, m in ((1, c1), (2, c2)):
        assert after[i] < before[i], (i, before[i], after[i])  # kept a subset of what it had
        new = m.events[(n1 if i == 1 else n2):]
        revoked = set().union(*[ps for kind, ps, _ in new if kind == "revoke"])
        assigned = set().union(*[ps for kind, ps, _ in new if kind == "assign"])
        assert revoked == before[i] - after[i] and len(revoked) == 1, new  # only the partition that moved
        assert assigned == set(), new  # nothing gained
        assert not [ev for ev in new if ev[0] == "lost"]
    assert c3.snapshot() == (before[1] - after[1]) | (before[2] - after[2])
    assert all(kind == "assign" for kind, _, _ in c3.events), c3.events


# ---------------------------------------------------------------- 6. static membership


@pytest.mark.parametrize("restarted", ["follower", "leader"])
@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_static_member_restart_keeps_assignment_without_rebalance(broker, topic_name, members, strategy, restarted):
    """A static member (group.instance.id) closes without LeaveGroup and restarts with the same instance id
    within its session timeout: it gets its old partitions back, the other member sees no rebalance callback
    (so the generation it holds stays current: its later commits succeed), DescribeGroups shows the same
    assignment with only the restarted member's id changed. `leader` restarts the member that joined first."""
    parts = 4
    create_topic(broker.bootstrap, topic_name, parts)
    group = f"g-{topic_name}"
    conf = {"partition_assignment_strategy": strategy, "session_timeout_ms": 10000}
    first = members(broker.bootstrap, group, topic_name, manual_commit=True, group_instance_id="inst-1", **conf)
    wait_until(lambda: first.snapshot() == set(range(parts)), timeout=20, what="the leader owns all")
    second = members(broker.bootstrap, group, topic_name, manual_commit=True, group_instance_id="inst-2", **conf)
    wait_until(lambda: settled([first, second], parts, [2, 2]), timeout=30, what="2/2")
    time.sleep(0.5)
    desc = describe(broker.bootstrap, group)
    assert desc.state == ConsumerGroupState.STABLE
    ids_before = {mm.group_instance_id: mm.member_id for mm in desc.members}
    assert set(ids_before) == {"inst-1", "inst-2"}
    gone, stays = (first, second) if restarted == "leader" else (second, first)
    gone_inst = "inst-1" if restarted == "leader" else "inst-2"
    owned_gone, owned_stays = gone.snapshot(), stays.snapshot()
    n_stays = stays.n_events()

    gone.stop()  # librdkafka static members close without LeaveGroup
    desc = describe(broker.bootstrap, group)
    assert desc.state == ConsumerGroupState.STABLE and len(desc.members) == 2  # still a member
    back = members(broker.bootstrap, group, topic_name, manual_commit=True, group_instance_id=gone_inst, **conf)
    wait_until(lambda: back.snapshot(), timeout=10, what="restarted static member assigned")
    assert back.snapshot() == owned_gone
    time.sleep(2.0)  # four heartbeat intervals: a rebalance would have reached the other member by now
    assert stays.n_events() == n_stays, stays.events[n_stays:]
    assert stays.snapshot() == owned_stays and back.snapshot() == owned_gone
    assert not [ev for ev in back.events if ev[0] != "assign"], back.events
    desc = describe(broker.bootstrap, group)
    assert desc.state == ConsumerGroupState.STABLE
    ids_after = {mm.group_instance_id: mm.member_id for mm in desc.members}
    stays_inst = "inst-2" if restarted == "leader" else "inst-1"
    assert ids_after[stays_inst] == ids_before[stays_inst] and ids_after[gone_inst] != ids_before[gone_inst]
    assert {mm.group_instance_id: {tp.partition for tp in mm.assignment.topic_partitions}
            for mm in desc.members} == {gone_inst: owned_gone, stays_inst: owned_stays}

    # both keep consuming and committing in the unchanged generation
    recs = produce_values(broker.bootstrap, topic_name, 40, parts)
    wait_until(lambda: len(stays.committed) + len(back.committed) >= 40, timeout=20, what="consumed")
    assert {p for p, _ in stays.consumed} == owned_stays and {p for p, _ in back.consumed} == owned_gone
    assert set(stays.committed) | set(back.committed) == recs
    assert not stays.commit_failures and not back.commit_failures, (stays.commit_failures, back.commit_failures)
    assert stays.n_events() == n_stays

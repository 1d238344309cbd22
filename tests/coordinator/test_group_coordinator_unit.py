"""GroupCoordinator without a network: the classic group state machine driven directly on its loop thread.

The coordinator runs its own event loop thread; a fake host backs __consumer_offsets with real storage Logs in a
temp dir. These cover the error paths that are awkward to provoke with real clients.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kbroker.coordinator.group_coordinator import GroupConfig, GroupCoordinator, JoinResult, partition_for
from kbroker.coordinator.group_metadata import GroupState, OffsetAndMetadata
from kbroker.protocol import codec
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import ConsumerProtocolSubscription
from kbroker.protocol.primitives import I16
from kbroker.storage.config import LogConfig
from kbroker.storage.log import Log

NUM_PARTITIONS = 3
TOPICS = {"orders": 4, "payments": 2}
SESSION = 10000
TIMEOUT = 5.0


class FakeHost:
    """Leads every __consumer_offsets partition; logs are real storage Logs under a temp dir."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.logs: dict[int, Log] = {}
        self.lead = True

    def offsets_log(self, partition: int) -> Log:
        lg = self.logs.get(partition)
        if lg is None:
            lg = self.logs[partition] = Log.open(
                self.root / f"__consumer_offsets-{partition}", "__consumer_offsets", partition,
                LogConfig(cleanup_policy="compact"), clean_shutdown=True,
            )
        return lg

    def leads_offsets_partition(self, partition: int) -> bool:
        return self.lead

    def topic_partition_exists(self, topic: str, partition: int) -> bool:
        return topic in TOPICS and 0 <= partition < TOPICS[topic]

    async def flush_log(self, lg: Log, offset: int) -> None:
        lg.flush(offset + 1)

    def close(self) -> None:
        for lg in self.logs.values():
            lg.close()
        self.logs.clear()


def subscription(*topics: str) -> bytes:
    out = bytearray(I16.pack(1))
    codec.encode(ConsumerProtocolSubscription(topics=list(topics)), 1, out)
    return bytes(out)


class Harness:
    def __init__(self, host: FakeHost, **config: Any) -> None:
        self.host = host
        self.gc = GroupCoordinator(host, GroupConfig(**{
            "num_partitions": NUM_PARTITIONS, "initial_rebalance_delay_ms": 0, "min_session_timeout_ms": 100,
            "max_session_timeout_ms": 60000, **config,
        }))

    def start(self, load: list[int] | None = None) -> Harness:
        self.gc.start(load or [])
        return self

    def submit(self, fn: Any, *args: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(fn(*args), self.gc.loop)

    def run(self, fn: Any, *args: Any) -> Any:
        return self.submit(fn, *args).result(TIMEOUT)

    def on_loop(self, fn: Any) -> Any:
        async def wrapped() -> Any:
            return fn()
        return self.run(wrapped)

    def group(self, gid: str) -> Any:
        return self.on_loop(lambda: self.gc.groups.get(gid))

    def state(self, gid: str) -> GroupState | None:
        return self.on_loop(lambda: self.gc.groups[gid].state if gid in self.gc.groups else None)

    def join_async(self, gid: str, member_id: str = "", instance_id: str | None = None, *,
                   require_known: bool = False, session_ms: int = SESSION, rebalance_ms: int = SESSION,
                   protocol_type: str = "consumer", protocols: list[tuple[str, bytes]] | None = None,
                   client_id: str = "c") -> concurrent.futures.Future[JoinResult]:
        if protocols is None:
            protocols = [("range", subscription("orders"))]
        return self.submit(self.gc.join_group, gid, member_id, instance_id, require_known, client_id, "/127.0.0.1",
                           rebalance_ms, session_ms, protocol_type, protocols)

    def join(self, gid: str, member_id: str = "", instance_id: str | None = None, **kw: Any) -> JoinResult:
        return self.join_async(gid, member_id, instance_id, **kw).result(TIMEOUT)

    def sync(self, gid: str, generation: int, member_id: str, instance_id: str | None = None,
             assignments: dict[str, bytes] | None = None) -> tuple[ErrorCode, bytes, str | None, str | None]:
        return self.run(self.gc.sync_group, gid, generation, member_id, instance_id, None, None, assignments or {})

    def heartbeat(self, gid: str, generation: int, member_id: str, instance_id: str | None = None) -> ErrorCode:
        return self.run(self.gc.heartbeat, gid, generation, member_id, instance_id)

    def commit(self, gid: str, generation: int, member_id: str, offsets: dict[tuple[str, int], int],
               instance_id: str | None = None, metadata: str = "") -> dict[tuple[str, int], ErrorCode]:
        now = int(time.time() * 1000)
        return self.run(self.gc.commit_offsets, gid, generation, member_id, instance_id,
                        {tp: OffsetAndMetadata(o, 5, metadata, now) for tp, o in offsets.items()})

    def stable_single(self, gid: str, instance_id: str | None = None, **kw: Any) -> JoinResult:
        """One member joins and syncs: the group is Stable with that member as leader."""
        r = self.join(gid, instance_id=instance_id, **kw)
        assert r.error == ErrorCode.NONE, r
        err, assignment, _, _ = self.sync(gid, r.generation_id, r.member_id, instance_id, {r.member_id: b"A1"})
        assert (err, assignment) == (ErrorCode.NONE, b"A1")
        assert self.state(gid) is GroupState.STABLE
        return r

    def stop(self) -> None:
        self.gc.stop()


@pytest.fixture
def host(tmp_path: Path) -> Iterator[FakeHost]:
    h = FakeHost(tmp_path)
    yield h
    h.close()


@pytest.fixture
def h(host: FakeHost) -> Iterator[Harness]:
    harness = Harness(host).start()
    yield harness
    harness.stop()


def wait_for(pred: Any, timeout: float = TIMEOUT, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def two_member_stable(h: Harness, gid: str) -> tuple[JoinResult, JoinResult]:
    """Leader A, then B joins (A rejoins), both sync: Stable generation 2."""
    a = h.stable_single(gid)
    fb = h.join_async(gid)
    wait_for(lambda: h.state(gid) is GroupState.PREPARING_REBALANCE, what="rebalance")
    a2 = h.join(gid, a.member_id)
    b = fb.result(TIMEOUT)
    assert a2.error == b.error == ErrorCode.NONE
    assert a2.generation_id == b.generation_id == a.generation_id + 1
    assert a2.leader_id == a.member_id and {m for m, _, _ in a2.members} == {a.member_id, b.member_id}
    assert b.members == []
    fs = h.submit(h.gc.sync_group, gid, b.generation_id, b.member_id, None, None, None, {})
    err, assignment, _, _ = h.sync(gid, a2.generation_id, a.member_id, None,
                                   {a.member_id: b"A", b.member_id: b"B"})
    assert (err, assignment) == (ErrorCode.NONE, b"A")
    assert fs.result(TIMEOUT)[:2] == (ErrorCode.NONE, b"B")
    assert h.state(gid) is GroupState.STABLE
    return a2, b


# ---------------------------------------------------------------- join


def test_first_join_creates_generation_one_and_leader(h: Harness) -> None:
    r = h.join("g")
    assert r.error == ErrorCode.NONE
    assert r.generation_id == 1 and r.leader_id == r.member_id and r.member_id.startswith("c-")
    assert r.protocol_type == "consumer" and r.protocol_name == "range"
    assert [m for m, _, _ in r.members] == [r.member_id]
    assert h.state("g") is GroupState.COMPLETING_REBALANCE


def test_member_id_required_then_join_with_given_id(h: Harness) -> None:
    r = h.join("g", require_known=True)
    assert r.error == ErrorCode.MEMBER_ID_REQUIRED and r.member_id
    r2 = h.join("g", r.member_id, require_known=True)
    assert r2.error == ErrorCode.NONE and r2.member_id == r.member_id and r2.generation_id == 1


def test_invalid_session_timeout(host: FakeHost) -> None:
    hx = Harness(host, min_session_timeout_ms=6000, max_session_timeout_ms=30000).start()
    try:
        assert hx.join("g", session_ms=5999).error == ErrorCode.INVALID_SESSION_TIMEOUT
        assert hx.join("g", session_ms=30001).error == ErrorCode.INVALID_SESSION_TIMEOUT
        assert hx.join("g", session_ms=6000).error == ErrorCode.NONE
    finally:
        hx.stop()


def test_invalid_group_id(h: Harness) -> None:
    assert h.join("").error == ErrorCode.INVALID_GROUP_ID


def test_inconsistent_group_protocol(h: Harness) -> None:
    h.stable_single("g")
    # different protocol type
    r = h.join("g", protocol_type="connect", protocols=[("range", b"x")])
    assert r.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    # no protocol in common with the current members
    r = h.join("g", protocols=[("roundrobin", subscription("orders"))])
    assert r.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    # empty protocol type or protocol list on an empty group
    assert h.join("g2", protocol_type="").error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert h.join("g3", protocols=[]).error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert h.state("g") is GroupState.STABLE


def test_unknown_member_join(h: Harness) -> None:
    assert h.join("nogroup", "someone").error == ErrorCode.UNKNOWN_MEMBER_ID
    h.stable_single("g")
    assert h.join("g", "someone").error == ErrorCode.UNKNOWN_MEMBER_ID


def test_protocol_selection_by_vote(h: Harness) -> None:
    protos_a = [("roundrobin", b"a"), ("range", b"a")]
    a = h.join("g", protocols=protos_a)
    assert a.protocol_name == "roundrobin"
    h.sync("g", a.generation_id, a.member_id, None, {a.member_id: b""})
    fb = h.join_async("g", protocols=[("range", b"b"), ("roundrobin", b"b")])
    fc = h.join_async("g", protocols=[("range", b"c")])
    wait_for(lambda: len(h.group("g").members) == 3, what="three members")
    a2 = h.join("g", a.member_id, protocols=protos_a)
    assert fb.result(TIMEOUT).protocol_name == fc.result(TIMEOUT).protocol_name == a2.protocol_name == "range"
    assert dict((m, meta) for m, _, meta in a2.members)[a.member_id] == b"a"


# ---------------------------------------------------------------- heartbeat


def test_heartbeat_error_codes(h: Harness) -> None:
    gid = "hb"
    assert h.heartbeat("missing-group", 1, "x") == ErrorCode.UNKNOWN_MEMBER_ID
    a, b = two_member_stable(h, gid)
    gen = a.generation_id
    assert h.heartbeat(gid, gen, a.member_id) == ErrorCode.NONE
    assert h.heartbeat(gid, gen, "stranger") == ErrorCode.UNKNOWN_MEMBER_ID
    assert h.heartbeat(gid, gen - 1, a.member_id) == ErrorCode.ILLEGAL_GENERATION
    assert h.heartbeat(gid, gen + 1, b.member_id) == ErrorCode.ILLEGAL_GENERATION
    # a third member joins: the group prepares a rebalance and current members learn it from heartbeats
    fc = h.join_async(gid)
    wait_for(lambda: h.state(gid) is GroupState.PREPARING_REBALANCE, what="rebalance")
    assert h.heartbeat(gid, gen, a.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
    assert h.heartbeat(gid, gen, b.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
    fa = h.join_async(gid, a.member_id)
    fb = h.join_async(gid, b.member_id)
    results = [f.result(TIMEOUT) for f in (fa, fb, fc)]
    assert {r.generation_id for r in results} == {gen + 1}
    # CompletingRebalance: heartbeats with the new generation are fine, the old one is illegal
    assert h.state(gid) is GroupState.COMPLETING_REBALANCE
    assert h.heartbeat(gid, gen + 1, results[2].member_id) == ErrorCode.NONE
    assert h.heartbeat(gid, gen, a.member_id) == ErrorCode.ILLEGAL_GENERATION


def test_heartbeat_on_empty_group_is_unknown_member(h: Harness) -> None:
    a = h.stable_single("g")
    err, results = h.run(h.gc.leave_group, "g", [(a.member_id, None)])
    assert err == ErrorCode.NONE and results == [ErrorCode.NONE]
    wait_for(lambda: h.state("g") is GroupState.EMPTY, what="empty group")
    assert h.heartbeat("g", a.generation_id, a.member_id) == ErrorCode.UNKNOWN_MEMBER_ID


def test_sync_errors(h: Harness) -> None:
    a = h.stable_single("g")
    assert h.sync("nogroup", 1, "x")[0] == ErrorCode.UNKNOWN_MEMBER_ID
    assert h.sync("g", a.generation_id, "stranger")[0] == ErrorCode.UNKNOWN_MEMBER_ID
    assert h.sync("g", a.generation_id + 1, a.member_id)[0] == ErrorCode.ILLEGAL_GENERATION
    err, *_ = h.run(h.gc.sync_group, "g", a.generation_id, a.member_id, None, "consumer", "roundrobin", {})
    assert err == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    # Stable: a repeated sync returns the current assignment
    assert h.sync("g", a.generation_id, a.member_id)[:2] == (ErrorCode.NONE, b"A1")


def test_session_timeout_removes_member_and_rebalances(h: Harness) -> None:
    a = h.stable_single("g", session_ms=300)
    fb = h.join_async("g", session_ms=5000)
    # a never rejoins or heartbeats: after its 300 ms session it is removed and b gets its own generation
    b = fb.result(TIMEOUT)
    assert b.error == ErrorCode.NONE and b.leader_id == b.member_id
    assert b.generation_id == a.generation_id + 1
    assert [m for m, _, _ in b.members] == [b.member_id]
    assert h.heartbeat("g", b.generation_id, a.member_id) == ErrorCode.UNKNOWN_MEMBER_ID
    # b stops too: the group becomes Empty
    h.sync("g", b.generation_id, b.member_id, None, {b.member_id: b""})
    h.on_loop(lambda: setattr(h.gc.groups["g"].members[b.member_id], "session_timeout_ms", 200))
    h.heartbeat("g", b.generation_id, b.member_id)
    wait_for(lambda: h.state("g") is GroupState.EMPTY, timeout=3, what="empty after session timeout")


def test_leave_group(h: Harness) -> None:
    a, b = two_member_stable(h, "g")
    err, results = h.run(h.gc.leave_group, "g", [(b.member_id, None), ("stranger", None)])
    assert err == ErrorCode.NONE and results == [ErrorCode.NONE, ErrorCode.UNKNOWN_MEMBER_ID]
    assert h.state("g") is GroupState.PREPARING_REBALANCE
    a2 = h.join("g", a.member_id)
    assert a2.generation_id == a.generation_id + 1 and [m for m, _, _ in a2.members] == [a.member_id]


# ---------------------------------------------------------------- static membership


def test_static_member_rejoin_keeps_generation_and_fences_old_id(h: Harness) -> None:
    gid = "static"
    lead = h.stable_single(gid, instance_id="i-lead")
    fb = h.join_async(gid, instance_id="i-b")
    wait_for(lambda: h.state(gid) is GroupState.PREPARING_REBALANCE, what="rebalance")
    lead2 = h.join(gid, lead.member_id, "i-lead")
    b = fb.result(TIMEOUT)
    gen = b.generation_id
    fs = h.submit(h.gc.sync_group, gid, gen, b.member_id, "i-b", None, None, {})
    h.sync(gid, gen, lead2.member_id, "i-lead", {lead2.member_id: b"L", b.member_id: b"B"})
    assert fs.result(TIMEOUT)[:2] == (ErrorCode.NONE, b"B")

    # i-b restarts with a fresh (empty) member id: same generation, no rebalance, old id fenced
    b2 = h.join(gid, instance_id="i-b")
    assert b2.error == ErrorCode.NONE and b2.member_id != b.member_id
    assert b2.generation_id == gen and b2.members == [] and b2.leader_id == lead2.member_id
    assert h.state(gid) is GroupState.STABLE
    assert h.sync(gid, gen, b2.member_id, "i-b")[:2] == (ErrorCode.NONE, b"B")
    assert h.heartbeat(gid, gen, lead2.member_id, "i-lead") == ErrorCode.NONE
    assert h.heartbeat(gid, gen, b.member_id, "i-b") == ErrorCode.FENCED_INSTANCE_ID
    assert h.sync(gid, gen, b.member_id, "i-b")[0] == ErrorCode.FENCED_INSTANCE_ID
    assert h.join(gid, b.member_id, "i-b").error == ErrorCode.FENCED_INSTANCE_ID
    assert h.commit(gid, gen, b.member_id, {("orders", 0): 1}, instance_id="i-b") == {
        ("orders", 0): ErrorCode.FENCED_INSTANCE_ID}
    err, results = h.run(h.gc.leave_group, gid, [(b.member_id, "i-b")])
    assert results == [ErrorCode.FENCED_INSTANCE_ID]
    assert h.heartbeat(gid, gen, b2.member_id, "i-b") == ErrorCode.NONE

    # the leader restarts: it gets the member list back but may skip the assignment
    lead3 = h.join(gid, instance_id="i-lead")
    assert lead3.error == ErrorCode.NONE and lead3.generation_id == gen
    assert lead3.leader_id == lead3.member_id and lead3.skip_assignment
    assert {m for m, _, _ in lead3.members} == {lead3.member_id, b2.member_id}
    assert h.state(gid) is GroupState.STABLE

    # before JoinGroup v9 a rejoining leader is told the old leader id and gets no member list
    lead4 = h.run(h.gc.join_group, gid, "", "i-lead", True, "c", "/127.0.0.1", SESSION, SESSION, "consumer",
                  [("range", subscription("orders"))], False)
    assert lead4.error == ErrorCode.NONE and lead4.generation_id == gen
    assert lead4.leader_id == lead3.member_id != lead4.member_id and lead4.members == [] and not lead4.skip_assignment
    assert h.on_loop(lambda: h.gc.groups[gid].leader_id) == lead4.member_id
    assert h.sync(gid, gen, lead4.member_id, "i-lead")[:2] == (ErrorCode.NONE, b"L")

    # new subscription bytes (as cooperative assignors send: owned partitions, generation) but the same
    # selected protocol: still no rebalance, and the new metadata is kept
    b3 = h.join(gid, instance_id="i-b", protocols=[("range", subscription("orders", "payments"))])
    assert b3.error == ErrorCode.NONE and b3.generation_id == gen and h.state(gid) is GroupState.STABLE
    assert h.on_loop(lambda: h.gc.groups[gid].members[b3.member_id].protocols) == [
        ("range", subscription("orders", "payments"))]

    # LeaveGroup by instance id removes the static member
    err, results = h.run(h.gc.leave_group, gid, [("", "i-b")])
    assert results == [ErrorCode.NONE]
    assert h.state(gid) is GroupState.PREPARING_REBALANCE


def test_static_member_rejoin_changing_selected_protocol_rebalances(h: Harness) -> None:
    gid = "static-proto"
    protos = [("range", b"r"), ("roundrobin", b"rr")]
    a = h.stable_single(gid, instance_id="i-a", protocols=protos)
    assert a.protocol_name == "range"
    # the only member now prefers roundrobin: the selected protocol changes, so the group rebalances
    fa = h.join_async(gid, instance_id="i-a", protocols=[("roundrobin", b"rr"), ("range", b"r")])
    a2 = fa.result(TIMEOUT)
    assert a2.error == ErrorCode.NONE and a2.generation_id == a.generation_id + 1
    assert a2.protocol_name == "roundrobin" and a2.leader_id == a2.member_id


def test_static_member_survives_session_timeout_only_until_it_expires(h: Harness) -> None:
    """A static member that stops heartbeating is removed after its session timeout like any other."""
    a = h.stable_single("g", instance_id="i-a", session_ms=300)
    wait_for(lambda: h.state("g") is GroupState.EMPTY, timeout=3, what="empty group")
    assert h.on_loop(lambda: h.gc.groups["g"].static_members) == {}
    r = h.join("g", instance_id="i-a")
    assert r.error == ErrorCode.NONE and r.member_id != a.member_id and r.generation_id == a.generation_id + 2


# ---------------------------------------------------------------- offsets


def test_offset_commit_generation_checks(h: Harness) -> None:
    gid = "oc"
    tp = ("orders", 1)
    # no such group: a simple (generation -1) commit creates it, a generation-aware commit is illegal
    assert h.commit("fresh", 3, "m", {tp: 1}) == {tp: ErrorCode.ILLEGAL_GENERATION}
    assert h.commit("simple", -1, "", {tp: 7}) == {tp: ErrorCode.NONE}
    assert h.state("simple") is GroupState.EMPTY

    a = h.join(gid)
    # CompletingRebalance: members must wait for the assignment
    assert h.commit(gid, a.generation_id, a.member_id, {tp: 1}) == {tp: ErrorCode.REBALANCE_IN_PROGRESS}
    h.sync(gid, a.generation_id, a.member_id, None, {a.member_id: b""})
    assert h.commit(gid, a.generation_id, a.member_id, {tp: 10}) == {tp: ErrorCode.NONE}
    assert h.commit(gid, a.generation_id - 1, a.member_id, {tp: 11}) == {tp: ErrorCode.ILLEGAL_GENERATION}
    assert h.commit(gid, a.generation_id + 1, a.member_id, {tp: 11}) == {tp: ErrorCode.ILLEGAL_GENERATION}
    assert h.commit(gid, a.generation_id, "stranger", {tp: 11}) == {tp: ErrorCode.UNKNOWN_MEMBER_ID}
    # a non-member simple commit into an active group is refused
    assert h.commit(gid, -1, "", {tp: 11}) == {tp: ErrorCode.UNKNOWN_MEMBER_ID}
    err, got = h.run(h.gc.fetch_offsets, gid, [tp])
    assert err == ErrorCode.NONE and got[tp] is not None and got[tp].offset == 10


def test_offset_commit_partition_errors_and_metadata(h: Harness) -> None:
    big = "x" * 4097
    res = h.commit("g", -1, "", {("orders", 0): 5, ("orders", 4): 5, ("nope", 0): 5}, metadata="m1")
    assert res == {("orders", 0): ErrorCode.NONE, ("orders", 4): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                   ("nope", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    assert h.commit("g", -1, "", {("orders", 1): 5}, metadata=big) == {("orders", 1): ErrorCode.OFFSET_METADATA_TOO_LARGE}
    err, got = h.run(h.gc.fetch_offsets, "g", None)
    assert err == ErrorCode.NONE and set(got) == {("orders", 0)}
    o = got[("orders", 0)]
    assert (o.offset, o.leader_epoch, o.metadata) == (5, 5, "m1")
    err, got = h.run(h.gc.fetch_offsets, "g", [("orders", 0), ("orders", 3)])
    assert got[("orders", 3)] is None


def test_offset_delete(h: Harness) -> None:
    gid = "od"
    a = h.join(gid, protocols=[("range", subscription("orders"))])
    h.sync(gid, a.generation_id, a.member_id, None, {a.member_id: b""})
    assert h.commit(gid, a.generation_id, a.member_id, {("orders", 0): 3, ("payments", 1): 4}) == {
        ("orders", 0): ErrorCode.NONE, ("payments", 1): ErrorCode.NONE}
    err, res = h.run(h.gc.delete_offsets, gid, [("orders", 0), ("payments", 1)])
    assert err == ErrorCode.NONE
    assert res == {("orders", 0): ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC, ("payments", 1): ErrorCode.NONE}
    _, got = h.run(h.gc.fetch_offsets, gid, None)
    assert set(got) == {("orders", 0)}
    assert h.run(h.gc.delete_offsets, "missing", [("orders", 0)])[0] == ErrorCode.GROUP_ID_NOT_FOUND
    # once the group is empty, subscribed topics can go too
    h.run(h.gc.leave_group, gid, [(a.member_id, None)])
    wait_for(lambda: h.state(gid) is GroupState.EMPTY, what="empty")
    err, res = h.run(h.gc.delete_offsets, gid, [("orders", 0)])
    assert (err, res) == (ErrorCode.NONE, {("orders", 0): ErrorCode.NONE})
    assert h.run(h.gc.fetch_offsets, gid, None) == (ErrorCode.NONE, {})


def test_delete_groups(h: Harness) -> None:
    a = h.stable_single("busy")
    h.commit("idle", -1, "", {("orders", 0): 1})
    res = h.run(h.gc.delete_groups, ["busy", "idle", "missing"])
    assert res == {"busy": ErrorCode.NON_EMPTY_GROUP, "idle": ErrorCode.NONE, "missing": ErrorCode.GROUP_ID_NOT_FOUND}
    assert h.group("idle") is None
    assert h.run(h.gc.fetch_offsets, "idle", None) == (ErrorCode.NONE, {})
    err, groups = h.run(h.gc.list_groups)
    assert err == ErrorCode.NONE and [g.group_id for g in groups] == ["busy"]
    assert a.member_id in h.group("busy").members


def test_not_coordinator_and_loading(host: FakeHost) -> None:
    hx = Harness(host).start()
    try:
        host.lead = False
        assert hx.join("g").error == ErrorCode.NOT_COORDINATOR
        assert hx.heartbeat("g", 1, "m") == ErrorCode.NOT_COORDINATOR
        host.lead = True
        p = partition_for("g", NUM_PARTITIONS)
        hx.on_loop(lambda: hx.gc.loading.add(p))
        assert hx.join("g").error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assert hx.commit("g", -1, "", {("orders", 0): 1}) == {("orders", 0): ErrorCode.COORDINATOR_LOAD_IN_PROGRESS}
        assert hx.run(hx.gc.list_groups)[0] == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    finally:
        hx.stop()


# ---------------------------------------------------------------- persistence


def test_offsets_and_group_reload_from_log(host: FakeHost) -> None:
    h1 = Harness(host).start()
    try:
        a, b = two_member_stable(h1, "live")
        assert h1.commit("live", a.generation_id, a.member_id, {("orders", 2): 42}, metadata="meta-42") == {
            ("orders", 2): ErrorCode.NONE}
        h1.commit("simple", -1, "", {("orders", 0): 1})
        h1.commit("simple", -1, "", {("orders", 0): 2, ("payments", 0): 9})
        h1.commit("gone", -1, "", {("orders", 0): 1})
        assert h1.run(h1.gc.delete_groups, ["gone"]) == {"gone": ErrorCode.NONE}
        h1.commit("od", -1, "", {("orders", 0): 1, ("orders", 1): 1})
        h1.run(h1.gc.delete_offsets, "od", [("orders", 1)])
    finally:
        h1.stop()

    h2 = Harness(host).start(list(range(NUM_PARTITIONS)))
    try:
        wait_for(lambda: not h2.on_loop(lambda: set(h2.gc.loading)), what="load")
        g = h2.group("live")
        assert g.state is GroupState.STABLE and g.generation_id == a.generation_id
        assert set(g.members) == {a.member_id, b.member_id} and g.leader_id == a.member_id
        assert g.members[b.member_id].assignment == b"B" and g.protocol_name == "range"
        o = g.offsets[("orders", 2)]
        assert (o.offset, o.leader_epoch, o.metadata) == (42, 5, "meta-42")
        assert {tp: o.offset for tp, o in h2.group("simple").offsets.items()} == {("orders", 0): 2, ("payments", 0): 9}
        assert h2.group("gone") is None
        assert set(h2.group("od").offsets) == {("orders", 0)}
        # the reloaded members carry on with the same generation
        assert h2.heartbeat("live", a.generation_id, b.member_id) == ErrorCode.NONE
    finally:
        h2.stop()


def test_session_expires_at_its_deadline(h: Harness) -> None:
    """Kafka's DelayedHeartbeat: a member that stops heartbeating is gone right at its session deadline, so a
    DeleteGroups sent just after it finds the group empty (a periodic sweep answered NON_EMPTY_GROUP)."""
    a = h.stable_single("g", session_ms=400)

    async def delete_just_after_deadline() -> dict[str, ErrorCode]:
        deadline = h.gc.groups["g"].members[a.member_id].heartbeat_deadline
        await asyncio.sleep(max(0.0, deadline + 0.005 - h.gc.loop.time()))
        return await h.gc.delete_groups(["g"])

    assert h.run(delete_just_after_deadline) == {"g": ErrorCode.NONE}


def test_heartbeats_keep_moving_the_deadline(h: Harness) -> None:
    a = h.stable_single("g", session_ms=300)
    for _ in range(4):
        time.sleep(0.15)
        assert h.heartbeat("g", a.generation_id, a.member_id) == ErrorCode.NONE
    assert h.state("g") is GroupState.STABLE
    wait_for(lambda: h.state("g") is GroupState.EMPTY, timeout=3, what="expiry after the heartbeats stop")


def test_empty_group_keeps_its_protocol_type(host: FakeHost) -> None:
    h1 = Harness(host).start()
    try:
        a = h1.stable_single("g")
        h1.run(h1.gc.leave_group, "g", [(a.member_id, None)])
        wait_for(lambda: h1.state("g") is GroupState.EMPTY, what="empty group")
        g = h1.group("g")
        assert (g.protocol_type, g.protocol_name, g.leader_id) == ("consumer", None, None)
        # another protocol type may take over the empty group
        r = h1.join("g", protocol_type="connect", protocols=[("v1", b"x")])
        assert r.error == ErrorCode.NONE and h1.group("g").protocol_type == "connect"
        h1.run(h1.gc.leave_group, "g", [(r.member_id, None)])
        wait_for(lambda: h1.state("g") is GroupState.EMPTY, what="empty group")
    finally:
        h1.stop()
    h2 = Harness(host).start(list(range(NUM_PARTITIONS)))
    try:
        wait_for(lambda: not h2.on_loop(lambda: set(h2.gc.loading)), what="load")
        assert h2.group("g").protocol_type == "connect" and h2.state("g") is GroupState.EMPTY
    finally:
        h2.stop()

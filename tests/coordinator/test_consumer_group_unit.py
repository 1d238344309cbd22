"""KIP-848 consumer groups without a network: the assignors, the reconciliation step (CurrentAssignmentBuilder)
and the coordinator's heartbeat state machine driven directly on its loop thread, with __consumer_offsets in real
storage Logs (tests/coordinator/test_group_coordinator_unit.py's FakeHost), including a reload from them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kbroker.coordinator.consumer_group import ConsumerGroupMember, ConsumerGroupState, MemberState
from kbroker.coordinator.consumer_group_assignors import MemberSubscription, RangeAssignor, UniformAssignor
from kbroker.coordinator.consumer_group_current_assignment import CurrentAssignmentBuilder
from kbroker.coordinator.consumer_group_manager import ConsumerHeartbeat, ConsumerHeartbeatResult
from kbroker.protocol.errors import ErrorCode

from tests.coordinator.test_group_coordinator_unit import FakeHost, Harness

T1, T2, T3 = b"\x01" * 16, b"\x02" * 16, b"\x03" * 16


def sizes(result: dict[str, dict[bytes, set[int]]]) -> dict[str, int]:
    return {m: sum(len(ps) for ps in a.values()) for m, a in result.items()}


def all_partitions(result: dict[str, dict[bytes, set[int]]]) -> list[tuple[bytes, int]]:
    return sorted((t, p) for a in result.values() for t, ps in a.items() for p in ps)


# ---------------------------------------------------------------- assignors


def test_uniform_balances_and_covers_every_partition_once() -> None:
    members = {m: MemberSubscription(frozenset([T1, T2])) for m in "abc"}
    result = UniformAssignor().assign(members, {T1: 6, T2: 4})
    assert sorted(sizes(result).values()) == [3, 3, 4]
    assert all_partitions(result) == sorted([(T1, p) for p in range(6)] + [(T2, p) for p in range(4)])


def test_uniform_is_sticky_when_a_member_joins() -> None:
    before = UniformAssignor().assign({m: MemberSubscription(frozenset([T1])) for m in "ab"}, {T1: 6})
    members = {m: MemberSubscription(frozenset([T1]), before[m]) for m in "ab"}
    members["c"] = MemberSubscription(frozenset([T1]))
    after = UniformAssignor().assign(members, {T1: 6})
    assert sizes(after) == {"a": 2, "b": 2, "c": 2}
    # a and b only give up partitions, they never swap any
    for m in "ab":
        assert after[m][T1] <= before[m][T1]


def test_uniform_heterogeneous_subscriptions_only_get_subscribed_topics() -> None:
    members = {"a": MemberSubscription(frozenset([T1])), "b": MemberSubscription(frozenset([T1, T2])),
               "c": MemberSubscription(frozenset([T2]))}
    result = UniformAssignor().assign(members, {T1: 4, T2: 4})
    assert set(result["a"]) <= {T1} and set(result["c"]) <= {T2}
    assert sorted(sizes(result).values()) == [2, 3, 3]
    assert len(all_partitions(result)) == 8


def test_range_assigns_consecutive_ranges_per_topic() -> None:
    members = {m: MemberSubscription(frozenset([T1, T2])) for m in "ab"}
    result = RangeAssignor().assign(members, {T1: 5, T2: 2})
    assert result["a"] == {T1: {0, 1, 2}, T2: {0}}
    assert result["b"] == {T1: {3, 4}, T2: {1}}


def test_assignors_ignore_unknown_topics_and_no_members() -> None:
    assert UniformAssignor().assign({}, {T1: 3}) == {}
    result = UniformAssignor().assign({"a": MemberSubscription(frozenset([T3]))}, {T1: 3})
    assert result == {"a": {}}


# ---------------------------------------------------------------- CurrentAssignmentBuilder


def member(epoch: int, assigned: dict[bytes, set[int]], state: MemberState = MemberState.STABLE,
           pending: dict[bytes, set[int]] | None = None) -> ConsumerGroupMember:
    return ConsumerGroupMember("m", member_epoch=epoch, previous_member_epoch=epoch - 1, state=state,
                               assigned=assigned, pending_revocation=pending or {})


def test_reconciliation_revokes_first_then_assigns() -> None:
    m = member(1, {T1: {0, 1, 2}})
    step = (CurrentAssignmentBuilder(m).with_target(2, {T1: {0, 3}})
            .with_owner_lookup(lambda t, p: None).with_owned(None).build())
    # 1 and 2 must go first; 3 is not given yet and the epoch stays
    assert (step.state, step.member_epoch, step.assigned, step.pending_revocation) == (
        MemberState.UNREVOKED_PARTITIONS, 1, {T1: {0}}, {T1: {1, 2}})
    # still owning 1: no progress
    same = (CurrentAssignmentBuilder(step).with_target(2, {T1: {0, 3}})
            .with_owned({T1: {0, 1}}).build())
    assert same is step
    # revoked: moves to the target epoch and gets 3
    done = (CurrentAssignmentBuilder(step).with_target(2, {T1: {0, 3}})
            .with_owner_lookup(lambda t, p: None).with_owned({T1: {0}}).build())
    assert (done.state, done.member_epoch, done.assigned, done.pending_revocation) == (
        MemberState.STABLE, 2, {T1: {0, 3}}, {})


def test_reconciliation_waits_for_partitions_another_member_still_owns() -> None:
    m = member(1, {})
    owners = {(T1, 0): "other"}
    step = (CurrentAssignmentBuilder(m).with_target(2, {T1: {0, 1}})
            .with_owner_lookup(lambda t, p: owners.get((t, p))).with_owned({}).build())
    assert (step.state, step.member_epoch, step.assigned) == (MemberState.UNRELEASED_PARTITIONS, 2, {T1: {1}})
    owners.clear()
    step2 = (CurrentAssignmentBuilder(step).with_target(2, {T1: {0, 1}})
             .with_owner_lookup(lambda t, p: owners.get((t, p))).with_owned({T1: {1}}).build())
    assert (step2.state, step2.assigned) == (MemberState.STABLE, {T1: {0, 1}})


def test_reconciliation_stable_member_at_target_epoch_is_unchanged() -> None:
    m = member(3, {T1: {0}})
    assert CurrentAssignmentBuilder(m).with_target(3, {T1: {0}}).build() is m


# ---------------------------------------------------------------- the heartbeat state machine


@dataclass
class TopicRec:
    topic_id: bytes
    num_partitions: int


class ConsumerHost(FakeHost):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.topics: dict[str, TopicRec] = {"orders": TopicRec(T1, 4), "payments": TopicRec(T2, 2)}

    def consumer_group_topics(self) -> dict[str, TopicRec]:
        return self.topics

    def consumer_group_config(self, group_id: str) -> dict[str, str]:
        return {}

    def add_topic(self, name: str, tid: bytes, n: int) -> None:
        self.topics = {**self.topics, name: TopicRec(tid, n)}  # replaced, as the broker's metadata is


class CG:
    """Drives consumer_group_heartbeat as a client would."""

    def __init__(self, h: Harness) -> None:
        self.h = h

    def hb(self, member_id: str = "", epoch: int = 0, topics: list[str] | None = None,
           owned: dict[bytes, set[int]] | None = None, instance_id: str | None = None, rebalance_ms: int = 5000,
           group: str = "g", assignor: str | None = None, regex: str | None = None) -> ConsumerHeartbeatResult:
        if epoch == 0:
            owned = {} if owned is None else owned
            topics = topics if topics is not None or regex else ["orders"]
        return self.h.run(self.h.gc.consumer_group_heartbeat, ConsumerHeartbeat(
            group_id=group, member_id=member_id, member_epoch=epoch, instance_id=instance_id, rack_id=None,
            rebalance_timeout_ms=rebalance_ms if epoch == 0 else -1, subscribed_topic_names=topics,
            server_assignor=assignor, owned=owned, client_id="c", client_host="/127.0.0.1",
            subscribed_topic_regex=regex))


@pytest.fixture
def cg(tmp_path: Path) -> Iterator[CG]:
    host = ConsumerHost(tmp_path)
    h = Harness(host, consumer_session_timeout_ms=60000, consumer_heartbeat_interval_ms=100).start()
    yield CG(h)
    h.gc.stop()
    host.close()


def state_of(cg: CG, gid: str = "g") -> Any:
    return cg.h.on_loop(lambda: cg.h.gc.groups[gid].consumer)


def test_two_members_share_partitions_after_revocation(cg: CG) -> None:
    a = cg.hb()
    assert (a.error, a.member_epoch, a.assignment) == (ErrorCode.NONE, 1, {T1: {0, 1, 2, 3}})
    b = cg.hb()
    assert b.error == ErrorCode.NONE and b.member_epoch == 2
    assert b.assignment == {}  # a still owns everything
    a2 = cg.hb(a.member_id, 1, owned={T1: {0, 1, 2, 3}})
    assert a2.member_epoch == 1 and a2.assignment is not None and len(a2.assignment[T1]) == 2  # revoke two
    # b gets nothing until a acknowledges
    b2 = cg.hb(b.member_id, 2, owned={})
    assert b2.assignment is None or b2.assignment == {}
    a3 = cg.hb(a.member_id, 1, owned=a2.assignment)
    assert a3.member_epoch == 2
    b3 = cg.hb(b.member_id, 2, owned={})
    assert b3.assignment is not None and b3.assignment[T1] == {0, 1, 2, 3} - a2.assignment[T1]
    assert state_of(cg).state is ConsumerGroupState.STABLE


def test_error_codes_as_kafka(cg: CG) -> None:
    a = cg.hb()
    assert cg.hb("nobody", 1).error == ErrorCode.UNKNOWN_MEMBER_ID
    assert cg.hb(a.member_id, 5, owned={}).error == ErrorCode.FENCED_MEMBER_EPOCH
    bad = cg.hb("", 0, rebalance_ms=-1)
    assert bad.error == ErrorCode.INVALID_REQUEST and bad.message is not None and "RebalanceTimeoutMs" in bad.message
    assert cg.hb("x", 0, owned={T1: {0}}).error == ErrorCode.INVALID_REQUEST
    assert cg.hb("x", 7 - 10).error == ErrorCode.INVALID_REQUEST  # epoch -3
    assert cg.hb(assignor="sticky").error == ErrorCode.UNSUPPORTED_ASSIGNOR
    assert cg.hb(regex="(unclosed").error == ErrorCode.INVALID_REGULAR_EXPRESSION
    s = cg.hb(instance_id="i1")
    assert s.error == ErrorCode.NONE
    assert cg.hb(instance_id="i1").error == ErrorCode.UNRELEASED_INSTANCE_ID
    assert cg.hb("other", s.member_epoch, owned={}, instance_id="i1").error == ErrorCode.FENCED_INSTANCE_ID


def test_group_max_size(tmp_path: Path) -> None:
    host = ConsumerHost(tmp_path)
    h = Harness(host, consumer_max_size=1).start()
    try:
        c = CG(h)
        assert c.hb().error == ErrorCode.NONE
        assert c.hb().error == ErrorCode.GROUP_MAX_SIZE_REACHED
    finally:
        h.gc.stop()
        host.close()


def test_leave_gives_partitions_to_the_others(cg: CG) -> None:
    a = cg.hb()
    b = cg.hb()
    a2 = cg.hb(a.member_id, 1, owned={T1: {0, 1, 2, 3}})
    cg.hb(a.member_id, 1, owned=a2.assignment)
    left = cg.hb(a.member_id, -1)
    assert (left.error, left.member_epoch) == (ErrorCode.NONE, -1)
    b2 = cg.hb(b.member_id, 2, owned={})
    assert b2.member_epoch > 2 and b2.assignment == {T1: {0, 1, 2, 3}}
    assert cg.hb(a.member_id, 2, owned={}).error == ErrorCode.UNKNOWN_MEMBER_ID


def test_static_member_rejoins_with_its_assignment(cg: CG) -> None:
    s = cg.hb(instance_id="i1")
    assert cg.hb(s.member_id, -2, instance_id="i1").member_epoch == -2
    again = cg.hb("new-id", 0, instance_id="i1")
    assert again.error == ErrorCode.NONE and again.member_id != s.member_id
    assert again.assignment == {T1: {0, 1, 2, 3}} and again.member_epoch == s.member_epoch


def test_new_topic_matching_the_regex_bumps_the_group_epoch(cg: CG) -> None:
    a = cg.hb(topics=[], regex="ord.*")
    assert a.assignment == {T1: {0, 1, 2, 3}}
    cg.h.host.add_topic("ordersX", T3, 2)  # type: ignore[attr-defined]
    a2 = cg.hb(a.member_id, a.member_epoch, owned=a.assignment)
    assert a2.member_epoch == a.member_epoch + 1 and a2.assignment == {T1: {0, 1, 2, 3}, T3: {0, 1}}


def test_partitions_added_to_a_subscribed_topic(cg: CG) -> None:
    a = cg.hb()
    cg.h.host.add_topic("orders", T1, 6)  # type: ignore[attr-defined]
    a2 = cg.hb(a.member_id, a.member_epoch, owned=a.assignment)
    assert a2.assignment == {T1: set(range(6))}


def test_offset_commit_and_fetch_check_the_member_epoch(cg: CG) -> None:
    a = cg.hb()
    gc = cg.h.gc
    commit = cg.h.run
    from kbroker.coordinator.group_metadata import OffsetAndMetadata
    o = {("orders", 0): OffsetAndMetadata(5, -1, "", 0)}
    assert commit(gc.commit_offsets, "g", a.member_epoch, a.member_id, None, o) == {("orders", 0): ErrorCode.NONE}
    assert commit(gc.commit_offsets, "g", a.member_epoch + 1, a.member_id, None, o) == {
        ("orders", 0): ErrorCode.STALE_MEMBER_EPOCH}
    assert commit(gc.commit_offsets, "g", a.member_epoch, "nobody", None, o) == {
        ("orders", 0): ErrorCode.UNKNOWN_MEMBER_ID}
    assert commit(gc.commit_offsets, "g", a.member_epoch, a.member_id, None, o, 8) == {
        ("orders", 0): ErrorCode.UNSUPPORTED_VERSION}
    err, found = commit(gc.fetch_offsets, "g", [("orders", 0)], False, a.member_id, a.member_epoch)
    assert err == ErrorCode.NONE and found[("orders", 0)].offset == 5
    assert commit(gc.fetch_offsets, "g", None, False, a.member_id, 99)[0] == ErrorCode.STALE_MEMBER_EPOCH
    assert commit(gc.fetch_offsets, "g", None, False, "nobody", 1)[0] == ErrorCode.UNKNOWN_MEMBER_ID
    assert commit(gc.fetch_offsets, "g", None, False, None, -1)[0] == ErrorCode.NONE  # admin


def test_state_is_reloaded_from_the_log(tmp_path: Path) -> None:
    host = ConsumerHost(tmp_path)
    h = Harness(host, consumer_session_timeout_ms=60000).start()
    c = CG(h)
    a = c.hb()
    b = c.hb()
    a2 = c.hb(a.member_id, 1, owned={T1: {0, 1, 2, 3}})
    c.hb(a.member_id, 1, owned=a2.assignment)
    before = state_of(c)
    snapshot = (before.group_epoch, before.assignment_epoch, dict(before.target),
                {m: (x.member_epoch, x.state, x.assigned) for m, x in before.members.items()})
    h.gc.stop()
    host.close()
    host2 = ConsumerHost(tmp_path)
    h2 = Harness(host2, consumer_session_timeout_ms=60000).start(list(range(3)))
    try:
        c2 = CG(h2)
        import time
        deadline = time.time() + 5
        while h2.on_loop(lambda: bool(h2.gc.loading)) and time.time() < deadline:
            time.sleep(0.02)
        after = state_of(c2)
        assert (after.group_epoch, after.assignment_epoch, dict(after.target),
                {m: (x.member_epoch, x.state, x.assigned) for m, x in after.members.items()}) == snapshot
        # b continues where it was
        b2 = c2.hb(b.member_id, 2, owned={})
        assert b2.error == ErrorCode.NONE and b2.assignment == {T1: {0, 1, 2, 3} - a2.assignment[T1]}
    finally:
        h2.gc.stop()
        host2.close()

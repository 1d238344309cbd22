"""CurrentAssignmentBuilder: one step of a member's reconciliation towards its target assignment (KIP-848).

Kafka's rule, kept here: a member first gives up (revokes) what its target no longer holds, staying at its
epoch in UNREVOKED_PARTITIONS until its heartbeat no longer lists them as owned; only then does it move to the
target epoch and get new partitions, and only those no other member still owns (the rest wait, in
UNRELEASED_PARTITIONS, until their owner revokes them). Pure logic: the caller passes the partition owners.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from kbroker.coordinator.consumer_group import ConsumerGroupMember, MemberState
from kbroker.coordinator.consumer_group_records import Assignment


class CurrentAssignmentBuilder:
    def __init__(self, member: ConsumerGroupMember) -> None:
        self.member = member
        self.target_epoch = member.member_epoch
        self.target: Assignment = {}
        self.owned: Assignment | None = None  # None: the heartbeat did not say (unchanged since the last)
        self.owner_of: Callable[[bytes, int], str | None] = lambda t, p: None

    def with_target(self, epoch: int, target: Assignment) -> CurrentAssignmentBuilder:
        self.target_epoch, self.target = epoch, target
        return self

    def with_owner_lookup(self, fn: Callable[[bytes, int], str | None]) -> CurrentAssignmentBuilder:
        self.owner_of = fn
        return self

    def with_owned(self, owned: Assignment | None) -> CurrentAssignmentBuilder:
        self.owned = owned
        return self

    def build(self) -> ConsumerGroupMember:
        m = self.member
        if m.state is MemberState.STABLE:
            # A newer target epoch means a new target: start reconciling towards it.
            if m.member_epoch != self.target_epoch:
                return self._next(m.member_epoch, m.assigned)
            return m
        if m.state is MemberState.UNREVOKED_PARTITIONS:
            # No progress while the member still owns any partition it was asked to revoke.
            if self._owns_any(m.pending_revocation):
                return m
            return self._next(min(m.member_epoch + 1, self.target_epoch), m.assigned)
        if m.state is MemberState.UNRELEASED_PARTITIONS:
            # Partitions it waits for may have been released since: try again.
            return self._next(m.member_epoch, m.assigned)
        raise ValueError(f"member {m.member_id} is in state {m.state}")

    def _owns_any(self, revoking: Assignment) -> bool:
        """Kafka's ownsRevokedPartitions: without an owned list, assume it still owns them."""
        if self.owned is None:
            return True
        return any(self.owned.get(t, set()) & ps for t, ps in revoking.items())

    def _next(self, member_epoch: int, assigned_now: Assignment) -> ConsumerGroupMember:
        m = self.member
        unreleased = False
        keep: Assignment = {}
        revoke: Assignment = {}
        gain: Assignment = {}
        for t in set(self.target) | set(assigned_now):
            target = self.target.get(t, set())
            current = assigned_now.get(t, set())
            if current & target:
                keep[t] = current & target
            if current - target:
                revoke[t] = current - target
            free = set()
            for p in target - current:
                owner = self.owner_of(t, p)
                if owner is None or owner == m.member_id:
                    free.add(p)
                else:
                    unreleased = True
            if free:
                gain[t] = free
        if revoke and self._owns_any(revoke):
            # Revoke first: same epoch, keep only what stays, and wait for the client's acknowledgement.
            return replace(m, state=MemberState.UNREVOKED_PARTITIONS, member_epoch=member_epoch,
                           previous_member_epoch=m.member_epoch if member_epoch != m.member_epoch
                           else m.previous_member_epoch,
                           assigned=keep, pending_revocation=revoke)
        if gain:
            merged = {t: keep.get(t, set()) | gain.get(t, set()) for t in set(keep) | set(gain)}
            return self._at_target(unreleased, merged)
        return self._at_target(unreleased, keep)

    def _at_target(self, unreleased: bool, assigned: Assignment) -> ConsumerGroupMember:
        m = self.member
        return replace(m, state=MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE,
                       member_epoch=self.target_epoch,
                       previous_member_epoch=m.member_epoch if self.target_epoch != m.member_epoch
                       else m.previous_member_epoch,
                       assigned=assigned, pending_revocation={})

"""AclAuthorizer: Kafka's ACL semantics (kafka.security.authorizer.AclAuthorizer) over an AclStore.

Enabled by `authorizer.class.name`; without it the server has no authorizer and handlers skip every check.

Concurrency: processor threads call `authorize` without locks. They read one immutable `_Snapshot` (the ACLs,
a prefix index and a memo of decisions); every change builds a new snapshot and swaps the reference, so a
decision computed from old ACLs can only land in the old snapshot's memo, never in the current one. Changes
(CreateAcls/DeleteAcls here, notifications from other brokers via the store) are serialized by `_lock`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from kbroker.broker.security.acls import (
    IMPLIED_BY,
    SUPPORTED_OPERATIONS,
    WILDCARD_HOST,
    WILDCARD_PRINCIPAL,
    WILDCARD_RESOURCE,
    AccessControlEntry,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    Acls,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from kbroker.broker.security.acls_store import AclStore

log = logging.getLogger("kbroker.authorizer")

# Decisions remembered per snapshot; past this the memo starts over (a scan of many distinct resources).
MAX_MEMO = 100_000

_ALLOW, _DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
_ALL = AclOperation.ALL


@dataclass
class _Snapshot:
    acls: Acls
    # resource type -> names of its PREFIXED patterns
    prefixes: dict[ResourceType, frozenset[str]]
    # (principal, host, operation, resource type) -> resource name -> decision: one tuple per request, not one
    # per resource, on the path that checks every topic of a Metadata or Produce request.
    memo: dict[tuple[str, str, AclOperation, ResourceType], dict[str, bool]] = field(default_factory=dict)
    memo_size: int = 0

    def decisions(self, principal: str, host: str, op: AclOperation, rtype: ResourceType) -> dict[str, bool]:
        key = (principal, host, op, rtype)
        d = self.memo.get(key)
        if d is None:
            if self.memo_size >= MAX_MEMO:
                self.memo.clear()
                self.memo_size = 0
            d = self.memo[key] = {}
        return d

    @classmethod
    def of(cls, acls: Acls) -> _Snapshot:
        prefixes: dict[ResourceType, set[str]] = {}
        for p in acls:
            if p.pattern_type == PatternType.PREFIXED:
                prefixes.setdefault(p.resource_type, set()).add(p.name)
        return cls(acls, {t: frozenset(n) for t, n in prefixes.items()})


class AclAuthorizer:
    def __init__(self, store: AclStore, super_users: frozenset[str], allow_everyone_if_no_acl_found: bool) -> None:
        self.store = store
        self.super_users = super_users
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._lock = threading.Lock()
        self._snapshot = _Snapshot.of({})
        # Bumped after every snapshot swap (CreateAcls, DeleteAcls, a change from another broker): a cache of
        # decisions outside the snapshot (a connection's Writes, broker/security/write_allowed.py; remembered
        # Metadata answers, broker/metadata_answers.py) keyed by it is stale once it moves. Bumped after the swap,
        # so a reader that reads it first decides on a snapshot at least as new as the generation it files the
        # decision under.
        self.generation = 0

    def start(self) -> None:
        acls = self.store.start(self._on_store_change)
        with self._lock:
            self._snapshot = _Snapshot.of(acls)
            self.generation += 1
        log.info("ACL authorizer started: %d ACLs on %d resource patterns, super users %s, "
                 "allow.everyone.if.no.acl.found=%s", sum(len(v) for v in acls.values()), len(acls),
                 sorted(self.super_users) or "none", str(self.allow_everyone_if_no_acl_found).lower())

    def stop(self) -> None:
        self.store.stop()

    # ------------------------------------------------------------ decisions

    def authorize(self, principal: str, host: str, op: AclOperation, rtype: ResourceType, name: str) -> bool:
        if principal in self.super_users:
            return True
        snap = self._snapshot
        memo = snap.decisions(principal, host, op, rtype)
        decision = memo.get(name)
        if decision is None:
            decision = memo[name] = self._decide(snap, principal, host, op, rtype, name)
            snap.memo_size += 1
        return decision

    def authorized_names(self, principal: str, host: str, op: AclOperation, rtype: ResourceType,
                         names: Iterable[str]) -> set[str]:
        """The names op is allowed on: authorize() for many resources of one request, in one loop."""
        if principal in self.super_users:
            return set(names)
        snap = self._snapshot
        memo = snap.decisions(principal, host, op, rtype)
        out = set()
        for name in names:
            decision = memo.get(name)
            if decision is None:
                decision = memo[name] = self._decide(snap, principal, host, op, rtype, name)
                snap.memo_size += 1
            if decision:
                out.add(name)
        return out

    def _decide(self, snap: _Snapshot, principal: str, host: str, op: AclOperation, rtype: ResourceType,
                name: str) -> bool:
        entries = self._matching_entries(snap, rtype, name)
        if not entries:
            return self.allow_everyone_if_no_acl_found
        for e in entries:
            if (e.permission == _DENY and (e.operation == op or e.operation == _ALL)
                    and (e.principal == principal or e.principal == WILDCARD_PRINCIPAL)
                    and (e.host == host or e.host == WILDCARD_HOST)):
                return False
        allowed_by = IMPLIED_BY.get(op)
        for e in entries:
            if (e.permission == _ALLOW
                    and (e.operation == op or e.operation == _ALL or (allowed_by is not None and e.operation in allowed_by))
                    and (e.principal == principal or e.principal == WILDCARD_PRINCIPAL)
                    and (e.host == host or e.host == WILDCARD_HOST)):
                return True
        return False

    @staticmethod
    def _matching_entries(snap: _Snapshot, rtype: ResourceType, name: str) -> list[AccessControlEntry]:
        acls = snap.acls
        out: list[AccessControlEntry] = []
        found = acls.get(ResourcePattern(rtype, WILDCARD_RESOURCE, PatternType.LITERAL))
        if found:
            out.extend(found)
        found = acls.get(ResourcePattern(rtype, name, PatternType.LITERAL))
        if found:
            out.extend(found)
        prefixes = snap.prefixes.get(rtype)
        if prefixes:
            if len(prefixes) <= len(name):
                matched: Iterable[str] = (p for p in prefixes if name.startswith(p))
            else:
                matched = (name[:i] for i in range(1, len(name) + 1) if name[:i] in prefixes)
            for p in matched:
                out.extend(acls[ResourcePattern(rtype, p, PatternType.PREFIXED)])
        return out

    def authorized_operations(self, principal: str, host: str, rtype: ResourceType, name: str) -> int:
        """AuthHelper.authorizedOperations: the bit field of the operations allowed on the resource."""
        bits = 0
        for op in SUPPORTED_OPERATIONS[rtype]:
            if self.authorize(principal, host, op, rtype, name):
                bits |= 1 << int(op)
        return bits

    def authorize_by_resource_type(self, principal: str, host: str, op: AclOperation, rtype: ResourceType) -> bool:
        """AclAuthorizer.authorizeByResourceType: may the principal do op on at least one resource of the type?
        (InitProducerId without a transactional id: Write on any topic grants idempotent production.)"""
        if principal in self.super_users:
            return True
        deny_literals: set[str] = set()
        deny_prefixes: set[str] = set()
        allow_literals: set[str] = set()
        allow_prefixes: set[str] = set()
        for pattern, entries in self._snapshot.acls.items():
            if pattern.resource_type != rtype:
                continue
            for e in entries:
                if ((e.operation == op or e.operation == _ALL)
                        and (e.principal == principal or e.principal == WILDCARD_PRINCIPAL)
                        and (e.host == host or e.host == WILDCARD_HOST)):
                    literal = pattern.pattern_type == PatternType.LITERAL
                    if e.permission == _DENY:
                        (deny_literals if literal else deny_prefixes).add(pattern.name)
                    else:
                        (allow_literals if literal else allow_prefixes).add(pattern.name)
        if WILDCARD_RESOURCE in deny_literals:
            return False
        if self.allow_everyone_if_no_acl_found:
            return True
        if not deny_literals and not deny_prefixes:
            return bool(allow_literals or allow_prefixes)

        def dominated(n: str) -> bool:
            return any(n[:i] in deny_prefixes for i in range(len(n) + 1))

        return (any(not dominated(p) for p in allow_prefixes)
                or any(lit == WILDCARD_RESOURCE or (lit not in deny_literals and not dominated(lit))
                       for lit in allow_literals))

    # ------------------------------------------------------------ ACL management

    def acls(self, flt: AclBindingFilter) -> list[tuple[ResourcePattern, AccessControlEntry]]:
        out: list[tuple[ResourcePattern, AccessControlEntry]] = []
        for pattern, entries in self._snapshot.acls.items():
            if flt.matches_pattern(pattern):
                out.extend((pattern, e) for e in entries if flt.matches_entry(e))
        return out

    def create_acls(self, bindings: list[tuple[ResourcePattern, AccessControlEntry]]) -> dict[ResourcePattern, str | None]:
        """Add the bindings, one store update per resource pattern; pattern -> error text or None."""
        by_pattern: dict[ResourcePattern, set[AccessControlEntry]] = {}
        for pattern, entry in bindings:
            by_pattern.setdefault(pattern, set()).add(entry)
        results: dict[ResourcePattern, str | None] = {}
        with self._lock:
            for pattern, new in by_pattern.items():
                try:
                    entries = self.store.update(pattern, lambda cur, new=new: cur | new)  # type: ignore[misc]
                except Exception as e:  # noqa: BLE001 - one pattern's failure is its bindings' error
                    log.warning("Creating ACLs for %s failed: %s", pattern, e)
                    results[pattern] = str(e) or type(e).__name__
                    continue
                self._apply(pattern, entries)
                results[pattern] = None
                log.info("ACLs of %s are now %s", pattern, sorted(str(e) for e in entries))
        return results

    def delete_acls(self, filters: list[AclBindingFilter]
                    ) -> list[list[tuple[ResourcePattern, AccessControlEntry, str | None]]]:
        """Per filter, the bindings it deleted (each with an error text when its store update failed).
        A binding matched by several filters is reported once, for the first of them (as Kafka)."""
        results: list[list[tuple[ResourcePattern, AccessControlEntry, str | None]]] = [[] for _ in filters]
        with self._lock:
            current = self._snapshot.acls
            patterns = set(current)
            for f in filters:
                # Filters naming exactly one pattern reach patterns this broker has not cached yet (as Kafka).
                if f.name is not None and f.resource_type not in (ResourceType.ANY, ResourceType.UNKNOWN):
                    if f.pattern_type in (PatternType.LITERAL, PatternType.ANY):
                        patterns.add(ResourcePattern(f.resource_type, f.name, PatternType.LITERAL))
                    if f.pattern_type in (PatternType.PREFIXED, PatternType.ANY):
                        patterns.add(ResourcePattern(f.resource_type, f.name, PatternType.PREFIXED))
            for pattern in sorted(patterns, key=str):
                matching = [(i, f) for i, f in enumerate(filters) if f.matches_pattern(pattern)]
                if not matching:
                    continue
                removed: dict[AccessControlEntry, int] = {}

                def without(cur: frozenset[AccessControlEntry], matching: list[tuple[int, AclBindingFilter]] = matching,
                            removed: dict[AccessControlEntry, int] = removed) -> frozenset[AccessControlEntry]:
                    removed.clear()
                    for e in cur:
                        for i, f in matching:
                            if f.matches_entry(e):
                                removed[e] = i
                                break
                    return cur - removed.keys()

                error: str | None = None
                try:
                    entries = self.store.update(pattern, without)
                    self._apply(pattern, entries)
                except Exception as e:  # noqa: BLE001
                    log.warning("Deleting ACLs of %s failed: %s", pattern, e)
                    error = str(e) or type(e).__name__
                for entry, i in removed.items():
                    results[i].append((pattern, entry, error))
                if removed and error is None:
                    log.info("Deleted %d ACLs of %s", len(removed), pattern)
        return results

    # ------------------------------------------------------------ cache

    def _apply(self, pattern: ResourcePattern, entries: frozenset[AccessControlEntry]) -> None:
        acls = dict(self._snapshot.acls)
        if entries:
            acls[pattern] = entries
        else:
            acls.pop(pattern, None)
        self._snapshot = _Snapshot.of(acls)
        self.generation += 1

    def _on_store_change(self, pattern: ResourcePattern, entries: frozenset[AccessControlEntry]) -> None:
        """Another broker changed the ACLs of a pattern (called on the store's thread)."""
        with self._lock:
            if self._snapshot.acls.get(pattern, frozenset()) != entries:
                self._apply(pattern, entries)
                log.info("ACL change notification: %s now has %d ACLs", pattern, len(entries))

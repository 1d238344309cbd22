"""Where ACLs live: a JSON file beside the embedded metadata, or ZooKeeper with Kafka's ZK-mode layout.

ZooKeeper layout (kafka.zk.ZkData, byte-compatible with Kafka's AclAuthorizer so kafka-acls and Kafka
brokers read what kbroker writes and the other way round):
  /kafka-acl/<ResourceType>/<name>                      literal patterns
  /kafka-acl-extended/prefixed/<ResourceType>/<name>    prefixed patterns
  each holding {"version":1,"acls":[{"principal","permissionType","operation","host"}]}
  /kafka-acl-changes/acl_changes_<seq>                  "<RESOURCE_TYPE>:<name>" after a literal change
  /kafka-acl-extended-changes/acl_changes_<seq>         {"version":1,"resourceType","name","patternType"}
Every broker watches both change paths and re-reads the named pattern, so a change made on one broker
reaches the others as fast as ZooKeeper delivers a watch. Notifications older than 15 minutes are purged,
as Kafka's ZkNodeChangeNotificationListener does.

Updates are read-modify-write with the znode version (create when absent, delete when empty), retried on
a concurrent change: two brokers adding ACLs to one resource at once both keep theirs.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kbroker.broker.security.acls import (
    RESOURCE_TYPE_BY_NAME,
    RESOURCE_TYPE_NAMES,
    AccessControlEntry,
    Acls,
    PatternType,
    ResourcePattern,
    entries_from_json,
    entries_to_json,
)
from kbroker.storage.atomic_file import write_atomically

if TYPE_CHECKING:
    from kazoo.client import KazooClient

log = logging.getLogger("kbroker.acls")

Entries = frozenset[AccessControlEntry]
ChangeListener = Callable[[ResourcePattern, Entries], None]


class UnreadableAcls(ValueError):
    """A stored ACL document that is not Kafka's format."""


class AclStore(Protocol):
    def start(self, on_change: ChangeListener) -> Acls:
        """Load every ACL; on_change is called when another broker changes a pattern."""

    def stop(self) -> None: ...

    def update(self, pattern: ResourcePattern, change: Callable[[Entries], Entries]) -> Entries:
        """Apply change to the pattern's current entries, durably; returns the new entries."""


class LocalAclStore:
    """The embedded default: kbroker-acls.json in the first log dir, replaced atomically on every change."""

    FILE = "kbroker-acls.json"

    def __init__(self, log_dir: str) -> None:
        self.path = Path(log_dir) / self.FILE
        self._acls: Acls = {}
        self._lock = threading.Lock()

    def start(self, on_change: ChangeListener) -> Acls:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            try:
                doc = json.loads(self.path.read_text())
                for r in doc.get("resources", []):
                    pattern = ResourcePattern(RESOURCE_TYPE_BY_NAME[str(r["resourceType"]).lower()], str(r["name"]),
                                              PatternType[str(r["patternType"]).upper()])
                    self._acls[pattern] = entries_from_json(r)
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                # Starting with fewer ACLs than were granted could open what was closed: refuse to start.
                raise OSError(f"cannot read the ACLs in {self.path}: {type(e).__name__}: {e}") from None
        return dict(self._acls)

    def stop(self) -> None:
        pass

    def update(self, pattern: ResourcePattern, change: Callable[[Entries], Entries]) -> Entries:
        with self._lock:
            new = change(self._acls.get(pattern, frozenset()))
            acls = dict(self._acls)
            if new:
                acls[pattern] = new
            else:
                acls.pop(pattern, None)
            doc = {"version": 1, "resources": [
                {"resourceType": RESOURCE_TYPE_NAMES[p.resource_type], "patternType": p.pattern_type.name,
                 "name": p.name, **entries_to_json(e)}
                for p, e in sorted(acls.items(), key=lambda kv: str(kv[0]))
            ]}
            write_atomically(self.path, json.dumps(doc, indent=1).encode())
            self._acls = acls
            return new


# ---------------------------------------------------------------- ZooKeeper

LITERAL_ROOT = "/kafka-acl"
EXTENDED_ROOT = "/kafka-acl-extended"
LITERAL_CHANGES = "/kafka-acl-changes"
EXTENDED_CHANGES = "/kafka-acl-extended-changes"
CHANGE_PREFIX = "acl_changes_"
CHANGE_EXPIRATION_MS = 15 * 60 * 1000
MAX_UPDATE_RETRIES = 10


def pattern_root(pattern_type: PatternType) -> str:
    return LITERAL_ROOT if pattern_type == PatternType.LITERAL else f"{EXTENDED_ROOT}/{pattern_type.name.lower()}"


def acl_path(pattern: ResourcePattern) -> str:
    return f"{pattern_root(pattern.pattern_type)}/{RESOURCE_TYPE_NAMES[pattern.resource_type]}/{pattern.name}"


def change_notification(pattern: ResourcePattern) -> tuple[str, bytes]:
    """(sequential node path prefix, data) of the change notification for a pattern."""
    if pattern.pattern_type == PatternType.LITERAL:
        # LiteralAclChangeStore: the Java enum name of the type (ResourceType.toString), a colon, the name.
        return f"{LITERAL_CHANGES}/{CHANGE_PREFIX}", f"{pattern.resource_type.name}:{pattern.name}".encode()
    doc = {"version": 1, "resourceType": pattern.resource_type.name, "name": pattern.name,
           "patternType": pattern.pattern_type.name}
    return f"{EXTENDED_CHANGES}/{CHANGE_PREFIX}", json.dumps(doc, separators=(",", ":")).encode()


def parse_change_notification(root: str, data: bytes) -> ResourcePattern:
    text = data.decode()
    if root == LITERAL_CHANGES:
        rtype, sep, name = text.partition(":")
        if not sep:
            raise ValueError(f"expected a string in format ResourceType:ResourceName but got {text}")
        return ResourcePattern(RESOURCE_TYPE_BY_NAME[rtype.lower()], name, PatternType.LITERAL)
    doc = json.loads(text)
    return ResourcePattern(RESOURCE_TYPE_BY_NAME[str(doc["resourceType"]).lower()], str(doc["name"]),
                           PatternType[str(doc["patternType"]).upper()])


class ZkAclStore:
    """ACLs in the ZooKeeper of `zookeeper.connect`, through the metadata store's kazoo session."""

    def __init__(self, client: Callable[[], KazooClient]) -> None:
        self._client = client
        self._on_change: ChangeListener | None = None
        self._last_seen: dict[str, int] = {LITERAL_CHANGES: -1, EXTENDED_CHANGES: -1}
        self._notify_lock = threading.Lock()
        self._last_purge_ms: dict[str, int] = {}
        self._stopping = False

    def start(self, on_change: ChangeListener) -> Acls:
        from kazoo.recipe.watchers import ChildrenWatch

        zk = self._client()
        for root in (LITERAL_ROOT, pattern_root(PatternType.PREFIXED)):
            for type_name in RESOURCE_TYPE_NAMES.values():
                zk.ensure_path(f"{root}/{type_name}")
        for changes in (LITERAL_CHANGES, EXTENDED_CHANGES):
            zk.ensure_path(changes)
            # Notifications already there are covered by the full load below.
            seqs = [_seq(c) for c in zk.get_children(changes)]
            self._last_seen[changes] = max([s for s in seqs if s is not None], default=-1)
        acls = self._load_all(zk)
        self._on_change = on_change
        for changes in (LITERAL_CHANGES, EXTENDED_CHANGES):
            ChildrenWatch(zk, changes, self._watcher(changes))
        return acls

    def stop(self) -> None:
        self._stopping = True

    def _load_all(self, zk: KazooClient) -> Acls:
        from kazoo.exceptions import NoNodeError

        acls: Acls = {}
        for ptype in (PatternType.LITERAL, PatternType.PREFIXED):
            root = pattern_root(ptype)
            for type_name in zk.get_children(root):
                rtype = RESOURCE_TYPE_BY_NAME.get(type_name.lower())
                if rtype is None:
                    continue
                for name in zk.get_children(f"{root}/{type_name}"):
                    pattern = ResourcePattern(rtype, name, ptype)
                    try:
                        entries = self._read(zk, pattern)[0]
                    except NoNodeError:
                        continue
                    except UnreadableAcls as e:
                        raise OSError(f"cannot start the ACL authorizer: {e}") from None
                    if entries:
                        acls[pattern] = entries
        return acls

    def _read(self, zk: KazooClient, pattern: ResourcePattern) -> tuple[Entries, int]:
        """(entries, znode version); raises NoNodeError when the pattern has no znode."""
        data, stat = zk.get(acl_path(pattern))
        try:
            return entries_from_json(json.loads(data.decode()) if data else {}), stat.version
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            # Never read as "no ACLs": that could open what the znode was meant to close.
            raise UnreadableAcls(f"unreadable ACLs at {acl_path(pattern)}: {data!r} ({type(e).__name__})") from None

    def update(self, pattern: ResourcePattern, change: Callable[[Entries], Entries]) -> Entries:
        from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

        if "/" in pattern.name:
            # The name is a znode name under /kafka-acl/<Type>: a slash would make it a path (Kafka fails too).
            raise ValueError(f"ACLs of resource names containing '/' cannot be kept in ZooKeeper: {pattern.name!r}")
        zk = self._client()
        path = acl_path(pattern)
        for _ in range(MAX_UPDATE_RETRIES):
            try:
                current, version = self._read(zk, pattern)
            except NoNodeError:
                current, version = frozenset(), -1
            new = change(current)
            if new == current:
                return new
            data = json.dumps(entries_to_json(new), separators=(",", ":")).encode()
            try:
                if version < 0:
                    zk.create(path, data, makepath=True)
                elif new:
                    zk.set(path, data, version=version)
                else:
                    zk.delete(path, version=version)
            except (BadVersionError, NodeExistsError, NoNodeError):
                time.sleep(0.05)  # another broker changed it meanwhile: read again
                continue
            prefix, note = change_notification(pattern)
            zk.create(prefix, note, sequence=True, makepath=True)
            return new
        raise RuntimeError(f"Failed to update ACLs for {pattern} after {MAX_UPDATE_RETRIES} tries")

    # ------------------------------------------------------------ change notifications

    def _watcher(self, changes: str) -> Callable[[list[str]], bool | None]:
        def on_children(children: list[str]) -> bool | None:
            if self._stopping:
                return False
            try:
                self._process(changes, children)
            except Exception:  # noqa: BLE001 - a later notification or a restart reloads; never kill the watch
                log.error("Processing ACL change notifications under %s failed", changes, exc_info=True)
            return None

        return on_children

    def _process(self, changes: str, children: list[str]) -> None:
        from kazoo.exceptions import NoNodeError

        zk = self._client()
        with self._notify_lock:
            fresh = sorted((s, c) for c in children if (s := _seq(c)) is not None and s > self._last_seen[changes])
            now_ms = int(time.time() * 1000)
            for seq, child in fresh:
                try:
                    data, _ = zk.get(f"{changes}/{child}")
                except NoNodeError:
                    self._last_seen[changes] = seq
                    continue
                try:
                    pattern = parse_change_notification(changes, data)
                except (ValueError, KeyError, UnicodeDecodeError):
                    log.error("Ignoring unreadable ACL change notification %s/%s: %r", changes, child, data)
                    self._last_seen[changes] = seq
                    continue
                try:
                    entries = self._read(zk, pattern)[0]
                except NoNodeError:
                    entries = frozenset()
                except UnreadableAcls as e:
                    log.error("Keeping the ACLs known for %s: %s", pattern, e)
                    self._last_seen[changes] = seq
                    continue
                if self._on_change is not None:
                    self._on_change(pattern, entries)
                self._last_seen[changes] = seq
            if now_ms - self._last_purge_ms.get(changes, 0) > 60_000:
                self._last_purge_ms[changes] = now_ms
                self._purge_obsolete(zk, changes, children, now_ms)

    def _purge_obsolete(self, zk: KazooClient, changes: str, children: list[str], now_ms: int) -> None:
        """Kafka's purgeObsoleteNotifications: processed notifications older than 15 minutes go (at most once
        a minute here: a read per notification is housekeeping, not worth doing on every change)."""
        from kazoo.exceptions import NoNodeError

        for child in children:
            seq = _seq(child)
            if seq is None or seq > self._last_seen[changes]:
                continue
            try:
                _, stat = zk.get(f"{changes}/{child}")
            except NoNodeError:
                continue
            if now_ms - stat.ctime > CHANGE_EXPIRATION_MS:
                self._purge(zk, f"{changes}/{child}")

    @staticmethod
    def _purge(zk: KazooClient, path: str) -> None:
        from kazoo.exceptions import NoNodeError

        try:
            zk.delete(path)
        except NoNodeError:
            pass


def _seq(child: str) -> int | None:
    if not child.startswith(CHANGE_PREFIX):
        return None
    digits = child[len(CHANGE_PREFIX):]
    return int(digits) if digits.isdigit() else None


"""SCRAM credential stores: user -> mechanism -> salted credential (Kafka's CredentialCache).

Readers (the SCRAM exchange on a network thread) use `get` without a lock: the map is replaced whole on
every change (copy-on-write), so a reader sees one consistent version. Writers (AlterUserScramCredentials,
ZooKeeper watches) serialise on a lock.

- LocalScramStore: embedded mode, a JSON file beside the metadata file in the first log dir.
- ZkScramStore: ZooKeeper mode, exactly Kafka's layout: /config/users/<sanitized user> holds
  {"version":1,"config":{"SCRAM-SHA-256":"salt=...,stored_key=...,server_key=...,iterations=4096"}}, each
  change announced in /config/changes, and every broker watches /config/users so a credential altered
  through any broker (or with kafka-configs) is used by all.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from kbroker.broker.security.scram import MECHANISMS, ScramCredential
from kbroker.storage.atomic_file import write_atomically

if TYPE_CHECKING:
    from kbroker.coordinator.zk_store import ZkMetadataStore

log = logging.getLogger("kbroker.security")

CONFIG_USERS = "/config/users"
# user -> mechanism -> new credential, or None to delete it
CredentialChanges = dict[str, dict[str, "ScramCredential | None"]]


def sanitize(name: str) -> str:
    """Kafka's Sanitizer.sanitize: URL-encoding as Java's URLEncoder, with * and space percent-encoded."""
    out = []
    for ch in name:
        if ch.isascii() and (ch.isalnum() or ch in ".-_"):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode())
    return "".join(out)


def desanitize(name: str) -> str:
    return unquote(name)


class ScramCredentialStore:
    def __init__(self) -> None:
        self.credentials: dict[str, dict[str, ScramCredential]] = {}
        self._lock = threading.Lock()

    def get(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.credentials.get(user, {}).get(mechanism)

    def start(self) -> None:
        """Load what is stored (called once the metadata store is up)."""

    def stop(self) -> None:
        pass

    def alter(self, changes: CredentialChanges) -> None:
        raise NotImplementedError

    @staticmethod
    def _apply(current: dict[str, dict[str, ScramCredential]], changes: CredentialChanges
               ) -> dict[str, dict[str, ScramCredential]]:
        out = dict(current)
        for user, mechs in changes.items():
            entry = dict(out.get(user, {}))
            for mech, cred in mechs.items():
                if cred is None:
                    entry.pop(mech, None)
                else:
                    entry[mech] = cred
            if entry:
                out[user] = entry
            else:
                out.pop(user, None)
        return out


class LocalScramStore(ScramCredentialStore):
    FILE = "kbroker-scram-credentials.json"

    def __init__(self, log_dir: str) -> None:
        super().__init__()
        self.path = Path(log_dir) / self.FILE

    def start(self) -> None:
        if not self.path.exists():
            return
        data = json.loads(self.path.read_text())
        self.credentials = {
            user: {m: ScramCredential.from_text(text) for m, text in mechs.items() if m in MECHANISMS}
            for user, mechs in data.get("users", {}).items()
        }

    def alter(self, changes: CredentialChanges) -> None:
        with self._lock:
            updated = self._apply(self.credentials, changes)
            doc = {"version": 1, "users": {u: {m: c.to_text() for m, c in ms.items()} for u, ms in updated.items()}}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, json.dumps(doc, indent=1).encode())
            self.credentials = updated


class ZkScramStore(ScramCredentialStore):
    def __init__(self, metadata: ZkMetadataStore) -> None:
        super().__init__()
        self.metadata = metadata
        self._watched: set[str] = set()

    def start(self) -> None:
        from kazoo.recipe.watchers import ChildrenWatch

        client = self.metadata._zk()
        client.ensure_path(CONFIG_USERS)
        ChildrenWatch(client, CONFIG_USERS, self._on_children)

    def _on_children(self, children: list[str]) -> None:
        from kazoo.recipe.watchers import DataWatch

        client = self.metadata.client
        if client is None:
            return
        for child in children:
            if child not in self._watched:
                self._watched.add(child)
                DataWatch(client, f"{CONFIG_USERS}/{child}", self._watcher(child))

    def _watcher(self, child: str) -> Callable[[bytes | None, Any], bool | None]:
        user = desanitize(child)

        def changed(data: bytes | None, stat: Any) -> bool | None:
            with self._lock:
                if data is None:
                    self._watched.discard(child)
                    self.credentials = self._apply(self.credentials, {user: dict.fromkeys(MECHANISMS)})
                    return False
                try:
                    config = json.loads(data).get("config") or {}
                    mechs: dict[str, ScramCredential | None] = {
                        m: ScramCredential.from_text(config[m]) if m in config else None for m in MECHANISMS
                    }
                except (ValueError, AttributeError, TypeError):
                    log.error("Unreadable SCRAM credentials in %s/%s", CONFIG_USERS, child)
                    return None
                self.credentials = self._apply(self.credentials, {user: mechs})
            return None

        return changed

    def alter(self, changes: CredentialChanges) -> None:
        from kazoo.exceptions import NoNodeError

        client = self.metadata._zk()
        with self._lock:
            for user, mechs in changes.items():
                path = f"{CONFIG_USERS}/{sanitize(user)}"
                try:
                    data, _ = client.get(path)
                    config = dict(json.loads(data).get("config") or {})
                    exists = True
                except NoNodeError:
                    config, exists = {}, False
                for mech, cred in mechs.items():
                    if cred is None:
                        config.pop(mech, None)
                    else:
                        config[mech] = cred.to_text()
                doc = json.dumps({"version": 1, "config": config}).encode()
                if exists:
                    client.set(path, doc)
                else:
                    client.create(path, doc, makepath=True)
                self.metadata._notify_config_change(f"users/{sanitize(user)}")
            # The watch would get there too; readers on this broker must see the change as soon as it is acked.
            self.credentials = self._apply(self.credentials, changes)

"""Group configs (config resource type GROUP) in ZooKeeper: /config/groups/<group id>, in the format of the other
entity configs ({"version":1,"config":{...}}), mirrored into memory by watches so that whichever broker
coordinates a group sees its overrides.

Kafka 3.9 keeps group configs only in KRaft metadata (its ZooKeeper mode refuses resource type GROUP), while
kbroker serves KIP-848 groups in ZooKeeper mode too; the path follows Kafka's entity naming (ConfigType.GROUP is
"groups"). No /config/changes notification is written: Kafka brokers sharing the ensemble know no such entity.

Threading: kazoo's threads update `configs` by replacing the dict; readers on any thread take it without a lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from kazoo.client import KazooClient
from kazoo.recipe.watchers import ChildrenWatch, DataWatch
from kbroker.coordinator import zk_paths as zp
from kbroker.coordinator.metadata_store import with_group_configs

log = logging.getLogger("kbroker.metadata")


class ZkGroupConfigs:
    def __init__(self) -> None:
        self.configs: dict[str, dict[str, str]] = {}
        self._watched: set[str] = set()
        self._lock = threading.Lock()
        self._client: KazooClient | None = None

    def start(self, client: KazooClient) -> None:
        self._client = client
        client.ensure_path(zp.CONFIG_GROUPS)
        ChildrenWatch(client, zp.CONFIG_GROUPS, self._on_children)

    def _on_children(self, children: list[str]) -> None:
        client = self._client
        if client is None:
            return
        for child in children:
            group_id = unquote(child)
            with self._lock:
                new = group_id not in self._watched
                self._watched.add(group_id)
            if new:
                DataWatch(client, zp.group_config_path(group_id), self._watcher(group_id))

    def _watcher(self, group_id: str) -> Callable[[bytes | None, Any], bool | None]:
        def changed(data: bytes | None, stat: Any) -> bool | None:
            if data is None:
                with self._lock:
                    self._watched.discard(group_id)
                    self.configs = with_group_configs(self.configs, group_id, {})
                return False
            try:
                configs = zp.parse_config(data)
            except ValueError:
                log.error("Unreadable group config %s: %r", zp.group_config_path(group_id), data)
                return None
            with self._lock:
                self.configs = with_group_configs(self.configs, group_id, configs)
            return None

        return changed

    def put(self, group_id: str, configs: dict[str, str]) -> None:
        """This broker wrote them: visible at once, before the watch fires."""
        with self._lock:
            self.configs = with_group_configs(self.configs, group_id, configs)

"""The ZooKeeper launcher for tests: bench.peers.zookeeper's, with ports from the tests' own allocator."""

from __future__ import annotations

from pathlib import Path

from bench.peers.zookeeper import TICK_MS, four_letter, zookeeper_missing
from bench.peers.zookeeper import ZooKeeperServer as _ZooKeeperServer
from tests.broker_process import free_port

__all__ = ["TICK_MS", "ZooKeeperServer", "four_letter", "zookeeper_missing"]


class ZooKeeperServer(_ZooKeeperServer):
    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        super().__init__(data_dir, port or free_port())

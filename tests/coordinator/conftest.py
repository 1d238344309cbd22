"""A real ZooKeeper server per test module (skipped when the Debian `zookeeper` package is missing)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from tests.zookeeper import ZooKeeperServer, zookeeper_missing


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    reason = zookeeper_missing()
    if reason is not None:
        pytest.skip(reason)
    zk = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper")).start()
    yield zk
    zk.stop()


@pytest.fixture(scope="module")
def zk_client(zookeeper: ZooKeeperServer) -> Iterator[KazooClient]:
    c = KazooClient(zookeeper.connect, timeout=10)
    c.start(10)
    yield c
    c.stop()
    c.close()

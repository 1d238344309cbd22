"""ZkProducerIdBlockAllocator against a real ZooKeeper: Kafka's /latest_producer_id_block protocol."""

from __future__ import annotations

import threading

import pytest
from kazoo.client import KazooClient
from kbroker.coordinator.producer_ids import MAX_PRODUCER_ID, ProducerIdManager, ProducerIdsExhausted
from kbroker.coordinator.zk_paths import loads
from kbroker.coordinator.zk_producer_ids import ZkProducerIdBlockAllocator

from tests.zookeeper import ZooKeeperServer


@pytest.fixture
def path(zk_client: KazooClient, request: pytest.FixtureRequest) -> str:
    return f"/pid-tests/{request.node.name}"


def test_blocks_follow_each_other_and_are_stored_as_kafka_does(zk_client: KazooClient, path: str) -> None:
    alloc = ZkProducerIdBlockAllocator(zk_client, 3, path=path)
    assert alloc.next_block() == (0, 999)
    assert alloc.next_block() == (1000, 1999)
    doc = loads(zk_client.get(path)[0])
    assert doc == {"version": 1, "broker": 3, "block_start": "1000", "block_end": "1999"}
    # another broker continues after the latest block, whoever claimed it
    assert ZkProducerIdBlockAllocator(zk_client, 4, path=path).next_block() == (2000, 2999)


def test_empty_znode_means_no_block_yet(zk_client: KazooClient, path: str) -> None:
    zk_client.create(path, b"", makepath=True)  # as a broker's top-level path setup leaves it
    assert ZkProducerIdBlockAllocator(zk_client, 1, path=path).next_block() == (0, 999)


def test_concurrent_brokers_never_share_a_block(zookeeper: ZooKeeperServer, path: str) -> None:
    clients = [KazooClient(zookeeper.connect, timeout=10) for _ in range(4)]
    for c in clients:
        c.start(10)
    blocks: list[tuple[int, int]] = []
    lock = threading.Lock()

    def claim(c: KazooClient, broker_id: int) -> None:
        alloc = ZkProducerIdBlockAllocator(c, broker_id, path=path)
        for _ in range(15):
            b = alloc.next_block()
            with lock:
                blocks.append(b)

    try:
        threads = [threading.Thread(target=claim, args=(c, i)) for i, c in enumerate(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        for c in clients:
            c.stop()
            c.close()
    assert sorted(blocks) == [(i * 1000, i * 1000 + 999) for i in range(60)]


def test_exhausted_ids_raise(zk_client: KazooClient, path: str) -> None:
    last_end = MAX_PRODUCER_ID - 500
    zk_client.create(path, b'{"version":1,"broker":1,"block_start":"%d","block_end":"%d"}'
                     % (last_end - 999, last_end), makepath=True)
    with pytest.raises(ProducerIdsExhausted):
        ZkProducerIdBlockAllocator(zk_client, 1, path=path).next_block()


def test_producer_id_manager_with_zookeeper_blocks(zk_client: KazooClient, path: str) -> None:
    a = ProducerIdManager(ZkProducerIdBlockAllocator(zk_client, 1, path=path))
    b = ProducerIdManager(ZkProducerIdBlockAllocator(lambda: zk_client, 2, path=path))
    ids = [a.generate() for _ in range(1500)] + [b.generate() for _ in range(10)]
    assert len(set(ids)) == len(ids)
    assert ids[:2] == [0, 1] and ids[1500] == 2000  # b's block follows a's two blocks

"""Producer id blocks claimed in ZooKeeper, as Kafka's ZK-mode ProducerIdManager does.

/latest_producer_id_block holds {"version":1,"broker":<id>,"block_start":"<n>","block_end":"<m>"}, the
last block any broker claimed. The next block is claimed with a write conditional on the znode version,
so two brokers never get the same ids; a lost race (BadVersionError, NodeExistsError) reads again.
Same interface as coordinator.producer_ids.LocalBlockSource.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kbroker.coordinator.producer_ids import block_json, next_block_after
from kbroker.coordinator.zk_paths import LATEST_PRODUCER_ID_BLOCK

log = logging.getLogger("kbroker.producer_ids")


class ZkProducerIdBlockAllocator:
    def __init__(self, zk_client: KazooClient | Callable[[], KazooClient], broker_id: int,
                 path: str = LATEST_PRODUCER_ID_BLOCK, max_attempts: int = 100) -> None:
        """zk_client: a started client, or a function returning one (for a store connecting later)."""
        self._client = zk_client
        self.broker_id = broker_id
        self.path = path
        self.max_attempts = max_attempts

    @property
    def client(self) -> KazooClient:
        return self._client if isinstance(self._client, KazooClient) else self._client()

    def next_block(self) -> tuple[int, int]:
        """Claim the next block of 1000 ids: (first id, last id), both inclusive.

        Raises ProducerIdsExhausted when the block would pass 2**63-1, or RuntimeError after
        max_attempts lost races.
        """
        client = self.client
        for _ in range(self.max_attempts):
            try:
                data, stat = client.get(self.path)
            except NoNodeError:
                data, stat = None, None
            # An empty znode (as created by a broker's top-level path setup) means no block yet.
            start, end = next_block_after(data or None, self.broker_id)
            doc = block_json(self.broker_id, start, end)
            try:
                if stat is None:
                    client.create(self.path, doc, makepath=True)
                else:
                    client.set(self.path, doc, version=stat.version)
            except (BadVersionError, NodeExistsError):
                log.debug("Lost the race for producer id block [%d, %d]; reading again", start, end)
                continue
            return start, end
        raise RuntimeError(f"could not claim a producer id block in {self.path} after {self.max_attempts} attempts")

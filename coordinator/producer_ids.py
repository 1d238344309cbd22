"""ProducerIdManager: hands out producer ids from blocks of 1000, never reusing an id.

The block source decides durability: the embedded default keeps the latest block in a local
file that is fsynced before any id of the block is handed out; with ZooKeeper the block is
claimed by a conditional write of /latest_producer_id_block.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Protocol

from kbroker.storage.atomic_file import write_atomically

log = logging.getLogger("kbroker.producer_ids")

BLOCK_SIZE = 1000
MAX_PRODUCER_ID = 2**63 - 1
# Kafka's ProducerIdManager.PidPrefetchThreshold: claim the next block once this share of the current one is used.
PREFETCH_THRESHOLD = 0.90


class ProducerIdsExhausted(RuntimeError):
    pass


class BlockSource(Protocol):
    def next_block(self) -> tuple[int, int]:
        """Claim the next block; returns (first id, last id), both inclusive."""
        ...


def block_json(broker_id: int, start: int, end: int) -> bytes:
    return json.dumps(
        {"version": 1, "broker": broker_id, "block_start": str(start), "block_end": str(end)}
    ).encode()


def next_block_after(latest: bytes | None, broker_id: int) -> tuple[int, int]:
    """The block that follows the stored latest block (Kafka's ProducerIdBlock JSON), or the first one."""
    start = 0
    if latest:
        data = json.loads(latest)
        start = int(data["block_end"]) + 1
    end = start + BLOCK_SIZE - 1
    if end > MAX_PRODUCER_ID or start < 0:
        raise ProducerIdsExhausted("producer ids exhausted: no block of 1000 ids is left below 2^63-1")
    return start, end


class LocalBlockSource:
    """Embedded mode: /latest_producer_id_block kept as a file in the first log dir."""

    FILE = "latest_producer_id_block"

    def __init__(self, log_dir: str, broker_id: int) -> None:
        self.path = Path(log_dir) / self.FILE
        self.broker_id = broker_id

    def next_block(self) -> tuple[int, int]:
        latest = self.path.read_bytes() if self.path.exists() else None
        start, end = next_block_after(latest, self.broker_id)
        write_atomically(self.path, block_json(self.broker_id, start, end))
        return start, end


class ProducerIdManager:
    """Hands out ids from the current block and claims the next block before this one runs out.

    As Kafka's producer id manager: the first block is claimed at startup, and once 90% of the current
    block is handed out the next one is claimed in the background, so idempotent producers keep starting
    while the block source (ZooKeeper) is briefly unreachable. Only a used-up block with no next one in
    hand makes generate() claim synchronously, which fails while the source is down (a retriable error
    for the client).
    """

    def __init__(self, source: BlockSource, *, prefetch_threshold: float = PREFETCH_THRESHOLD,
                 claim_timeout_s: float = 30.0) -> None:
        self.source = source
        self.prefetch_threshold = prefetch_threshold
        self.claim_timeout_s = claim_timeout_s
        self._lock = threading.Lock()
        self._next = 0
        self._end = -1  # inclusive end of the current block; -1: no block yet
        self._prefetch_at = 0  # the id whose handing out starts claiming the next block
        self._prefetch: Future[tuple[int, int]] | None = None  # the next block, claimed or being claimed
        self._prefetch_failed_at = -1e9

    def start(self) -> None:
        """Claim the first block now, while the source is known to be reachable."""
        with self._lock:
            if self._next > self._end:
                self._install(self._claim())

    def generate(self) -> int:
        """A fresh producer id (blocking only when no block is in hand: may claim one from disk or ZooKeeper)."""
        with self._lock:
            if self._next > self._end:
                self._install(self._take_next_block())
            pid = self._next
            self._next += 1
            if pid >= self._prefetch_at:
                self._maybe_prefetch()
            return pid

    def _claim(self) -> tuple[int, int]:
        start, end = self.source.next_block()
        log.info("Claimed producer id block [%d, %d]", start, end)
        return start, end

    def _install(self, block: tuple[int, int]) -> None:
        start, end = block
        self._next, self._end = start, end
        self._prefetch_at = start + int((end - start + 1) * self.prefetch_threshold)

    def _take_next_block(self) -> tuple[int, int]:
        fut, self._prefetch = self._prefetch, None
        if fut is not None:
            try:
                # The claim thread never takes self._lock, so waiting here under it cannot deadlock.
                return fut.result(timeout=self.claim_timeout_s)
            except Exception as e:  # noqa: BLE001
                log.warning("Claiming the next producer id block in the background failed: %s; trying again now", e)
        return self._claim()

    def _maybe_prefetch(self) -> None:
        fut = self._prefetch
        if fut is not None:
            if not fut.done() or fut.exception() is None:
                return
            # The last background claim failed (source unreachable): retry at most once a second.
            if time.monotonic() - self._prefetch_failed_at < 1.0:
                return
            self._prefetch_failed_at = time.monotonic()
        fut = Future()
        self._prefetch = fut
        threading.Thread(target=self._claim_into, args=(fut,), name="producer-id-prefetch", daemon=True).start()

    def _claim_into(self, fut: Future[tuple[int, int]]) -> None:
        try:
            fut.set_result(self._claim())
        except BaseException as e:  # noqa: BLE001
            log.warning("Could not claim the next producer id block in advance: %s", e)
            fut.set_exception(e)

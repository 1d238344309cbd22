"""The direct path's DelayedProduce over a real leader Partition and its log: answered when the ISR has the batch
(woken from another thread), at its timeout, and, a loop iteration later, when the leadership moved away."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kbroker.broker.delayed_produce import DelayedProduce
from kbroker.broker.partition import Partition
from kbroker.broker.purgatory import FetchPurgatory
from kbroker.coordinator.metadata_store import PartitionState
from kbroker.protocol.errors import ErrorCode
from kbroker.storage.config import LogConfig
from kbroker.storage.log import Log

from tests.storage.storage_helpers import NOW, batch

TP = ("t", 0)


@pytest.fixture
def lg(tmp_path: Path) -> Iterator[Log]:
    log = Log.open(tmp_path / "t-0", "t", 0, LogConfig(), clean_shutdown=True, high_watermark=0)
    yield log
    log.close()


class Host:
    """What a DelayedProduce reads of its ReplicaManager: the partitions, the produce purgatory, the minimum ISR."""

    def __init__(self, p: Partition) -> None:
        self.partitions = {TP: p}
        self.produce_purgatory = FetchPurgatory()

    def min_insync_replicas(self, topic: str) -> int:
        return 2


def append(lg: Log) -> int:
    lg.append_as_leader(batch(3), NOW, leader_epoch=1)
    return lg.log_end_offset


def test_a_delayed_produce_answers_when_replicated_at_its_timeout_and_after_a_leader_change(lg: Log) -> None:
    p = Partition("t", 0, 1, lg)
    p.make_leader(
        PartitionState(leader=1, leader_epoch=1, isr=[1, 2], replicas=[1, 2], partition_epoch=1), NOW
    )
    host = Host(p)

    async def scenario() -> tuple[Any, ...]:
        end = append(lg)
        replicated = DelayedProduce(host, [("t", 0, end)], dict)  # type: ignore[arg-type]
        assert not replicated.start(10_000)
        assert p.update_follower_fetch_state(2, end, end, NOW)[0]  # the high watermark moved...
        # ... on another network thread, whose notify queues the check on the request's loop
        threading.Thread(target=host.produce_purgatory.notify, args=(TP,)).start()
        got = await asyncio.wait_for(replicated.future, 5)

        timing_out = DelayedProduce(host, [("t", 0, append(lg))], dict)  # type: ignore[arg-type]
        assert not timing_out.start(20)
        timed_out = await asyncio.wait_for(timing_out.future, 5)

        moving = DelayedProduce(host, [("t", 0, append(lg))], dict)  # type: ignore[arg-type]
        assert not moving.start(10_000)
        p.make_follower(
            PartitionState(leader=2, leader_epoch=2, isr=[1, 2], replicas=[1, 2], partition_epoch=2)
        )
        host.produce_purgatory.notify(TP)  # on this loop: checked at once, answered in the next iteration
        answered_inside_notify = moving.future.done()
        moved = await asyncio.wait_for(moving.future, 5)
        return got, timed_out, answered_inside_notify, moved

    got, timed_out, answered_inside_notify, moved = asyncio.run(scenario())
    assert got == {TP: ErrorCode.NONE}
    assert timed_out == {TP: ErrorCode.REQUEST_TIMED_OUT}
    assert not answered_inside_notify and moved == {TP: ErrorCode.NOT_LEADER_OR_FOLLOWER}
    assert host.produce_purgatory._watchers == {}, "a completed request left a watch behind"

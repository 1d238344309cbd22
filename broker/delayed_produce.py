"""DelayedProduce for the direct Produce path: an acks=all answer completed where the high watermark moves.

ReplicaManager.wait_for_replication (the reference, used by the general path, the coordinators and the marker
writer) parks a coroutine per request: a waiter with its own future, a watch and an unwatch under the purgatory's
lock per wake-up, three coroutine frames and then the message objects and the generated encoder for the answer. At
10,000 acks=all requests a second that machinery was a tenth of the leader's CPU. Here the purgatory wakes the
request itself (Kafka's DelayedProduce.tryComplete): the check runs on the request's own loop, and once every
partition has its answer the frame is encoded and handed to the connection through one plain future.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kbroker.broker.purgatory import ANY
from kbroker.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from kbroker.broker.replica_manager import ReplicaManager

# (topic, partition, the offset the high watermark must reach)
Pending = tuple[str, int, int]


class DelayedProduce:
    """One acks=all request's wait. `finish(codes)` builds the answer from each waited partition's code (NONE,
    or why it failed: REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND, NOT_LEADER_OR_FOLLOWER); its result, or
    its exception, completes `future`."""

    __slots__ = (
        "rm",
        "loop",
        "thread_id",
        "future",
        "keys",
        "wants",
        "waiting",
        "codes",
        "finish",
        "timer",
        "done",
        "scheduled",
    )

    def __init__(
        self, rm: ReplicaManager, pending: list[Pending], finish: Callable[[dict[Any, ErrorCode]], Any]
    ) -> None:
        self.rm = rm
        self.loop = asyncio.get_running_loop()
        self.thread_id = threading.get_ident()
        self.future: asyncio.Future[Any] = self.loop.create_future()
        self.waiting = pending
        self.keys = [(t, p) for t, p, _ in pending]
        self.wants = ANY
        self.codes: dict[Any, ErrorCode] = {}
        self.finish = finish
        self.timer: asyncio.TimerHandle | None = None
        self.done = False
        self.scheduled = False  # a check from another thread is queued on the loop

    def start(self, timeout_ms: int) -> bool:
        """Watch, then check (an advance between the append and the watch is not missed); True if the answer is
        already in `future`."""
        self.rm.produce_purgatory.add(self)
        if not self.try_complete():
            self.timer = self.loop.call_later(max(timeout_ms, 0) / 1000, self.expire)
        return self.future.done()

    def wake(self) -> None:
        """The purgatory's notify (it has dropped this waiter from the partition that moved). On the request's own
        loop the check runs at once: it reads offsets and the ISR without locks, so the answer leaves in the next
        iteration, as the awaiting task's did. From another network thread it is queued there, one check for the
        wake-ups before it runs."""
        if self.done:
            return
        if threading.get_ident() == self.thread_id:
            self.try_complete()
        elif not self.scheduled:
            self.scheduled = True
            self.loop.call_soon_threadsafe(self._queued_check)

    def _queued_check(self) -> None:
        self.scheduled = False
        self.try_complete()

    def try_complete(self) -> bool:
        if self.done:
            return True
        rm = self.rm
        partitions = rm.partitions
        still = []
        for t, p, required in self.waiting:
            part = partitions.get((t, p))
            status = (
                ErrorCode.NONE
                if part is None
                else part.replication_status(required, rm.min_insync_replicas(t))
            )
            if status is None:
                still.append((t, p, required))
            else:
                self.codes[(t, p)] = status
        if still:
            if len(still) != len(self.waiting):
                self.waiting = still
            # Watched again before the next change can pass unseen (notify dropped this waiter from the
            # partition that moved); a duplicate entry for a partition still watched is the same set member.
            rm.produce_purgatory.add(self, [(t, p) for t, p, _ in still])
            return False
        self._complete()
        return True

    def expire(self) -> None:
        if self.done:
            return
        self.timer = None
        if not self.try_complete():
            for t, p, _ in self.waiting:
                self.codes[(t, p)] = ErrorCode.REQUEST_TIMED_OUT
            self.waiting = []
            self._complete()

    def _complete(self) -> None:
        self.done = True
        self.rm.produce_purgatory.unwatch(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if ErrorCode.NOT_LEADER_OR_FOLLOWER in self.codes.values():
            # The answer names the new leaders (KIP-951) from the metadata: built in the next iteration, outside
            # whatever the notifier holds (a leadership change notifies under the replica manager's lock).
            self.loop.call_soon(self._answer)
        else:
            self._answer()

    def _answer(self) -> None:
        fut = self.future
        if fut.done():
            return
        try:
            fut.set_result(self.finish(self.codes))
        except Exception as e:  # noqa: BLE001 - the connection closes, as when a handler's coroutine raises
            fut.set_exception(e)

"""Fetch purgatory: long-poll fetches wait here until an append to a watched partition wakes them.

Appends and fetches may run on different processor threads, so a waiter is woken on its own
event loop: directly when the append runs on that loop's thread, else via call_soon_threadsafe.

A waiter says what it waits for: a follower's fetch for the log end (new data to copy), a consumer's for the high
watermark (data it may read). With replication a leader's append moves only the log end and a follower's fetch only
the high watermark, so each wakes just the fetches it can answer (each needless wake-up re-read the partitions and
went back to sleep, two per produced batch on a leader with two followers).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from typing import Any

from kbroker.storage.manager import TopicPartition

# What moved (notify) and what a waiter waits for (watch); a bit mask.
LOG_END = 1
HIGH_WATERMARK = 2
ANY = LOG_END | HIGH_WATERMARK  # also: leadership, markers, deletions - anything that may change an answer


class FetchWaiter:
    """The future resolves to None when a watched partition changed, to True when the wait's timer expired it."""

    __slots__ = ("loop", "future", "thread_id", "keys", "wants")

    def __init__(self, loop: asyncio.AbstractEventLoop, keys: list[TopicPartition], wants: int) -> None:
        self.loop = loop
        self.future: asyncio.Future[bool | None] = loop.create_future()
        self.thread_id = threading.get_ident()
        self.keys = keys
        self.wants = wants

    def wake(self) -> None:
        if threading.get_ident() == self.thread_id:
            _resolve(self.future)
        else:
            self.loop.call_soon_threadsafe(_resolve, self.future)


def _resolve(fut: asyncio.Future[bool | None]) -> None:
    if not fut.done():
        fut.set_result(None)


def expire(fut: asyncio.Future[bool | None]) -> None:
    """A wait's timer (loop.call_later): its waiter's future says True. uvloop's timers count whole milliseconds
    and may fire up to one early, so a waiter that went by the clock alone would wait again for what is left."""
    if not fut.done():
        fut.set_result(True)


class FetchPurgatory:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watchers: dict[TopicPartition, set[Any]] = {}
        # Moves on every notify: a fetch that read before watching re-reads only if something was notified since
        # (an unlocked += may lose a concurrent increment, but the value still moves, which is all that is asked).
        self.generation = 0
        # The same, counting only the notifies a log-end waiter (a follower's fetch) or a high-watermark waiter (a
        # consumer's) may care about: on a leader each follower fetch that moves the high watermark notifies, and
        # with one counter the follower fetch that moved it found the counter moved by its own read and read its
        # partitions a second time before parking (one read in five per acks=all round with two followers).
        self.log_end_generation = 0
        self.hw_generation = 0
        # Set when the broker shuts down: long polls answer with what they have instead of waiting out max_wait_ms,
        # so the processors close their connections at once and clients move to the new leaders.
        self.closing = False

    def watch(self, keys: Iterable[TopicPartition], wants: int = ANY) -> FetchWaiter:
        waiter = FetchWaiter(asyncio.get_running_loop(), list(keys), wants)
        with self._lock:
            for key in waiter.keys:
                self._watchers.setdefault(key, set()).add(waiter)
        return waiter

    def add(self, waiter: Any, keys: Iterable[TopicPartition] | None = None) -> None:
        """Watch with a waiter of the caller's own (its wake(), keys and wants, as FetchWaiter's), on `keys` or
        all of its keys: broker/delayed_produce.py's requests, woken without a future."""
        watchers = self._watchers
        with self._lock:
            for key in waiter.keys if keys is None else keys:
                ws = watchers.get(key)
                if ws is None:
                    watchers[key] = {waiter}  # no empty set made for every key already watched
                else:
                    ws.add(waiter)

    def unwatch(self, waiter: Any) -> None:
        with self._lock:
            for key in waiter.keys:
                ws = self._watchers.get(key)
                if ws is not None:
                    ws.discard(waiter)
                    if not ws:
                        del self._watchers[key]

    def size(self) -> tuple[int, int]:
        """(watch entries, distinct waiters): Kafka's PurgatorySize and NumDelayedOperations of the Fetch purgatory,
        here also counting an idle Fetch's plan, watched across its connection's requests (broker/idle_fetch.py)."""
        with self._lock:
            sets = list(self._watchers.values())
            return sum(map(len, sets)), len(set().union(*sets))

    def notify(self, key: TopicPartition, moved: int = ANY) -> None:
        self.generation += 1
        if moved & LOG_END:
            self.log_end_generation += 1
        if moved & HIGH_WATERMARK:
            self.hw_generation += 1
        if key not in self._watchers:  # unlocked peek: appends with no waiter pay nothing more
            return
        with self._lock:
            waiters = self._watchers.pop(key, None)
            if waiters and moved != ANY:
                rest = {w for w in waiters if not w.wants & moved}
                if rest:
                    self._watchers[key] = rest
                    waiters -= rest
        for w in waiters or ():
            w.wake()

    def close(self) -> None:
        """Shutdown: every waiter is woken now, and no wait starts again (see closing)."""
        self.closing = True
        self.notify_all()

    def notify_all(self) -> None:
        self.generation += 1
        self.log_end_generation += 1
        self.hw_generation += 1
        with self._lock:
            waiters = {w for ws in self._watchers.values() for w in ws}
            self._watchers.clear()
        for w in waiters:
            w.wake()

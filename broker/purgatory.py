"""Fetch purgatory: long-poll fetches wait here until an append to a watched partition wakes them.

Appends and fetches may run on different processor threads, so a waiter is woken on its own
event loop: directly when the append runs on that loop's thread, else via call_soon_threadsafe.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable

from storage.manager import TopicPartition


class FetchWaiter:
    __slots__ = ("loop", "future", "thread_id", "keys")

    def __init__(self, loop: asyncio.AbstractEventLoop, keys: list[TopicPartition]) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.thread_id = threading.get_ident()
        self.keys = keys

    def wake(self) -> None:
        if threading.get_ident() == self.thread_id:
            _resolve(self.future)
        else:
            self.loop.call_soon_threadsafe(_resolve, self.future)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class FetchPurgatory:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watchers: dict[TopicPartition, set[FetchWaiter]] = {}
        # Moves on every notify: a fetch that read before watching re-reads only if something was notified since
        # (an unlocked += may lose a concurrent increment, but the value still moves, which is all that is asked).
        self.generation = 0

    def watch(self, keys: Iterable[TopicPartition]) -> FetchWaiter:
        waiter = FetchWaiter(asyncio.get_running_loop(), list(keys))
        with self._lock:
            for key in waiter.keys:
                self._watchers.setdefault(key, set()).add(waiter)
        return waiter

    def unwatch(self, waiter: FetchWaiter) -> None:
        with self._lock:
            for key in waiter.keys:
                ws = self._watchers.get(key)
                if ws is not None:
                    ws.discard(waiter)
                    if not ws:
                        del self._watchers[key]

    def notify(self, key: TopicPartition) -> None:
        self.generation += 1
        if key not in self._watchers:  # unlocked peek: appends with no waiter pay nothing more
            return
        with self._lock:
            waiters = self._watchers.pop(key, None)
        for w in waiters or ():
            w.wake()

    def notify_all(self) -> None:
        self.generation += 1
        with self._lock:
            waiters = {w for ws in self._watchers.values() for w in ws}
            self._watchers.clear()
        for w in waiters:
            w.wake()

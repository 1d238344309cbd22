"""CoordinatorLoop: the one event loop a coordinator keeps all its state on.

In the broker it is the first network processor's loop, borrowed: the requests that processor serves reach the
coordinator without a thread hop, and the coordinator's log writes do not trade the GIL with that processor.
Standalone (tests, tools) the coordinator runs a loop of its own on a thread of its own. Either way every touch of
coordinator state happens on that loop, so the state machines need no locks; `call()` is the way in from anywhere.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


class CoordinatorLoop:
    loop: asyncio.AbstractEventLoop

    def _init_loop(self, loop: asyncio.AbstractEventLoop | None, thread_name: str) -> None:
        self._owns_loop = loop is None
        self.loop = uvloop.new_event_loop() if loop is None else loop
        self._thread = threading.Thread(target=self._run_own_loop, name=thread_name, daemon=True)
        self._started = threading.Event()
        self._calls: set[asyncio.Task[Any]] = set()

    def _run_own_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        self.loop.run_forever()

    def _start_own_loop(self) -> None:
        """Start the coordinator's own loop thread; a borrowed loop already runs."""
        if self._owns_loop:
            self._thread.start()
            self._started.wait()

    def _join_own_loop(self) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def call(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> Awaitable[T]:
        """Run a coordinator coroutine on the coordinator loop as a task of its own (a caller that goes away does
        not stop it half-way); awaitable from any loop."""
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is self.loop:
            task = self.loop.create_task(fn(*args))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)
            return task
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(fn(*args), self.loop))

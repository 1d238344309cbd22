"""Kafka's DelayedFetch: a Fetch parked in the fetch purgatory, answered by callbacks (no task) via a network.Parked."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from kbroker.broker import metrics
from kbroker.broker.network import Parked, Response
from kbroker.protocol import codec

if TYPE_CHECKING:
    import asyncio

    from kbroker.broker.apis import RequestContext
    from kbroker.broker.purgatory import FetchPurgatory

FETCH = 1  # the api key the answers are counted under


class DelayedFetch(Parked):
    """One parked Fetch (Kafka's DelayedFetch in its DelayedOperationPurgatory).

    A Fetch that cannot be answered yet (less than min_bytes to return, time left of max_wait_ms) waits for a notify
    on a partition it reads, or for its deadline. Three kinds wait: handle_fetch's long poll (handlers/fetch.py
    `_LongPoll`), a follower's incremental Fetch (follower_fetch.py `_FollowerPoll`: a `_LongPoll` with its own
    encoder) and a consumer's idle Fetch answered from its connection's plan (idle_fetch.py `_ParkedFetch`). This
    class is what they share: the purgatory watch, the one timer, a wake-up handled on the fetch's own event loop
    (`try_complete`), the deadline (`on_expiration`), the answer encoded and counted (RequestMetrics,
    FailedFetchRequestsPerSec, a request quota's throttle) and handed to the connection, and the release when the
    connection closes first (`close`: out of the purgatory and the timer cancelled at once). A kind answers a wake-up
    or the deadline with a Response, a FetchResponse body, None (parked again), or another DelayedFetch that answers
    for this one (an idle Fetch woken with time left goes on in handle_fetch's long poll).

    The connection awaits it as any Parked answer: with nothing owed before it, without a task at all. A kind sets
    the fields it uses (an idle Fetch is watched through its plan, not by itself: no purgatory, keys, wants or thread
    of its own)."""

    __slots__ = (
        "ctx",
        "started",
        "throttle",
        "loop",
        "deadline",
        "timer",
        "waiting",
        "outer",
        "inner",
        # The purgatory this fetch watches itself in (FetchPurgatory.add(self), unwatched here), or None; then the
        # waiter's fields (keys, wants, wake).
        "purgatory",
        "keys",
        "wants",
        "thread_id",
        "wake_pending",
    )

    def __init__(
        self, ctx: RequestContext | None, started: float, loop: asyncio.AbstractEventLoop, deadline: float
    ) -> None:
        # Parked's fields, set here rather than through its __init__ (a call less per request).
        self.conn = None
        self.answer = None
        self.done = False
        self._future = None
        self.ctx = ctx  # its header encodes a body; None until an undecoded idle Fetch is decoded
        self.started = started
        self.throttle = 0  # a request quota's throttle time (KafkaApis._finish), set on the body it answers
        self.loop = loop
        self.deadline = deadline  # time.monotonic()
        self.timer: asyncio.TimerHandle | None = None
        self.waiting = False
        self.outer: DelayedFetch | None = None  # the fetch this one answers for
        self.inner: DelayedFetch | None = None  # the fetch answering for this one
        self.purgatory: FetchPurgatory | None = None

    # ------------------------------------------------------------ what a kind supplies

    def try_complete(self) -> Any:
        """Woken (no longer watched, the timer cancelled): the answer, or None after parking again (park())."""
        raise NotImplementedError

    def on_expiration(self) -> Any:
        """The deadline (no longer watched): the answer."""
        raise NotImplementedError

    # ------------------------------------------------------------ the wait

    def park(self, left: float) -> None:
        """Wait (watched already) until a wake-up or `left` seconds from now. loop.call_later rather than call_at:
        uvloop's loop.time() is its cached millisecond clock, not time.monotonic()'s."""
        self.waiting = True
        self.timer = self.loop.call_later(left, self._expired)

    def wake(self) -> None:
        """The purgatory's notify (from any thread): handled on this fetch's loop in its next iteration, as a
        waiter's future would be; further notifies before then are the same wake-up."""
        if self.wake_pending:
            return
        self.wake_pending = True
        if threading.get_ident() == self.thread_id:
            self.loop.call_soon(self.woken)
        else:
            self.loop.call_soon_threadsafe(self.woken)

    def woken(self) -> None:
        """A notify on a watched partition, on this loop."""
        self.wake_pending = False
        if not self.waiting:
            return  # answered, expired or closed meanwhile, or already woken by another of its partitions
        self._stop()
        try:
            answer = self.try_complete()
        except Exception as e:  # noqa: BLE001 - the connection closes, as when a handler's coroutine raises
            self._complete(e)
            return
        if answer is not None:
            self.finish(answer)

    def _expired(self) -> None:
        if not self.waiting:
            return
        self.waiting = False
        self.timer = None
        purgatory = self.purgatory
        if purgatory is not None:
            purgatory.unwatch(self)
        try:
            answer = self.on_expiration()
        except Exception as e:  # noqa: BLE001
            self._complete(e)
            return
        if type(answer) is Response and self.outer is None:
            # The usual answer at the deadline (an idle Fetch's, from its plan) without finish()'s steps: the idle
            # path's CPU per Fetch is what this module must not add to (bench.fetch_inprocess).
            metrics.shard().request_done(FETCH, time.perf_counter() - self.started)
            self.complete(answer)
        elif answer is not None:
            self.finish(answer)

    def _stop(self) -> None:
        self.waiting = False
        timer = self.timer
        if timer is not None:
            timer.cancel()
            self.timer = None
        purgatory = self.purgatory
        if purgatory is not None:
            purgatory.unwatch(self)

    def close(self) -> None:
        """The connection closed before the answer: out of the purgatory and the timer cancelled now, not at the
        deadline; counted once (RequestMetrics), as an answer the connection drops."""
        if self.done:
            return
        inner = self.inner
        if inner is not None:
            inner.close()  # it completes this one
            return
        if self.waiting:
            self._stop()
        metrics.shard().request_done(FETCH, time.perf_counter() - self.started)
        self._complete(ConnectionResetError("connection closed"))

    # ------------------------------------------------------------ the answer

    def finish(self, answer: Any) -> None:
        """Count and send `answer`: a Response (counted already where it was made), a body (encoded here, its failed
        partitions counted, as KafkaApis does), or another DelayedFetch, which answers for this one."""
        if isinstance(answer, DelayedFetch):
            answer.outer = self
            answer.started = self.started
            answer.throttle = self.throttle
            self.inner = answer
            return
        shard = metrics.shard()
        if type(answer) is not Response:
            body = answer
            assert self.ctx is not None
            header = self.ctx.header
            try:
                if self.throttle and hasattr(body, "throttle_time_ms"):
                    body.throttle_time_ms = max(body.throttle_time_ms or 0, self.throttle)
                ext: list[tuple[int, Any]] = []
                frame = codec.encode_response(
                    header.correlation_id, header.request_api_key, header.request_api_version, body, ext
                )
            except Exception as e:  # noqa: BLE001
                self._complete(e)
                return
            answer = Response(frame, ext or None)
            shard.answered(FETCH, body)
        shard.request_done(FETCH, time.perf_counter() - self.started)
        self._complete(answer)

    def _complete(self, answer: Response | BaseException) -> None:
        outer = self.outer
        if outer is None:
            self.complete(answer)
        else:
            self.done = True
            outer.complete(answer)

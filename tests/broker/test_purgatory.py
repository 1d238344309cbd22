"""The fetch purgatory's waiters: what woke a wait (a watched partition or the wait's timer) and what it wakes."""

from __future__ import annotations

import asyncio

from kbroker.broker.purgatory import HIGH_WATERMARK, LOG_END, FetchPurgatory, expire


def test_a_waiter_says_whether_its_timer_or_a_partition_woke_it() -> None:
    async def scenario() -> tuple[object, object, bool, object]:
        purgatory = FetchPurgatory()
        loop = asyncio.get_running_loop()
        timed = purgatory.watch([("t", 0)], HIGH_WATERMARK)
        loop.call_later(0.01, expire, timed.future)
        by_timer = await timed.future
        purgatory.unwatch(timed)
        woken = purgatory.watch([("t", 0)], HIGH_WATERMARK)
        purgatory.notify(("t", 0), LOG_END)  # a follower's kind of news: this consumer's wait goes on
        still_waiting = not woken.future.done()
        purgatory.notify(("t", 0), HIGH_WATERMARK)
        expire(woken.future)  # a timer firing after the wake-up changes nothing
        return by_timer, await woken.future, still_waiting, purgatory.generation

    by_timer, by_partition, still_waiting, generation = asyncio.run(scenario())
    assert by_timer is True and by_partition is None and still_waiting and generation == 2

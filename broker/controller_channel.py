"""ControllerChannelManager: the controller's queue of requests to each broker (Kafka's ControllerChannelManager
with one RequestSendThread per broker), on the inter-broker channel's loop.

Requests to one broker go one at a time, in the order the controller made them, and are retried until
they are answered or the controller drops the broker (it died, or this broker stopped being the
controller): a LeaderAndIsr must never overtake an older one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from kbroker.broker.inter_broker import CONTROLLER, InterBrokerChannel
from kbroker.protocol.errors import KafkaError

log = logging.getLogger("kbroker.controller")

RETRY_BACKOFF_S = 0.1
# Responses whose top-level error the controller logs (LeaderAndIsr, StopReplica, UpdateMetadata).
_NAMES = {4: "LeaderAndIsr", 5: "StopReplica", 6: "UpdateMetadata"}


# A queue item that is no request: a barrier, resolved when every request queued before it has been answered.
_BARRIER = -1


class ControllerChannelManager:
    def __init__(self, channel: InterBrokerChannel) -> None:
        self.channel = channel
        self._queues: dict[int, asyncio.Queue[tuple[int, int, Any]]] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        # (broker id, api key, response) of every answered request: the controller reads LeaderAndIsr answers
        # (Kafka's sendEvent(LeaderAndIsrResponseReceived))
        self.on_response: Callable[[int, int, Any], None] | None = None

    async def sent(self, timeout: float) -> None:
        """Wait (from any loop) until every request queued so far to every broker has been answered, or timeout
        seconds."""

        async def barriers() -> None:
            loop = asyncio.get_running_loop()
            waits: list[asyncio.Future[None]] = []
            for q in self._queues.values():
                waits.append(loop.create_future())
                q.put_nowait((_BARRIER, 0, waits[-1]))
            if waits:
                await asyncio.wait(waits, timeout=timeout)

        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(barriers(), self.channel.loop))

    def send(self, broker_id: int, api_key: int, version: int, body: Any) -> None:
        """Queue a request to a broker (thread-safe, never blocks)."""
        self.channel.loop.call_soon_threadsafe(self._enqueue, broker_id, api_key, version, body)

    def remove_broker(self, broker_id: int) -> None:
        """Drop a broker's queue: it is gone, or this broker is no longer the controller."""
        self.channel.loop.call_soon_threadsafe(self._remove, broker_id)

    def stop(self) -> None:
        """Cancel every queue's task (before the inter-broker loop stops) so none is left pending."""
        loop = self.channel.loop
        if not loop.is_running():
            return

        async def cancel_all() -> None:
            tasks = list(self._tasks.values())
            self._tasks.clear()
            self._queues.clear()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(timeout=5)
        except Exception:  # noqa: BLE001
            log.warning("Stopping the controller's request queues failed", exc_info=True)

    def _enqueue(self, broker_id: int, api_key: int, version: int, body: Any) -> None:
        q = self._queues.get(broker_id)
        if q is None:
            q = self._queues[broker_id] = asyncio.Queue()
            self._tasks[broker_id] = self.channel.loop.create_task(self._run(broker_id, q))
        q.put_nowait((api_key, version, body))

    def _remove(self, broker_id: int) -> None:
        self._queues.pop(broker_id, None)
        task = self._tasks.pop(broker_id, None)
        if task is not None:
            task.cancel()

    async def _run(self, broker_id: int, q: asyncio.Queue[tuple[int, int, Any]]) -> None:
        while True:
            api_key, version, body = await q.get()
            if api_key == _BARRIER:  # everything queued before it is answered
                if not body.done():
                    body.set_result(None)
                continue
            failures = 0
            while True:
                try:
                    resp = await self.channel.client.request(broker_id, api_key, version, body, CONTROLLER)
                    break
                except (ConnectionError, KafkaError, OSError) as e:
                    failures += 1
                    if failures == 1 or failures % 50 == 0:
                        log.warning("%s to broker %d failed (%s); retrying", _NAMES.get(api_key, api_key), broker_id, e)
                    await asyncio.sleep(RETRY_BACKOFF_S)
            code = getattr(resp, "error_code", 0)
            if code:
                log.warning("Broker %d answered %s with error %d", broker_id, _NAMES.get(api_key, api_key), code)
            if self.on_response is not None:
                try:
                    self.on_response(broker_id, api_key, resp)
                except Exception:  # noqa: BLE001 - the queue must go on
                    log.exception("Handling the answer of broker %d to %s failed", broker_id,
                                  _NAMES.get(api_key, api_key))

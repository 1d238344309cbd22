"""Copies future logs to their new log dir and swaps them in (Kafka's ReplicaAlterLogDirsManager and thread)."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

from kbroker.storage.errors import KafkaStorageError
from kbroker.storage.manager import FUTURE_COPY_BYTES

if TYPE_CHECKING:
    from kbroker.storage.manager import LogManager, TopicPartition

logger = logging.getLogger("kbroker.storage")

# Swap once the future log is this close behind: the rest is copied with the current log's appends waiting.
SWAP_LAG_BYTES = 256 * 1024
_IDLE_WAIT_S = 0.2


class ReplicaAlterLogDirsManager:
    """One thread for every move: a move copies the current log's batches into its future log while the current
    one goes on serving produce and fetch, then LogManager.replace_current_with_future swaps them.

    state_lock (the replica manager's) is held for the swap, so no role change runs halfway through one."""

    def __init__(
        self,
        log_manager: LogManager,
        state_lock: AbstractContextManager[object] | None = None,
        *,
        max_bytes_per_second: int | None = None,
    ) -> None:
        """max_bytes_per_second: replica.alter.log.dirs.io.max.bytes.per.second, the copying's throttle."""
        self.log_manager = log_manager
        self.max_bytes_per_second = max_bytes_per_second
        self._throttle_start = time.monotonic()
        self._throttle_bytes = 0
        self._state_lock = state_lock if state_lock is not None else nullcontext()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kbroker-alter-log-dirs", daemon=True)
            self._thread.start()

    def wake(self) -> None:
        """A move was added."""
        self._wake.set()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            busy = False
            for tp in self.log_manager.future_logs():
                if self._stop.is_set():
                    return
                try:
                    busy = self.do_work(tp) or busy
                except Exception as e:  # noqa: BLE001 - one move's failure must not stop the others
                    self._failed(tp, e)
            if not busy:
                self._wake.wait(_IDLE_WAIT_S)
                self._wake.clear()

    def do_work(self, tp: TopicPartition) -> bool:
        """Copy a step of tp's log, or swap when the future is close behind; True when something was copied."""
        lm = self.log_manager
        future = lm.future_logs().get(tp)
        if future is None:
            return False
        try:
            current = lm.get_log(*tp)
        except KafkaStorageError:
            current = None
        if current is None:
            lm.abandon_future_log(tp)
            return False
        behind = current.size - future.size if future.log_start_offset == current.log_start_offset else None
        if (behind is None or behind > SWAP_LAG_BYTES) and future.log_end_offset < current.log_end_offset:
            copied = lm.copy_to_future(tp, future, self._chunk_bytes())
            self._throttle(copied)
            return copied > 0
        with self._state_lock:
            lm.replace_current_with_future(tp)
        return True

    def _chunk_bytes(self) -> int:
        rate = self.max_bytes_per_second
        return FUTURE_COPY_BYTES if rate is None else max(1, min(FUTURE_COPY_BYTES, rate // 10))

    def _throttle(self, copied: int) -> None:
        """Keep the copying at or below the configured rate over a one-second window."""
        rate = self.max_bytes_per_second
        if rate is None or copied <= 0:
            return
        now = time.monotonic()
        if now - self._throttle_start > 1.0:
            self._throttle_start, self._throttle_bytes = now, 0
        self._throttle_bytes += copied
        ahead = self._throttle_bytes / rate - (now - self._throttle_start)
        if ahead > 0:
            self._stop.wait(ahead)

    def _failed(self, tp: TopicPartition, e: Exception) -> None:
        # A failed log dir was taken offline where the error happened (with the move); anything else drops the move.
        logger.error("Moving %s-%d to another log dir failed; the log stays where it is: %s", tp[0], tp[1], e)
        self.log_manager.abandon_future_log(tp)

"""Log flush times (Kafka's LogFlushStats.logFlushTimer), for the broker's metrics exporter to read.

Recorded once per fsync, on the thread that flushed: a lock costs nothing next to the fsync it measures."""

from __future__ import annotations

import bisect
import threading

# Upper bounds in milliseconds of the histogram buckets (the last bucket is +Inf).
BUCKETS_MS: tuple[float, ...] = (0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)


class FlushStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.sum_ms = 0.0
        self.buckets = [0] * (len(BUCKETS_MS) + 1)

    def record(self, elapsed_ms: float) -> None:
        with self._lock:
            self.count += 1
            self.sum_ms += elapsed_ms
            self.buckets[bisect.bisect_left(BUCKETS_MS, elapsed_ms)] += 1

    def snapshot(self) -> tuple[int, float, list[int]]:
        with self._lock:
            return self.count, self.sum_ms, list(self.buckets)


FLUSH_STATS = FlushStats()

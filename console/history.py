"""The console's recent past: throughput per topic from the broker's own metric counters, and consumer-group lag,
sampled every few seconds over the last minutes, for the charts."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from kbroker.broker.metrics import topic_totals

log = logging.getLogger("kbroker.console")

SAMPLE_SECONDS = 5.0
KEEP_SECONDS = 15 * 60


class History:
    def __init__(self, lag_source: Callable[[], dict[str, int]] | None = None,
                 interval: float = SAMPLE_SECONDS, keep: float = KEEP_SECONDS) -> None:
        self.interval = interval
        size = max(2, int(keep / interval) + 1)
        self._lag_source = lag_source
        self._throughput: deque[tuple[float, dict[str, tuple[int, int, int]]]] = deque(maxlen=size)
        self._lag: dict[str, deque[tuple[float, int]]] = {}
        self._size = size
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        # The first sample waits an interval: start() runs while the broker is still starting up, and the lag
        # sampler asks the broker over the network.
        self._thread = threading.Thread(target=self._run, name="kbroker-console-history", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        now = time.time()
        msgs, bytes_in, bytes_out = topic_totals()
        totals = {t: (msgs.get(t, 0), bytes_in.get(t, 0), bytes_out.get(t, 0))
                  for t in set(msgs) | set(bytes_in) | set(bytes_out)}
        with self._lock:
            self._throughput.append((now, totals))
        if self._lag_source is not None:
            try:
                lags = self._lag_source()
            except Exception:  # noqa: BLE001  the broker is stopping, or refused the sampler: no lag sample this time
                log.debug("console lag sample failed", exc_info=True)
                return
            for group, lag in lags.items():
                self.record_lag(group, lag, now)

    def record_lag(self, group: str, lag: int, at: float | None = None) -> None:
        with self._lock:
            series = self._lag.get(group)
            if series is None:
                series = self._lag[group] = deque(maxlen=self._size)
            series.append((time.time() if at is None else at, lag))

    def throughput(self) -> dict[str, Any]:
        """Per-topic rates between consecutive samples: records/s in, bytes/s in, bytes/s out."""
        with self._lock:
            samples = list(self._throughput)
        series: dict[str, list[dict[str, float]]] = {}
        for (t0, a), (t1, b) in zip(samples, samples[1:], strict=False):
            dt = t1 - t0
            if dt <= 0:
                continue
            for topic, (m1, bi1, bo1) in b.items():
                m0, bi0, bo0 = a.get(topic, (0, 0, 0))
                series.setdefault(topic, []).append({
                    "at": round(t1 * 1000), "records_in": (m1 - m0) / dt, "bytes_in": (bi1 - bi0) / dt,
                    "bytes_out": (bo1 - bo0) / dt})
        return {"interval_s": self.interval, "topics": series}

    def lag(self, group: str) -> list[dict[str, int]]:
        with self._lock:
            return [{"at": round(at * 1000), "lag": lag} for at, lag in self._lag.get(group, ())]

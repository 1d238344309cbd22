"""Client quotas per client id, as Kafka's ClientQuotaManager: byte rates (producer_byte_rate, consumer_byte_rate)
and the request-time quota (request_percentage, Kafka's ClientRequestQuotaManager).

Quotas come from the metadata store (AlterClientQuotas): an entry for the client id, else the
default entity. The rate is measured over quota.window.num samples of quota.window.size.seconds;
a client over its quota is told throttle_time_ms and its connection is muted that long.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
SUPPORTED_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)
KNOWN_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE, CONTROLLER_MUTATION_RATE)

QuotaSource = Callable[[], Mapping[str | None, Mapping[str, float]]]


class _Rate:
    """Bytes per second over a sliding set of fixed windows."""

    __slots__ = ("samples",)

    def __init__(self) -> None:
        self.samples: dict[int, float] = {}

    def record(self, value: float, now: float, window_s: float, num: int) -> None:
        bucket = int(now // window_s)
        self.samples[bucket] = self.samples.get(bucket, 0.0) + value
        oldest = bucket - num + 1
        for b in [b for b in self.samples if b < oldest]:
            del self.samples[b]

    def unrecord(self, value: float, now: float, window_s: float) -> None:
        bucket = int(now // window_s)
        if bucket in self.samples:
            self.samples[bucket] -= value

    def rate(self, now: float, window_s: float, num: int) -> float:
        if not self.samples:
            return 0.0
        first = min(self.samples) * window_s
        # Like Kafka's Rate: at least num-1 whole windows, so a first burst is not judged over a few ms.
        elapsed = max(now - first, (num - 1) * window_s)
        return sum(self.samples.values()) / elapsed


class ClientQuotaManager:
    def __init__(self, key: str, quotas: QuotaSource, window_num: int = 11, window_s: float = 1.0) -> None:
        self.key = key
        self.quotas = quotas
        self.window_num = window_num
        self.window_s = window_s
        self._rates: dict[str, _Rate] = {}
        self._lock = threading.Lock()

    def quota_for(self, client_id: str) -> float | None:
        q = self.quotas()
        if not q:  # no quota anywhere (the usual case): asked on every produce and fetch
            return None
        for entity in (client_id, None):
            values = q.get(entity)
            if values is not None and self.key in values:
                return float(values[self.key])
        return None

    def record_and_get_throttle_ms(self, client_id: str, nbytes: int, now: float | None = None) -> int:
        """Count nbytes for the client; the throttle time if it is now over its quota, else 0."""
        bound = self.quota_for(client_id)
        if bound is None:
            return 0
        now = time.time() if now is None else now
        with self._lock:
            r = self._rates.setdefault(client_id, _Rate())
            r.record(nbytes, now, self.window_s, self.window_num)
            rate = r.rate(now, self.window_s, self.window_num)
        if rate <= bound:
            return 0
        if bound <= 0:
            return int(self.window_s * self.window_num * 1000)
        throttle = (rate - bound) / bound * self.window_s * self.window_num
        return int(min(throttle, self.window_s * self.window_num) * 1000)

    def unrecord(self, client_id: str, nbytes: int, now: float | None = None) -> None:
        """A throttled fetch sends no data, so its bytes do not count (as Kafka)."""
        now = time.time() if now is None else now
        with self._lock:
            r = self._rates.get(client_id)
            if r is not None:
                r.unrecord(nbytes, now, self.window_s)


# API keys no request quota applies to, as Kafka's ClientRequestQuotaManager exempts them: the brokers' own
# requests (ClusterAction APIs) and what a client sends before it could be throttled (ApiVersions, SASL).
REQUEST_QUOTA_EXEMPT = frozenset({4, 5, 6, 7, 17, 18, 27, 36, 56})


class RequestQuotaManager(ClientQuotaManager):
    """request_percentage: the share of one request handler's time a client may use per quota window (200 = two
    handlers' worth), measured as the time the broker spends handling its requests; over it, each response says
    throttle_time_ms and the connection waits that long, as Kafka does."""

    def __init__(self, quotas: QuotaSource, window_num: int = 11, window_s: float = 1.0) -> None:
        super().__init__(REQUEST_PERCENTAGE, quotas, window_num, window_s)

    def record_time_and_get_throttle_ms(self, client_id: str, seconds: float, now: float | None = None) -> int:
        # Kafka's nanosToPercentage: one second of handler time per second is 100 %.
        return self.record_and_get_throttle_ms(client_id, seconds * 100.0, now)  # type: ignore[arg-type]

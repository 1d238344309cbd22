"""Refused requests in the broker log: one INFO line per refusal naming the client, the API and the reason.

A refusal is a request (or one resource of it) answered with an error that says "you may not / this is not
accepted" (INVALID_CONFIG, UNSUPPORTED_VERSION, INVALID_REQUEST, POLICY_VIOLATION, authorization failures, ...),
as opposed to the errors of normal operation (NOT_COORDINATOR, UNKNOWN_TOPIC_OR_PARTITION, REBALANCE_IN_PROGRESS).
Kafka logs these at INFO; so does kbroker, at most one line per (client, API, error) per interval, so a client
retrying a bad request in a loop cannot flood the log. The next line after a quiet spell says how many were
suppressed.

Processors are threads, so the limiter takes a lock; refusals are rare, so it is never contended on a hot path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kbroker.protocol.errors import ErrorCode

log = logging.getLogger("kbroker.refusals")

REFUSAL_CODES: frozenset[int] = frozenset({
    ErrorCode.INVALID_TOPIC_EXCEPTION,
    ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ErrorCode.GROUP_AUTHORIZATION_FAILED,
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
    ErrorCode.UNSUPPORTED_SASL_MECHANISM,
    ErrorCode.UNSUPPORTED_VERSION,
    ErrorCode.INVALID_PARTITIONS,
    ErrorCode.INVALID_REPLICATION_FACTOR,
    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
    ErrorCode.INVALID_CONFIG,
    ErrorCode.INVALID_REQUEST,
    ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT,
    ErrorCode.POLICY_VIOLATION,
    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    ErrorCode.SECURITY_DISABLED,
    ErrorCode.TOPIC_DELETION_DISABLED,
    ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
})

INTERVAL_S = 10.0
# Keys kept for rate limiting; past this many (a client id per request?) the table starts over.
MAX_KEYS = 10_000


@dataclass(slots=True)
class _Window:
    last_logged: float
    suppressed: int = 0


class RefusalLog:
    def __init__(self, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[tuple[str, str, int], _Window] = {}

    def refused(self, client_id: str, peer: str, api: str, code: int, reason: str | None,
                resource: str | None = None) -> bool:
        """Log one refusal (if code is one) unless this client had the same one within the interval."""
        if code not in REFUSAL_CODES:
            return False
        now = self._clock()
        key = (client_id, api, code)
        with self._lock:
            w = self._windows.get(key)
            if w is not None and now - w.last_logged < self.interval_s:
                w.suppressed += 1
                return False
            if w is None and len(self._windows) >= MAX_KEYS:
                self._windows.clear()
            suppressed = w.suppressed if w is not None else 0
            self._windows[key] = _Window(now)
        name = ErrorCode(code).name if code in ErrorCode._value2member_map_ else str(code)
        log.info("Refused %s from client %r (%s)%s: %s: %s%s", api, client_id, peer,
                 f" for {resource}" if resource else "", name, reason or "no reason given",
                 f" ({suppressed} more like it since the last such line)" if suppressed else "")
        return True


REFUSALS = RefusalLog()

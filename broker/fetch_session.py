"""KIP-227 incremental fetch sessions: Kafka's CachedPartition, FetchSession, FetchSessionCache, FetchManager and
the FetchContexts (kafka.server.FetchSession.scala), as pure logic: no asyncio, no I/O, no log reads.

The Fetch handler turns a request into partitions (`CachedPartition`s carrying the request's FetchPartition),
asks `FetchManager.new_context` what kind of fetch it is, reads `context.partitions()` from the logs, and hands
the per-partition results back to `context.update_and_generate`, which picks what the response carries and, for
a session, remembers what was sent:

- session id 0, epoch 0 (INITIAL): a full fetch (FullFetchContext); a session is created if the cache has room.
- epoch -1 (FINAL): a full fetch without a session (SessionlessFetchContext); a session id given is closed.
- session id != 0, epoch 0: that session is closed, and a full fetch may create a new one.
- session id != 0, epoch > 0: an incremental fetch (IncrementalFetchContext): the request's partitions update the
  session, forgotten topics leave it, every partition of the session is read, and only those with something
  new (records, a changed high watermark / log start offset / last stable offset, an error, a diverging epoch)
  go in the response. An unknown id is FETCH_SESSION_ID_NOT_FOUND, a wrong epoch INVALID_FETCH_SESSION_EPOCH,
  a request version on the other side of v13 than the session's FETCH_SESSION_TOPIC_ID_ERROR.

Concurrency: a session is not tied to a connection (a client may reconnect, to another network processor, and
go on with its session), so the cache is shared by all processor threads. One lock guards the cache and every
session in it, because its updates are compound (check the epoch then bump it, move a session in the LRU order
and in the partition count, evict one and insert another) and the GIL does not make those atomic. The lock is
held only for dictionary work, never across a log read or an await: in new_context, in partitions() and in
update_and_generate. Kafka has a lock per session and one per cache shard (KAFKA-9401, 8 shards); under the GIL
more locks would buy nothing, so there is one cache and one lock.
"""

from __future__ import annotations

import logging
import operator
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import compress
from typing import Any

from kbroker.protocol.errors import ErrorCode

log = logging.getLogger("kbroker.fetch_session")

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
INT32_MAX = 2**31 - 1
# Kafka 3.8+ shards its fetch session cache by session id (FetchSessionCache.getCacheShard: id / range, truncated);
# an id whose shard does not exist fails the whole Fetch with UNKNOWN_SERVER_ERROR before the session is looked up.
SESSION_ID_SHARDS = 8
SESSION_ID_RANGE = INT32_MAX // SESSION_ID_SHARDS


def session_id_has_no_shard(session_id: int) -> bool:
    """Whether Kafka 3.9 would fail a Fetch naming this session id (negative ids of a whole range or more, and the
    few ids past the last shard)."""
    return session_id <= -SESSION_ID_RANGE or session_id >= SESSION_ID_SHARDS * SESSION_ID_RANGE
# Kafka's KafkaServer.MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS: a session this long unused is stale and may be
# evicted by anyone; a session younger than this is safe from eviction by a larger one.
MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS = 120_000
# A cache that refuses sessions says so at most this often.
_FULL_LOG_INTERVAL_S = 60.0

# A partition in a session or a request: (topic id when the fetch uses topic ids (v13+), else topic name; index).
PartitionKey = tuple[Any, int]


def next_epoch(epoch: int) -> int:
    """Kafka's FetchMetadata.nextEpoch: FINAL stays FINAL, and the epoch wraps past INT32_MAX to 1."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == INT32_MAX else epoch + 1


def records_size(records: Any) -> int:
    if records is None:
        return 0
    size = getattr(records, "size", None)  # a FileRecordsSlice; bytes have only their len
    return len(records) if size is None else int(size)


@dataclass(slots=True, eq=False)
class FollowerQuiet:
    """A follower's session partition whose last read found the follower at the log end with no divergence. While the
    request entry, the log's fetch state and the leader epoch stay as they were, and the session holds the offsets
    that read answered (`expected`, in the order of _LIVE), the follower has nothing to be told and the partition is
    not read again."""

    partition: Any  # broker.partition.Partition (a log moved to another dir keeps its fetch state)
    expected: tuple[Any, ...]  # (request entry, Log.fetch_state, leader epoch, high watermark, log start, last stable)


class _Never:
    """Stands in for the partition of NOT_QUIET, and for that partition's log."""

    leader_epoch = -2
    fetch_state = None

    @property
    def log(self) -> _Never:
        return self


# What a partition without a quiet read holds: its expected tuple equals no live one.
NOT_QUIET = FollowerQuiet(_Never(), (_Never,))
_LIVE = operator.attrgetter("req", "follower_quiet.partition.log.fetch_state", "follower_quiet.partition.leader_epoch",
                            "high_watermark", "local_log_start_offset", "last_stable_offset")
_EXPECTED = operator.attrgetter("follower_quiet.expected")


def quiet_holds(cp: CachedPartition) -> bool:
    return bool(_LIVE(cp) == _EXPECTED(cp))


def not_quiet(parts: list[CachedPartition]) -> list[CachedPartition]:
    """The partitions whose quiet read no longer holds (or that have none), in order. One pass at C level: it runs
    over a follower's whole session on every fetch, and most of a session is idle partitions."""
    return list(compress(parts, map(operator.ne, map(_LIVE, parts), map(_EXPECTED, parts))))


@dataclass(slots=True, eq=False)
class CachedPartition:
    """One partition of a fetch: the request's parameters (`req`, a FetchRequest.FetchPartition: fetch offset,
    max bytes, leader epoch, log start offset, last fetched epoch) and, in a session, what was last sent."""

    topic: str | None  # None: a topic id this broker does not know (yet)
    topic_id: bytes
    partition: int
    req: Any
    high_watermark: int = -1
    last_stable_offset: int = -1
    local_log_start_offset: int = -1
    # A follower's session: whether its last read found the follower at the log end with nothing to tell.
    follower_quiet: FollowerQuiet = NOT_QUIET

    def maybe_resolve_unknown_name(self, topic_names: Mapping[bytes, str]) -> None:
        if self.topic is None:
            self.topic = topic_names.get(self.topic_id)

    def remember(self, resp: Any) -> None:
        """What a full response told the client (Kafka's CachedPartition built from request and response data)."""
        self.high_watermark = resp.high_watermark
        self.last_stable_offset = resp.last_stable_offset
        self.local_log_start_offset = resp.log_start_offset

    def maybe_update_response_data(self, resp: Any, update: bool) -> bool:
        """Whether this partition's response must go out in an incremental response (Kafka's
        CachedPartition.maybeUpdateResponseData); with `update`, remember what is sent."""
        must_respond = records_size(resp.records) > 0
        if self.high_watermark != resp.high_watermark:
            must_respond = True
            if update:
                self.high_watermark = resp.high_watermark
        if self.local_log_start_offset != resp.log_start_offset:
            must_respond = True
            if update:
                self.local_log_start_offset = resp.log_start_offset
        # Kafka does not compare the last stable offset: it moves only with a marker (which moves the high watermark)
        # or with the log start offset. Compared here too, so a read_committed consumer can never miss one.
        if self.last_stable_offset != resp.last_stable_offset:
            must_respond = True
            if update:
                self.last_stable_offset = resp.last_stable_offset
        if resp.preferred_read_replica != -1:
            must_respond = True
        if resp.error_code != 0:
            # Sent every time; the high watermark forgotten so the partition is sent again once the error is gone.
            if update:
                self.high_watermark = -1
            must_respond = True
        de = resp.diverging_epoch
        if de is not None and (de.epoch != -1 or de.end_offset != -1):
            must_respond = True  # the follower must truncate
        return must_respond


@dataclass(eq=False)
class FetchSession:
    """A session's partitions in read order (partitions that just returned records move to the end, so every
    partition gets its turn at the response's byte budget) and its epoch: the one the next request must carry."""

    id: int
    privileged: bool  # created by a follower
    partitions: dict[PartitionKey, CachedPartition]
    uses_topic_ids: bool
    creation_ms: int
    last_used_ms: int
    epoch: int
    # When a follower's fetch last marked it caught up on the session's quiet partitions (_FetchPlan._touch_quiet).
    quiet_touched_ms: int = 0
    # The size the cache last accounted for (-1: not in the cache), and the eviction sets it is in (set by touch).
    cached_size: int = -1
    evictable_by_all: bool = False
    evictable_by_privileged: bool = False

    def update(self, fetch_data: Mapping[PartitionKey, CachedPartition],
               to_forget: Iterable[PartitionKey]) -> tuple[int, int, int]:
        """The request's partitions join the session or update its parameters; forgotten ones leave it.
        Returns (added, updated, removed) counts."""
        added = updated = removed = 0
        parts = self.partitions
        for key, entry in fetch_data.items():
            cached = parts.get(key)
            if cached is None:
                parts[key] = entry
                added += 1
            else:
                cached.req = entry.req
                updated += 1
        for key in to_forget:
            if parts.pop(key, None) is not None:
                removed += 1
        return added, updated, removed

    def evictable_key(self) -> tuple[bool, int, int]:
        return (self.privileged, self.cached_size, self.id)


class FetchSessionCache:
    """The sessions of this broker, at most `max_entries`, with Kafka's eviction rules (FetchSessionCache.tryEvict).

    A new session may take the place of an existing one B when the cache is full if:
    1. B is stale: unused for longer than `eviction_ms` (the least recently used session is looked at), or
    2. the new session is privileged (a follower's) and B is not, or
    3. the new session has more partitions than B and B is not recently created (older than `eviction_ms`).
    Among the candidates the least valuable is taken: unprivileged before privileged, then fewer partitions, then
    lower id. Whether a session is a candidate is decided when it is last used (touched), as in Kafka.

    Every method expects the caller to hold `lock` (FetchManager and the contexts take it).
    """

    def __init__(self, max_entries: int, eviction_ms: int = MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS,
                 clock_ms: Callable[[], int] | None = None) -> None:
        self.max_entries = max_entries
        self.eviction_ms = eviction_ms
        self.clock_ms = clock_ms or (lambda: time.monotonic_ns() // 1_000_000)
        self.lock = threading.Lock()
        self.sessions: dict[int, FetchSession] = {}
        # Least recently used first (Kafka orders by (lastUsedMs, id); here ties keep their touch order).
        self._last_used: OrderedDict[int, FetchSession] = OrderedDict()
        self.num_partitions = 0
        self.evictions = 0
        self._full_logged_at = -_FULL_LOG_INTERVAL_S

    # Read without the lock by the metrics exporter: each is one int.
    @property
    def size(self) -> int:
        return len(self.sessions)

    @property
    def total_partitions(self) -> int:
        return self.num_partitions

    def get(self, session_id: int) -> FetchSession | None:
        return self.sessions.get(session_id)

    def new_session_id(self) -> int:
        while True:
            sid = random.randint(1, SESSION_ID_SHARDS * SESSION_ID_RANGE - 1)
            if sid not in self.sessions:
                return sid

    def maybe_create_session(self, now: int, privileged: bool, size: int, uses_topic_ids: bool,
                             create_partitions: Callable[[], dict[PartitionKey, CachedPartition]]) -> int:
        """A new session holding `create_partitions()` if there is room (or a session can be evicted for it);
        its id, or INVALID_SESSION_ID."""
        if len(self.sessions) >= self.max_entries and not self._try_evict(privileged, size, now):
            self._log_full(privileged, size)
            return INVALID_SESSION_ID
        session = FetchSession(self.new_session_id(), privileged, create_partitions(), uses_topic_ids,
                               creation_ms=now, last_used_ms=now, epoch=next_epoch(INITIAL_EPOCH))
        self.sessions[session.id] = session
        self.touch(session, now)
        log.debug("Created fetch session %d (%d partitions, privileged=%s)", session.id, size, privileged)
        return session.id

    def _try_evict(self, privileged: bool, size: int, now: int) -> bool:
        if not self._last_used:
            return False
        oldest = next(iter(self._last_used.values()))
        if now - oldest.last_used_ms > self.eviction_ms:
            log.debug("Evicting stale fetch session %d", oldest.id)
            self._evict(oldest)
            return True
        # A scan instead of Kafka's sorted trees: it runs only when the cache is full and a full fetch asks for a
        # session, over at most max.incremental.fetch.session.cache.slots sessions.
        candidates = [s for s in self.sessions.values()
                      if (s.evictable_by_privileged if privileged else s.evictable_by_all)]
        if not candidates:
            return False
        victim = min(candidates, key=FetchSession.evictable_key)
        # The new session's key has id 0: an equal (privileged, size) never evicts.
        if (privileged, size, 0) < victim.evictable_key():
            return False
        log.debug("Evicting fetch session %d (privileged=%s, %d partitions) for a session of %d partitions "
                  "(privileged=%s)", victim.id, victim.privileged, victim.cached_size, size, privileged)
        self._evict(victim)
        return True

    def _evict(self, session: FetchSession) -> None:
        self.remove(session.id)
        self.evictions += 1

    def _log_full(self, privileged: bool, size: int) -> None:
        mono = time.monotonic()
        if mono - self._full_logged_at >= _FULL_LOG_INTERVAL_S:
            self._full_logged_at = mono
            log.info("Fetch session cache full (%d sessions, max.incremental.fetch.session.cache.slots=%d): no "
                     "session for a fetch of %d partitions (privileged=%s); it goes on with full fetches",
                     len(self.sessions), self.max_entries, size, privileged)

    def remove(self, session_id: int) -> FetchSession | None:
        session = self.sessions.pop(session_id, None)
        if session is None:
            return None
        self._last_used.pop(session_id, None)
        self.num_partitions -= session.cached_size
        session.cached_size = -1
        return session

    def touch(self, session: FetchSession, now: int) -> None:
        """Mark the session used now: its place in the LRU order, its size and its eviction candidacy."""
        session.last_used_ms = now
        self._last_used[session.id] = session
        self._last_used.move_to_end(session.id)
        if session.cached_size != -1:
            self.num_partitions -= session.cached_size
        session.cached_size = len(session.partitions)
        self.num_partitions += session.cached_size
        old_enough = now - session.creation_ms > self.eviction_ms
        session.evictable_by_privileged = not session.privileged or old_enough
        session.evictable_by_all = old_enough


# ---------------------------------------------------------------- contexts


class FetchContext:
    """What one Fetch request reads and how its response is made (Kafka's FetchContext)."""

    error: ErrorCode = ErrorCode.NONE

    def partitions(self) -> list[CachedPartition]:
        """The partitions to read, in order."""
        raise NotImplementedError

    def update_and_generate(self, results: list[tuple[CachedPartition, Any]]) -> tuple[int, int, list[tuple[CachedPartition, Any]]]:
        """(error code, session id, the (partition, PartitionData) pairs to send) for the partitions read."""
        raise NotImplementedError

    def throttled(self) -> tuple[int, int]:
        """(error code, session id) of the empty response a client over its quota gets."""
        return ErrorCode.NONE, INVALID_SESSION_ID


class SessionErrorContext(FetchContext):
    """A fetch whose session cannot be used: the error, no partitions."""

    def __init__(self, error: ErrorCode) -> None:
        self.error = error

    def partitions(self) -> list[CachedPartition]:
        return []

    def update_and_generate(self, results: list[tuple[CachedPartition, Any]]) -> tuple[int, int, list[tuple[CachedPartition, Any]]]:
        return self.error, INVALID_SESSION_ID, []


class SessionlessFetchContext(FetchContext):
    """A full fetch that neither creates nor uses a session (epoch -1, Fetch before v7, an emptied session)."""

    def __init__(self, fetch_data: Mapping[PartitionKey, CachedPartition]) -> None:
        self.fetch_data = fetch_data

    def partitions(self) -> list[CachedPartition]:
        return list(self.fetch_data.values())

    def update_and_generate(self, results: list[tuple[CachedPartition, Any]]) -> tuple[int, int, list[tuple[CachedPartition, Any]]]:
        return ErrorCode.NONE, INVALID_SESSION_ID, results


class FullFetchContext(FetchContext):
    """A full fetch (epoch 0): answered whole; a new session holding every partition of the response is created
    if the cache has room."""

    def __init__(self, cache: FetchSessionCache, fetch_data: Mapping[PartitionKey, CachedPartition],
                 uses_topic_ids: bool, is_from_follower: bool) -> None:
        self.cache = cache
        self.fetch_data = fetch_data
        self.uses_topic_ids = uses_topic_ids
        self.is_from_follower = is_from_follower

    def partitions(self) -> list[CachedPartition]:
        return list(self.fetch_data.values())

    def update_and_generate(self, results: list[tuple[CachedPartition, Any]]) -> tuple[int, int, list[tuple[CachedPartition, Any]]]:
        def create() -> dict[PartitionKey, CachedPartition]:
            # The request's partitions become the session's, each remembering what this response tells.
            for cp, resp in results:
                cp.remember(resp)
            return dict(self.fetch_data)

        cache = self.cache
        with cache.lock:
            session_id = cache.maybe_create_session(cache.clock_ms(), self.is_from_follower, len(self.fetch_data),
                                                    self.uses_topic_ids, create)
        return ErrorCode.NONE, session_id, results


class IncrementalFetchContext(FetchContext):
    """A fetch in an existing session: every partition of the session is read, the changed ones are sent."""

    def __init__(self, cache: FetchSessionCache, session: FetchSession, topic_names: Mapping[bytes, str]) -> None:
        self.cache = cache
        self.session = session
        self.topic_names = topic_names
        # The epoch new_context gave the session: another request in the session meanwhile changes it.
        self.expected_epoch = session.epoch

    def partitions(self) -> list[CachedPartition]:
        session = self.session
        with self.cache.lock:
            if session.uses_topic_ids:
                for cp in session.partitions.values():
                    cp.maybe_resolve_unknown_name(self.topic_names)
            return list(session.partitions.values())

    def update_and_generate(self, results: list[tuple[CachedPartition, Any]]) -> tuple[int, int, list[tuple[CachedPartition, Any]]]:
        session = self.session
        with self.cache.lock:
            if session.epoch != self.expected_epoch:
                log.info("Incremental fetch session %d expected epoch %d, but got %d. Possible duplicate request.",
                         session.id, self.expected_epoch, session.epoch)
                return ErrorCode.INVALID_FETCH_SESSION_EPOCH, session.id, []
            parts = session.partitions
            keyf = _key_of(session.uses_topic_ids)
            selected = []
            for cp, resp in results:
                if not cp.maybe_update_response_data(resp, True):
                    continue
                selected.append((cp, resp))
                if records_size(resp.records) > 0:
                    # Round robin: a partition that got records is read last next time.
                    key = keyf(cp)
                    if parts.get(key) is cp:
                        del parts[key]
                        parts[key] = cp
        return ErrorCode.NONE, session.id, selected

    def throttled(self) -> tuple[int, int]:
        with self.cache.lock:
            if self.session.epoch != self.expected_epoch:
                return ErrorCode.INVALID_FETCH_SESSION_EPOCH, self.session.id
        return ErrorCode.NONE, self.session.id


def _key_of(uses_topic_ids: bool) -> Callable[[CachedPartition], PartitionKey]:
    if uses_topic_ids:
        return lambda cp: (cp.topic_id, cp.partition)
    return lambda cp: (cp.topic, cp.partition)


class FetchManager:
    """Kafka's FetchManager: picks the context of each Fetch request."""

    def __init__(self, cache: FetchSessionCache) -> None:
        self.cache = cache

    def new_context(self, version: int, session_id: int, epoch: int, is_follower: bool,
                    fetch_data: Mapping[PartitionKey, CachedPartition], to_forget: list[PartitionKey],
                    topic_names: Mapping[bytes, str]) -> FetchContext:
        cache = self.cache
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):  # a full fetch
            if session_id != INVALID_SESSION_ID:
                # Any session named in a full fetch request is closed.
                with cache.lock:
                    if cache.remove(session_id) is not None:
                        log.debug("Closed fetch session %d", session_id)
            if epoch == FINAL_EPOCH:
                return SessionlessFetchContext(fetch_data)
            return FullFetchContext(cache, fetch_data, version >= 13, is_follower)
        with cache.lock:
            session = cache.get(session_id)
            if session is None:
                return SessionErrorContext(ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
            if session.epoch != epoch:
                return SessionErrorContext(ErrorCode.INVALID_FETCH_SESSION_EPOCH)
            if session.uses_topic_ids != (version >= 13):
                return SessionErrorContext(ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR)
            session.update(fetch_data, to_forget)
            if not session.partitions:
                # Nothing left in the session: it is closed and this request is answered without one.
                cache.remove(session.id)
                log.debug("Closed fetch session %d: no partitions left", session_id)
                return SessionlessFetchContext(fetch_data)
            cache.touch(session, cache.clock_ms())
            session.epoch = next_epoch(session.epoch)
            return IncrementalFetchContext(cache, session, topic_names)

"""Replica fetchers: followers copy their leaders' logs (Kafka's ReplicaFetcherManager / ReplicaFetcherThread).

Each (leader broker, fetcher id) pair gets one fetcher, a task on a network processor's event loop (Kafka runs
each in a thread of its own; under the GIL a thread would only contend with the processors); a partition goes
to fetcher hash(topic, partition) % num.replica.fetchers of its leader. A fetcher first truncates each new partition
(KIP-101/KIP-279: OffsetForLeaderEpoch with the follower's latest epoch, truncate to where the leader's log
agrees, repeated until both name the same epoch), then fetches with replica_id = this broker's id from the
log end, appending the leader's batches unchanged and taking its high watermark. A Fetch answer naming a
diverging epoch truncates the same way.

`_lock` is held while a response is applied and by remove_partitions, so once a partition is removed (it
became leader, or moved) no fetched batch lands in its log any more (Kafka's partitionMapLock).
"""

from __future__ import annotations

import asyncio
import logging
import operator
import os
import threading
import time
import zlib
from dataclasses import dataclass
from itertools import compress
from typing import TYPE_CHECKING

from kbroker.broker.fetch_session import next_epoch
from kbroker.broker.inter_broker import partitions_by_topic
from kbroker.broker.replica_fetch_codec import Entry, decode_fetch_response, encode_fetch_request
from kbroker.protocol import codec
from kbroker.protocol.errors import ErrorCode, KafkaError
from kbroker.protocol.messages import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)
from kbroker.storage.errors import KafkaStorageError, LogReplacedError
from kbroker.storage.leader_epoch_cache import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
from kbroker.storage.manager import TopicPartition

if TYPE_CHECKING:
    from kbroker.broker.partition import Partition
    from kbroker.broker.replica_manager import ReplicaManager
    from kbroker.broker.server import KafkaServer
    from kbroker.storage.log import Log

log = logging.getLogger("kbroker.replica_fetcher")

FETCH_VERSION = 12  # replica_id, last_fetched_epoch and diverging_epoch, topics by name
# The request written and the answer's common case read without the generated message objects
# (broker/replica_fetch_codec.py); KBROKER_REPLICA_FETCH_DIRECT=0 keeps the generated codec for every fetch (the
# reference, which the direct path falls back to for anything unusual in an answer).
DIRECT = os.environ.get("KBROKER_REPLICA_FETCH_DIRECT", "1") != "0"
OFFSET_FOR_LEADER_EPOCH_VERSION = 4
# How soon a partition is fetched again after its leader answered UNKNOWN_LEADER_EPOCH (see _delay).
_LEADER_CATCH_UP_S = 0.05
LIST_OFFSETS_VERSION = 4


@dataclass(slots=True)
class PartitionFetchState:
    partition: Partition
    leader_epoch: int
    truncating: bool = True
    delayed_until: float = 0.0
    # The request entry last asked with (replica_fetch_codec.Entry: FetchPartition's v12 fields), reused while its
    # position stays (None: build it again): the session then tells an unchanged partition by identity, and an idle
    # one costs no new entry per fetch.
    entry: Entry | None = None
    # The log's fetch_position the entry was built from (None with no entry): compared at C level on every fetch.
    entry_position: tuple[int, int] | None = None
    tp: TopicPartition = ("", -1)

    def __post_init__(self) -> None:
        self.tp = (self.partition.topic, self.partition.partition)

    def forget_entry(self) -> None:
        self.entry = self.entry_position = None


_POSITION = operator.attrgetter("partition.log.fetch_position")
_ENTRY_POSITION = operator.attrgetter("entry_position")
_TP = operator.attrgetter("tp")
_ENTRY = operator.attrgetter("entry")


def truncation_offset(lg: Log, leader_epoch: int, leader_end_offset: int) -> tuple[int, bool]:
    """Where a follower truncates given the leader's (epoch, end offset) for the follower's latest epoch
    (Kafka's AbstractFetcherThread.getOffsetTruncationState): (offset, whether truncation is complete)."""
    leo = lg.log_end_offset
    if leader_end_offset == UNDEFINED_EPOCH_OFFSET:
        # The leader knows no such epoch (or the follower has none): keep what is known committed.
        return min(lg.high_watermark, leo), True
    if leader_epoch == UNDEFINED_EPOCH:
        return min(leader_end_offset, leo), True
    epoch, end = lg.end_offset_for_epoch(leader_epoch)
    if epoch == UNDEFINED_EPOCH or end == UNDEFINED_EPOCH_OFFSET:
        return min(leader_end_offset, leo), True
    if epoch == leader_epoch:
        return min(leader_end_offset, end, leo), True
    # The follower's largest epoch below the leader's answer: truncate there and ask again with it.
    return min(end, leo), False


class FollowerFetchSession:
    """The follower's half of a KIP-227 fetch session with one leader (Kafka's FetchSessionHandler): after a full
    fetch opens the session, each fetch names only the partitions whose fetch position changed (new, or data was
    appended since) and the ones to forget; the leader answers only partitions with something new. Without it every
    fetch carried every followed partition both ways, idle or not. Any failure starts over with a full fetch that
    closes the old session (epoch 0)."""

    def __init__(self) -> None:
        self.session_id = 0
        self.epoch = 0  # 0: the next fetch is a full one
        self._sent: dict[TopicPartition, Entry] = {}

    def request(self, wanted: dict[TopicPartition, Entry]
                ) -> tuple[dict[TopicPartition, Entry], list[TopicPartition], int, int]:
        """(partitions to send, partitions to forget, session id, epoch) for a fetch of `wanted`."""
        if self.epoch == 0:
            return wanted, [], self.session_id, 0
        sent = self._sent
        # The fetcher reuses an entry while its position stays (PartitionFetchState.entry): an identity check at C
        # level passes all those, the field-by-field comparison is left for the rest.
        changed = compress(wanted.items(), map(operator.is_not, map(sent.get, wanted), wanted.values()))
        send = {tp: fp for tp, fp in changed if sent.get(tp) != fp}
        forgotten = [] if sent.keys() == wanted.keys() else [tp for tp in sent if tp not in wanted]
        return send, forgotten, self.session_id, self.epoch

    def answered(self, session_id: int, sent: dict[TopicPartition, Entry],
                 forgotten: list[TopicPartition]) -> None:
        if self.epoch == 0:
            # A full fetch: the leader opened a session (or had no room: session id 0, full fetches go on).
            self.session_id = session_id
            self._sent = dict(sent)
            self.epoch = 1 if session_id else 0
            return
        for tp in forgotten:
            self._sent.pop(tp, None)
        self._sent.update(sent)
        self.epoch = next_epoch(self.epoch)

    def failed(self) -> None:
        self.epoch = 0
        self._sent = {}


class ReplicaFetcherThread:
    def __init__(self, server: KafkaServer, rm: ReplicaManager, source_broker: int, fetcher_id: int,
                 host_loop: asyncio.AbstractEventLoop) -> None:
        self.server = server
        self.rm = rm
        self.source_broker = source_broker
        self.fetcher_id = fetcher_id
        self.name = f"ReplicaFetcherThread-{fetcher_id}-{source_broker}"
        c = server.config
        self.max_wait_ms: int = c["replica.fetch.wait.max.ms"]
        self.min_bytes: int = c["replica.fetch.min.bytes"]
        self.max_bytes: int = c["replica.fetch.response.max.bytes"]
        self.partition_max_bytes: int = c["replica.fetch.max.bytes"]
        self.backoff: float = c["replica.fetch.backoff.ms"] / 1000
        self.partitions: dict[TopicPartition, PartitionFetchState] = {}
        self._lock = threading.Lock()
        # No partition is delayed or truncating (set under _lock by the loop's check, cleared by whatever delays a
        # partition or makes it truncate): each fetch then takes them all without looking at each.
        self._settled = False
        self._running = True
        self._failing = False  # one warning per streak of failed requests, not one per backoff
        self.session = FollowerFetchSession()
        self.client = server.inter_broker.new_client()
        self._client_id = self.client.client_id.encode()
        self._wake = asyncio.Event()
        self._fetching = False  # a Fetch is in flight (on the loop only)
        self._restart = False  # it was given up so the next one carries newly added partitions
        # A network processor's loop runs the fetcher: with the GIL, a thread of its own only makes the two
        # contend for it (each handoff can wait a switch interval) and adds a wake-up per fetch.
        self.loop = host_loop
        self._done = asyncio.run_coroutine_threadsafe(self._run(), host_loop)

    # -- control (any thread) ------------------------------------------------------------------

    def add(self, p: Partition) -> None:
        s = PartitionFetchState(p, p.leader_epoch)
        with self._lock:
            self.partitions[s.tp] = s
            self._settled = False
        self.loop.call_soon_threadsafe(self._added)

    def _added(self) -> None:
        self._wake.set()
        if self._fetching and not self._restart:
            # The Fetch in flight may be parked in the leader's purgatory for up to replica.fetch.wait.max.ms and
            # cannot carry the new partition: after a leadership change (a controlled shutdown, a failover) the
            # new leader's acks=all produce would wait that long for this follower. A broker answers one
            # connection's requests in order, so the fetch is given up with its connection (the leader drops
            # the parked request) and the next one starts at once on a new connection.
            self._restart = True
            self.client.close()

    def remove(self, tps: list[TopicPartition]) -> None:
        with self._lock:
            for tp in tps:
                self.partitions.pop(tp, None)

    def initiate_shutdown(self) -> None:
        """Stop after the request in flight (whose answer no longer touches a removed partition)."""
        self._running = False
        if not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self._wake.set)
            except RuntimeError:
                pass  # closed meanwhile

    def shutdown(self) -> None:
        self.initiate_shutdown()
        if self.loop.is_running():
            try:
                self._done.result(timeout=5)
            except Exception:  # noqa: BLE001 - stopping anyway; _run logged what went wrong
                pass

    # -- the loop ------------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._fetch_loop()
        finally:
            self.client.close()

    async def _fetch_loop(self) -> None:
        while self._running:
            now = time.monotonic()
            with self._lock:
                settled = self._settled
                if settled:  # none delayed or truncating: every partition is fetched
                    states, due = list(self.partitions.values()), None
                else:
                    states = [s for s in self.partitions.values() if s.delayed_until <= now]
                    # The first delayed partition: when all are, sleep until it is due (or a change wakes us); else
                    # the fetch's long poll ends by then, so a partition delayed 50 ms does not wait out
                    # replica.fetch.wait.max.ms behind a Fetch that left it out.
                    due = min((s.delayed_until for s in self.partitions.values() if s.delayed_until > now),
                              default=None)
                    settled = self._settled = due is None and not any(s.truncating for s in states)
            if not states:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), None if due is None else max(due - now, 0.001))
                except TimeoutError:
                    pass
                continue
            try:
                truncating = None if settled else [s for s in states if s.truncating]
                if truncating:
                    await self._truncate(truncating)
                    continue
                wait_ms = self.max_wait_ms if due is None else min(self.max_wait_ms, int((due - now) * 1000) + 1)
                await self._fetch(states, wait_ms)
                if self._failing:
                    self._failing = False
                    log.info("%s: fetching from broker %d again", self.name, self.source_broker)
            except (ConnectionError, KafkaError, OSError) as e:
                if self._restart and isinstance(e, ConnectionError):
                    continue  # given up for newly added partitions (_added): fetch again now
                (log.debug if self._failing else log.warning)(
                    "%s: fetch from broker %d failed: %s (retrying every %.1f s)", self.name, self.source_broker, e,
                    self.backoff)
                self._failing = True
                await asyncio.sleep(self.backoff)
            except Exception:
                log.exception("%s: unexpected error", self.name)
                await asyncio.sleep(self.backoff)

    def _current(self, s: PartitionFetchState) -> bool:
        """Still ours at the same epoch (checked under _lock before touching the log)."""
        p = s.partition
        return self.partitions.get((p.topic, p.partition)) is s and p.leader_epoch == s.leader_epoch

    def _delay(self, s: PartitionFetchState, code: int = ErrorCode.NONE) -> None:
        # UNKNOWN_LEADER_EPOCH: the leader has not applied the LeaderAndIsr the controller sent us both at once; it
        # will within milliseconds, and until it does the high watermark waits for us (in a controlled shutdown,
        # acks=all Produce paused for the whole backoff, a second).
        wait = min(self.backoff, _LEADER_CATCH_UP_S) if code == ErrorCode.UNKNOWN_LEADER_EPOCH else self.backoff
        s.delayed_until = time.monotonic() + wait
        self._settled = False

    # -- truncation ----------------------------------------------------------------------------

    async def _truncate(self, states: list[PartitionFetchState]) -> None:
        R = OffsetForLeaderEpochRequest
        by_topic: dict[str, list[OffsetForLeaderEpochRequest.OffsetForLeaderPartition]] = {}
        for s in states:
            p = s.partition
            by_topic.setdefault(p.topic, []).append(R.OffsetForLeaderPartition(
                partition=p.partition, current_leader_epoch=s.leader_epoch, leader_epoch=p.log.latest_epoch))
        req = R(replica_id=self.server.broker_id,
                topics=[R.OffsetForLeaderTopic(topic=t, partitions=ps) for t, ps in by_topic.items()])
        resp: OffsetForLeaderEpochResponse = await self.client.request(
            self.source_broker, 23, OFFSET_FOR_LEADER_EPOCH_VERSION, req, self.name)
        answers = {(t.topic, pr.partition): pr for t in resp.topics for pr in t.partitions}
        with self._lock:
            for s in states:
                p = s.partition
                if not self._current(s):
                    continue
                a = answers.get((p.topic, p.partition))
                if a is None or a.error_code != ErrorCode.NONE:
                    log.info("%s: OffsetForLeaderEpoch for %s answered %s", self.name, p.name,
                             ErrorCode(a.error_code).name if a is not None else "nothing")
                    self._delay(s, a.error_code if a is not None else ErrorCode.NONE)
                    continue
                self._apply_truncation(s, a.leader_epoch, a.end_offset)

    def _apply_truncation(self, s: PartitionFetchState, leader_epoch: int, leader_end_offset: int) -> None:
        p = s.partition
        lg = p.log
        offset, done = truncation_offset(lg, leader_epoch, leader_end_offset)
        if offset < lg.log_end_offset:
            log.info("%s: truncating %s from %d to %d (leader epoch %d ends at %d)", self.name, p.name,
                     lg.log_end_offset, offset, leader_epoch, leader_end_offset)
            lg.truncate_to(offset)
        else:
            # No batch to drop, but an epoch entry the leader does not have may end the cache.
            lg.leader_epoch_cache.truncate_from_end(offset)
        s.truncating = not done
        if not done:
            self._settled = False
        s.forget_entry()

    # -- fetching ------------------------------------------------------------------------------

    async def _fetch(self, states: list[PartitionFetchState], max_wait_ms: int) -> None:
        session = self.session
        # Entries are built again only where the log moved (most partitions are idle: found at C level). The latest
        # epoch moves only with the log end, except in a truncation, which forgets the entry.
        for s in list(compress(states, map(operator.ne, map(_POSITION, states), map(_ENTRY_POSITION, states)))):
            p = s.partition
            lg = p.log
            position = s.entry_position = lg.fetch_position
            s.entry = (p.partition, s.leader_epoch, position[0], lg.latest_epoch, position[1],
                       self.partition_max_bytes)
        tps = list(map(_TP, states))
        wanted: dict[TopicPartition, Entry] = dict(zip(tps, map(_ENTRY, states), strict=True))
        by_tp = dict(zip(tps, states, strict=True))
        send, forgotten, session_id, epoch = session.request(wanted)
        by_topic: dict[str, list[Entry]] = {}
        for (topic, _), entry in send.items():
            by_topic.setdefault(topic, []).append(entry)
        forgotten_by_topic = partitions_by_topic(forgotten)
        direct: tuple[int, list[tuple[str, int, int, int, memoryview | None]]] | None = None
        self._fetching, self._restart = True, False
        try:
            if DIRECT:
                frame = await self.client.request_frame(
                    self.source_broker, 1,
                    lambda correlation_id: encode_fetch_request(
                        correlation_id, self._client_id, self.server.broker_id, max_wait_ms, self.min_bytes,
                        self.max_bytes, session_id, epoch, list(by_topic.items()), list(forgotten_by_topic.items())),
                    self.name)
                direct = decode_fetch_response(frame)
                resp = _decode_answer(frame, self.source_broker) if direct is None else None
            else:
                resp = await self.client.request(self.source_broker, 1, FETCH_VERSION,
                                                 _request_objects(self.server.broker_id, max_wait_ms, self.min_bytes,
                                                                  self.max_bytes, session_id, epoch, by_topic,
                                                                  forgotten_by_topic),
                                                 self.name)
        except BaseException:
            session.failed()  # the leader may or may not have seen it: the next fetch starts a new session
            raise
        finally:
            self._fetching = False
        if direct is not None:
            # The common case (no error anywhere, no diverging epoch): straight from the answer's bytes to the logs.
            session.answered(direct[0], send, forgotten)
            with self._lock:
                for topic, partition, hw, _, records in direct[1]:
                    state = by_tp.get((topic, partition))
                    if state is not None and self._current(state):
                        self._append(state, records, hw)
            return
        assert resp is not None
        if resp.error_code:  # an int compared: the ErrorCode enum is built only for what is logged or raised
            code = ErrorCode(resp.error_code)
            session.failed()
            if code in (ErrorCode.FETCH_SESSION_ID_NOT_FOUND, ErrorCode.INVALID_FETCH_SESSION_EPOCH):
                log.info("%s: fetch session %d at epoch %d answered %s; starting a new one", self.name, session_id,
                         epoch, code.name)
                return
            raise KafkaError(code, "fetch request refused")
        session.answered(resp.session_id, send, forgotten)
        out_of_range: list[PartitionFetchState] = []
        with self._lock:
            # An incremental answer holds only the partitions with news: the rest of the session is not visited.
            for t in resp.responses:
                for pd in t.partitions:
                    s = by_tp.get((t.topic, pd.partition_index))
                    if s is None or not self._current(s):
                        continue
                    if not pd.error_code:
                        self._apply_fetched(s, pd)
                        continue
                    code = ErrorCode(pd.error_code)
                    if code == ErrorCode.OFFSET_OUT_OF_RANGE:
                        out_of_range.append(s)
                    else:
                        # FENCED / UNKNOWN_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER...: the controller's next
                        # LeaderAndIsr settles it; retry after the backoff meanwhile.
                        log.info("%s: fetch of %s answered %s", self.name, s.partition.name, code.name)
                        self._delay(s, code)
        for s in out_of_range:
            await self._handle_out_of_range(s)

    def _apply_fetched(self, s: PartitionFetchState, pd: FetchResponse.PartitionData) -> None:
        diverging = pd.diverging_epoch
        if diverging is not None and diverging.epoch >= 0 and diverging.end_offset >= 0:
            self._apply_truncation(s, diverging.epoch, diverging.end_offset)
            return
        self._append(s, pd.records, pd.high_watermark)

    def _append(self, s: PartitionFetchState, records: bytes | memoryview | None, high_watermark: int) -> None:
        p = s.partition
        lg = p.log
        if records:
            try:
                lg.append_fetched(records)  # up to the last whole batch: a leader may cut its answer
            except LogReplacedError:
                lg = p.log  # moved to another log dir meanwhile (nothing was written): append to the new one
                lg.append_fetched(records)
            except KafkaStorageError as e:
                self.server.log_manager.maybe_fail_dir(lg, e)
                raise
        lg.update_high_watermark(high_watermark)

    async def _handle_out_of_range(self, s: PartitionFetchState) -> None:
        """The leader does not have our log end: behind its log start (start over there) or, after an
        unclean election, past its end (truncate to it)."""
        p = s.partition
        leader_end = await self._leader_offset(p, -1)
        leader_start = await self._leader_offset(p, -2)
        with self._lock:
            if not self._current(s) or leader_end < 0 or leader_start < 0:
                self._delay(s)
                return
            lg = p.log
            if lg.log_end_offset > leader_end:
                log.warning("%s: %s log end %d is past the leader's %d: truncating", self.name, p.name,
                            lg.log_end_offset, leader_end)
                lg.truncate_to(leader_end)
            elif lg.log_end_offset < leader_start:
                log.warning("%s: %s log end %d is below the leader's log start %d: starting over there", self.name,
                            p.name, lg.log_end_offset, leader_start)
                lg.truncate_fully_and_start_at(leader_start)
            s.forget_entry()

    async def _leader_offset(self, p: Partition, timestamp: int) -> int:
        L = ListOffsetsRequest
        req = L(replica_id=self.server.broker_id, isolation_level=0, topics=[L.ListOffsetsTopic(
            name=p.topic, partitions=[L.ListOffsetsPartition(partition_index=p.partition,
                                                             current_leader_epoch=p.leader_epoch,
                                                             timestamp=timestamp)])])
        resp: ListOffsetsResponse = await self.client.request(self.source_broker, 2,
                                                                        LIST_OFFSETS_VERSION, req, self.name)
        for t in resp.topics:
            for pr in t.partitions:
                if pr.error_code == ErrorCode.NONE:
                    return int(pr.offset)
        return -1


def _request_objects(replica_id: int, max_wait_ms: int, min_bytes: int, max_bytes: int, session_id: int,
                     epoch: int, by_topic: dict[str, list[Entry]], forgotten: dict[str, list[int]]) -> FetchRequest:
    """The reference path's request (KBROKER_REPLICA_FETCH_DIRECT=0): the generated message for the same fields as
    replica_fetch_codec.encode_fetch_request."""
    F = FetchRequest
    return F(replica_id=replica_id, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
             isolation_level=0, session_id=session_id, session_epoch=epoch,
             topics=[F.FetchTopic(topic=t, partitions=[F.FetchPartition(*e) for e in es]) for t, es in by_topic.items()],
             forgotten_topics_data=[F.ForgottenTopic(topic=t, partitions=ps) for t, ps in forgotten.items()])


def _decode_answer(frame: bytes, broker_id: int) -> FetchResponse:
    """The generated decoder on an answer the direct decode left (an error, a diverging epoch...)."""
    try:
        _, body = codec.decode_response(1, FETCH_VERSION, frame)
    except codec.DecodeError as e:
        raise ConnectionError(f"malformed response from broker {broker_id}: {e}") from None
    resp: FetchResponse = body
    return resp


class ReplicaFetcherManager:
    """Fetcher threads by (leader broker, fetcher id); threads without partitions stop."""

    def __init__(self, server: KafkaServer, rm: ReplicaManager) -> None:
        self.server = server
        self.rm = rm
        self.num_fetchers: int = server.config["num.replica.fetchers"]
        self._lock = threading.Lock()
        self._fetchers: dict[tuple[int, int], ReplicaFetcherThread] = {}
        self._assigned: dict[TopicPartition, tuple[int, int]] = {}

    def _host_loop(self, n: int) -> asyncio.AbstractEventLoop:
        processors = self.server.socket_server.processors
        return processors[n % len(processors)].loop

    def _fetcher_id(self, topic: str, partition: int) -> int:
        return (31 * zlib.crc32(topic.encode()) + partition) % self.num_fetchers

    def add_partitions(self, partitions: list[Partition]) -> None:
        with self._lock:
            for p in partitions:
                key = (p.leader_id, self._fetcher_id(p.topic, p.partition))
                fetcher = self._fetchers.get(key)
                if fetcher is None:
                    fetcher = self._fetchers[key] = ReplicaFetcherThread(self.server, self.rm, *key,
                                                                         self._host_loop(len(self._fetchers)))
                    log.info("Started %s", fetcher.name)
                fetcher.add(p)
                self._assigned[(p.topic, p.partition)] = key
                log.info("%s: fetching from broker %d at leader epoch %d from offset %d", p.name, p.leader_id,
                         p.leader_epoch, p.log.log_end_offset)

    def remove_partitions(self, tps: list[TopicPartition]) -> None:
        with self._lock:
            by_fetcher: dict[tuple[int, int], list[TopicPartition]] = {}
            for tp in tps:
                key = self._assigned.pop(tp, None)
                if key is not None:
                    by_fetcher.setdefault(key, []).append(tp)
            for key, group in by_fetcher.items():
                self._fetchers[key].remove(group)

    def shutdown_idle_fetchers(self) -> None:
        """After a LeaderAndIsr moved partitions around (Kafka's shutdownIdleFetcherThreads)."""
        with self._lock:
            idle = [k for k, f in self._fetchers.items() if not f.partitions]
            stopping = [self._fetchers.pop(k) for k in idle]
        for f in stopping:
            f.initiate_shutdown()
            log.info("Stopping %s: no partitions left", f.name)

    def shutdown(self) -> None:
        with self._lock:
            fetchers = list(self._fetchers.values())
            self._fetchers.clear()
            self._assigned.clear()
        for f in fetchers:
            f.shutdown()

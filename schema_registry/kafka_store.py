"""The `_schemas` topic as the registry's log: a Kafka client of the cluster (loopback to its own broker, then the
partition leader) that creates the topic, appends records with acks=all, and tails it into RegistryState.

Concurrency model: one reader thread owns the fetch connection and applies records in offset order; writers (HTTP
threads) append on their own connection under a lock and wait until the reader has applied their offset, so a
write is visible to its own answer and to every later read (the reference registry's KafkaStore does the same).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import FetchRequest, ListOffsetsRequest, ProduceRequest
from kbroker.protocol.records import (
    ATTR_CONTROL,
    CorruptRecordError,
    build_batch,
    decode_records,
    iter_batch_headers,
)
from kbroker.schema_registry.errors import store_error, store_timeout

log = logging.getLogger("kbroker.schema_registry")

TOPIC = "_schemas"
PRODUCE, FETCH, LIST_OFFSETS = 0, 1, 2
RETRIABLE = {
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    ErrorCode.REQUEST_TIMED_OUT,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
}


class KafkaStore:
    def __init__(
        self,
        connect: Callable[[str, int], Any],
        apply: Callable[[bytes | None, bytes | None], None],
        timeout: float = 30.0,
    ) -> None:
        """connect(host, port): an authenticated WireClient to a broker; `bootstrap` is set before start()."""
        self.connect = connect
        self.bootstrap: tuple[str, int] = ("127.0.0.1", 0)
        self.apply = apply
        self.timeout = timeout
        self.position = 0  # the next offset the reader applies
        self.ready = threading.Event()  # the topic was read to its end once
        self.error: str | None = None
        self._applied = threading.Condition()
        self._write_lock = threading.Lock()
        self._writer: Any = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kbroker-schema-registry-reader", daemon=True)

    # ------------------------------------------------------------ connections

    def _connect(self, host: str, port: int) -> Any:
        return self.connect(host, port)

    def _leader_client(self, create: bool = True):  # type: ignore[no-untyped-def]
        """A connection to the leader of _schemas-0, creating the topic when `create` (the first write: by then a
        cluster's brokers have registered, so the replication factor counts them); None when the topic does not
        exist and create is False."""
        from kbroker_tools.wire import WireError

        client = self._connect(*self.bootstrap)
        try:
            deadline = time.monotonic() + self.timeout
            while True:
                md = client.metadata([TOPIC])
                (t,) = md.topics
                if t.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and not create:
                    client.close()
                    return None
                if t.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    replicas = max(1, min(3, len(md.brokers)))
                    controller = next((b for b in md.brokers if b.node_id == md.controller_id), None)
                    # CreateTopics goes to the controller (a single node is its own).
                    target = client
                    if controller is not None and (controller.host, controller.port) != self.bootstrap:
                        target = self._connect(controller.host, controller.port)
                    try:
                        target.create_topic(
                            TOPIC, 1, {"cleanup.policy": "compact"}, replication_factor=replicas
                        )
                        log.info(
                            "Created the schema registry's topic %s (replication factor %d)", TOPIC, replicas
                        )
                    except WireError as e:
                        if e.code not in (ErrorCode.TOPIC_ALREADY_EXISTS, ErrorCode.NOT_CONTROLLER):
                            raise
                    finally:
                        if target is not client:
                            target.close()
                elif t.error_code == 0 and t.partitions and t.partitions[0].leader_id >= 0:
                    leader = t.partitions[0].leader_id
                    for b in md.brokers:
                        if b.node_id == leader:
                            if (b.host, b.port) == self.bootstrap:
                                return client
                            client.close()
                            return self._connect(b.host, b.port)
                elif t.error_code not in RETRIABLE and t.error_code != ErrorCode.NONE:
                    raise ConnectionError(f"{TOPIC}: {ErrorCode(t.error_code).name}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{TOPIC} has no leader after {self.timeout:.0f} s")
                time.sleep(0.2)
        except BaseException:
            client.close()
            raise

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
        with self._write_lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    # ------------------------------------------------------------ the reader

    def _run(self) -> None:
        client = None
        backoff = 0.1
        while not self._stopping.is_set():
            try:
                if client is None:
                    client = self._leader_client(create=False)
                if client is None:  # no registry wrote yet: an empty registry, until the topic appears
                    self.ready.set()
                    self._stopping.wait(0.5)
                    continue
                high_watermark = self._fetch_once(client, 500)
                if not self.ready.is_set() and self.position >= high_watermark:
                    self.ready.set()
                    log.info("Schema registry read %s to offset %d", TOPIC, self.position)
                backoff = 0.1
            except Exception as e:  # noqa: BLE001  (the broker may be starting or moving leaders: retry)
                self.error = f"{type(e).__name__}: {e}"
                log.debug("Schema registry reader: %s", self.error)
                if client is not None:
                    client.close()
                    client = None
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 2.0)
        if client is not None:
            client.close()

    def _fetch_once(self, client, max_wait_ms: int) -> int:  # type: ignore[no-untyped-def]
        req = FetchRequest(
            replica_id=-1,
            max_wait_ms=max_wait_ms if self.ready.is_set() else 0,
            min_bytes=1,
            max_bytes=8 << 20,
            isolation_level=1,
            session_id=0,
            session_epoch=-1,
            topics=[
                FetchRequest.FetchTopic(
                    topic=TOPIC,
                    partitions=[
                        FetchRequest.FetchPartition(
                            partition=0,
                            current_leader_epoch=-1,
                            fetch_offset=self.position,
                            log_start_offset=-1,
                            partition_max_bytes=8 << 20,
                        )
                    ],
                )
            ],
            forgotten_topics_data=[],
            rack_id="",
        )
        resp = client.request(FETCH, 11, req)
        if resp.error_code:
            raise ConnectionError(f"Fetch {TOPIC}: {ErrorCode(resp.error_code).name}")
        (p,) = [p for t in resp.responses for p in t.partitions]
        if p.error_code == ErrorCode.OFFSET_OUT_OF_RANGE and self.position < p.log_start_offset:
            self.position = p.log_start_offset
            return p.high_watermark
        if p.error_code:
            raise ConnectionError(f"Fetch {TOPIC}: {ErrorCode(p.error_code).name}")
        data = bytes(p.records or b"")
        for pos, header in iter_batch_headers(data):
            if pos + header.size_in_bytes > len(data):
                break
            next_offset = header.base_offset + header.last_offset_delta + 1
            if next_offset <= self.position:
                continue
            if not header.attributes & ATTR_CONTROL:
                try:
                    decoded = decode_records(data, pos)
                except CorruptRecordError as e:
                    raise ConnectionError(f"{TOPIC}: {e}") from None
                for r in decoded:
                    if r.offset >= self.position:
                        try:
                            self.apply(r.key, r.value)
                        except Exception:  # a record this registry cannot read must not stop the others
                            log.exception("Schema registry skipped %s offset %d", TOPIC, r.offset)
            with self._applied:
                self.position = next_offset
                self._applied.notify_all()
        return p.high_watermark

    def wait_ready(self, timeout: float) -> None:
        if not self.ready.wait(timeout):
            raise store_timeout(
                f"The schema registry has not read {TOPIC} yet" + (f" ({self.error})" if self.error else "")
            )

    # ------------------------------------------------------------ writes

    def write(self, key: bytes, value: bytes | None) -> int:
        """Append one record (acks=all) and wait until the reader applied it; its offset."""
        with self._write_lock:
            offset = self._produce(key, value)
        deadline = time.monotonic() + self.timeout
        with self._applied:
            while self.position <= offset:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise store_timeout(f"Write to {TOPIC} at offset {offset} was not read back in time")
                self._applied.wait(left)
        return offset

    def catch_up(self) -> None:
        """Wait until the reader has applied everything in the topic now: after another registry wrote for us."""
        Topic, Partition = ListOffsetsRequest.ListOffsetsTopic, ListOffsetsRequest.ListOffsetsPartition
        req = ListOffsetsRequest(
            replica_id=-1,
            isolation_level=1,
            topics=[
                Topic(
                    name=TOPIC,
                    partitions=[Partition(partition_index=0, current_leader_epoch=-1, timestamp=-1)],
                )
            ],
        )
        with self._write_lock:
            if self._writer is None:
                self._writer = self._leader_client()
            try:
                resp = self._writer.request(LIST_OFFSETS, 7, req)
            except BaseException:
                self._writer.close()
                self._writer = None
                raise
        (p,) = [p for t in resp.topics for p in t.partitions]
        if p.error_code:
            return
        deadline = time.monotonic() + self.timeout
        with self._applied:
            while self.position < p.offset and time.monotonic() < deadline:
                self._applied.wait(deadline - time.monotonic())

    def _produce(self, key: bytes, value: bytes | None) -> int:
        batch = build_batch([(key, value, [], int(time.time() * 1000))])
        req = ProduceRequest(
            transactional_id=None,
            acks=-1,
            timeout_ms=int(self.timeout * 1000),
            topic_data=[
                ProduceRequest.TopicProduceData(
                    name=TOPIC, partition_data=[ProduceRequest.PartitionProduceData(index=0, records=batch)]
                )
            ],
        )
        last = ""
        deadline = time.monotonic() + self.timeout
        for attempt in range(1000):
            if attempt and time.monotonic() > deadline:
                break
            try:
                if self._writer is None:
                    self._writer = self._leader_client()
                resp = self._writer.request(PRODUCE, 9, req)
            except (OSError, ConnectionError, TimeoutError) as e:
                last = str(e)
                if self._writer is not None:
                    self._writer.close()
                    self._writer = None
                time.sleep(min(0.1 * (attempt + 1), 1.0))
                continue
            (p,) = [p for t in resp.responses for p in t.partition_responses]
            if p.error_code == 0:
                return int(p.base_offset)
            last = ErrorCode(p.error_code).name
            if p.error_code not in RETRIABLE:
                break
            self._writer.close()
            self._writer = None
            time.sleep(min(0.1 * (attempt + 1), 1.0))
        raise store_error(f"Error while writing to {TOPIC}: {last}")

"""Broker metrics in Prometheus text format on `metrics.port`, named as the JMX exporter's common Kafka rules name
Kafka's MBeans (kafka.server<type=BrokerTopicMetrics, name=BytesInPerSec, topic=t> -> kafka_server_brokertopicmetrics_
bytesin_total{topic="t"}).

Concurrency model: request paths never lock and never look up a labelled metric. Each thread that handles requests
(the network processors) owns a `Shard` of plain ints and lists, found through a thread-local; only that thread
writes it. The exporter (prometheus_client's HTTP thread) sums the shards at scrape time, reads gauges from the
server's objects then, and asks the group coordinator's loop for committed offsets. One registry, one collector.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from kbroker.protocol import codec
from kbroker.storage.flush_stats import BUCKETS_MS as FLUSH_BUCKETS_MS
from kbroker.storage.flush_stats import FLUSH_STATS

if TYPE_CHECKING:
    from kbroker.broker.server import KafkaServer

log = logging.getLogger("kbroker.metrics")

# Upper bounds (ms) of the request latency histogram buckets; the last bucket is +Inf.
REQUEST_BUCKETS_MS: tuple[float, ...] = (1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
_NUM_API_KEYS = 100
# The JMX exporter's quantile labels for a Kafka Histogram's 50th, 75th, 95th, 98th, 99th, 999th Percentile.
PERCENTILES = ("0.50", "0.75", "0.95", "0.98", "0.99", "0.999")
PERCENTILE_WINDOW_S = 300.0  # about the recent past Kafka's exponentially decaying reservoir weighs


class Shard:
    """One thread's counters. Written only by its thread, read (racily, but each value is one int) by the exporter."""

    __slots__ = ("requests", "time_ms_sum", "time_buckets", "busy_s", "topic_in", "topic_out", "queued",
                 "queue_ms_sum", "queue_buckets", "failed")

    def __init__(self) -> None:
        self.requests = [0] * _NUM_API_KEYS
        self.time_ms_sum = [0.0] * _NUM_API_KEYS
        self.time_buckets: list[list[int] | None] = [None] * _NUM_API_KEYS
        self.busy_s = 0.0  # time spent handling requests on this thread
        self.topic_in: dict[str, list[int]] = {}  # topic -> [messages, bytes]
        self.topic_out: dict[str, list[int]] = {}  # topic -> [bytes]
        # Requests that waited behind another on their connection; the others waited 0 ms (requests - queued).
        self.queued = [0] * _NUM_API_KEYS
        self.queue_ms_sum = [0.0] * _NUM_API_KEYS
        self.queue_buckets: list[list[int] | None] = [None] * _NUM_API_KEYS
        self.failed: dict[str, list[int]] = {}  # topic -> [failed produce partitions, failed fetch partitions]

    def request_done(self, api_key: int, elapsed_s: float) -> None:
        if not 0 <= api_key < _NUM_API_KEYS:
            return
        ms = elapsed_s * 1000
        self.requests[api_key] += 1
        self.time_ms_sum[api_key] += ms
        buckets = self.time_buckets[api_key]
        if buckets is None:
            buckets = self.time_buckets[api_key] = [0] * (len(REQUEST_BUCKETS_MS) + 1)
        buckets[bisect.bisect_left(REQUEST_BUCKETS_MS, ms)] += 1

    def request_queued(self, frame: bytes | bytearray, waited_s: float) -> None:
        """A request that waited in its connection's queue (RequestQueueTimeMs); the api key leads the frame."""
        api_key = (frame[0] << 8) | frame[1] if len(frame) >= 2 else -1
        if not 0 <= api_key < _NUM_API_KEYS:
            return
        ms = waited_s * 1000
        self.queued[api_key] += 1
        self.queue_ms_sum[api_key] += ms
        buckets = self.queue_buckets[api_key]
        if buckets is None:
            buckets = self.queue_buckets[api_key] = [0] * (len(REQUEST_BUCKETS_MS) + 1)
        buckets[bisect.bisect_left(REQUEST_BUCKETS_MS, ms)] += 1

    def answered(self, api_key: int, response: Any) -> None:
        """Failed partitions of a Produce or Fetch response, per topic (FailedProduceRequestsPerSec,
        FailedFetchRequestsPerSec). As Kafka, errors that only send the client elsewhere are not failures."""
        which = api_key  # 0 = produce, 1 = fetch
        expected = _EXPECTED_PRODUCE_ERRORS if which == 0 else _EXPECTED_FETCH_ERRORS
        for t in response.responses:
            name = getattr(t, "name", None) if which == 0 else t.topic
            for p in t.partition_responses if which == 0 else t.partitions:
                code = p.error_code
                if code and code not in expected:
                    c = self.failed.get(name or "")
                    if c is None:
                        c = self.failed[name or ""] = [0, 0]
                    c[which] += 1

    def answered_produce(self, answers: Any) -> None:
        """answered() for the direct Produce path's answers: [(topic, [(partition, error_code, ...)])]."""
        for name, parts in answers:
            for part in parts:
                code = part[1]
                if code and code not in _EXPECTED_PRODUCE_ERRORS:
                    c = self.failed.get(name)
                    if c is None:
                        c = self.failed[name] = [0, 0]
                    c[0] += 1

    def produced(self, topic: str, messages: int, nbytes: int) -> None:
        c = self.topic_in.get(topic)
        if c is None:
            c = self.topic_in[topic] = [0, 0]
        c[0] += messages
        c[1] += nbytes

    def fetched(self, response: Any) -> None:
        """Bytes of record data in a fetch response that goes out (Kafka's BytesOutPerSec)."""
        out = self.topic_out
        for t in response.responses:
            n = 0
            for p in t.partitions:
                r = p.records
                if r:
                    n += r.size if hasattr(r, "size") else len(r)
            if n:
                c = out.get(t.topic)
                if c is None:
                    c = out[t.topic] = [0]
                c[0] += n


# Kafka's ReplicaManager answers these without marking the failed-request meters: they route the client elsewhere
# (or say that its data is too large or gone), they are not the broker failing.
_EXPECTED_PRODUCE_ERRORS = frozenset({3, 6, 2, 10, 18, 56})  # UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER,
# CORRUPT_MESSAGE, MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE, KAFKA_STORAGE_ERROR
_EXPECTED_FETCH_ERRORS = frozenset({3, 6, 1, 9, 56, 74, 75, 100, 103})  # ..., OFFSET_OUT_OF_RANGE,
# REPLICA_NOT_AVAILABLE, KAFKA_STORAGE_ERROR, FENCED_/UNKNOWN_LEADER_EPOCH, UNKNOWN_TOPIC_ID, INCONSISTENT_TOPIC_ID


class IsrChanges:
    """ISR shrinks and expansions committed on partitions led here (ReplicaManager IsrShrinksPerSec,
    IsrExpandsPerSec): counted under the partition's lock, read by the exporter; each value one int."""

    shrinks = 0
    expands = 0

    @classmethod
    def record(cls, old: tuple[int, ...], new: tuple[int, ...]) -> None:
        if set(new) < set(old):
            cls.shrinks += 1
        elif set(new) > set(old):
            cls.expands += 1
        elif set(new) != set(old):  # a replacement: one out, one in
            cls.shrinks += 1
            cls.expands += 1


_local = threading.local()
_shards: list[tuple[str, Shard]] = []
_shards_lock = threading.Lock()


def shard() -> Shard:
    """This thread's shard (created and registered on first use; after that one attribute lookup)."""
    try:
        return _local.shard  # type: ignore[no-any-return]
    except AttributeError:
        s = _local.shard = Shard()
        with _shards_lock:
            _shards.append((threading.current_thread().name, s))
        return s


def _api_name(api_key: int) -> str:
    cls = codec.REQUESTS.get(api_key)
    return cls.__name__.removesuffix("Request") if cls is not None else str(api_key)


def _topic_sums(shards: list[tuple[str, Shard]]) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    msgs: dict[str, int] = {}
    bytes_in: dict[str, int] = {}
    bytes_out: dict[str, int] = {}
    for _, s in shards:
        for topic, (m, b) in list(s.topic_in.items()):
            msgs[topic] = msgs.get(topic, 0) + m
            bytes_in[topic] = bytes_in.get(topic, 0) + b
        for topic, (b,) in list(s.topic_out.items()):
            bytes_out[topic] = bytes_out.get(topic, 0) + b
    return msgs, bytes_in, bytes_out


def topic_totals() -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Records in, bytes in and bytes out per topic since start-up: the BrokerTopicMetrics counters, summed over
    every thread's shard (for readers other than the exporter, such as the web console's charts)."""
    with _shards_lock:
        shards = list(_shards)
    return _topic_sums(shards)


class KafkaCollector:
    """prometheus_client collector: every family computed at scrape time from the shards and the server."""

    def __init__(self, server: KafkaServer) -> None:
        self.server = server
        self._idle_marks: dict[str, tuple[float, float]] = {}  # thread -> (wall time, busy_s) at the last scrape
        # (scrape time, api key -> TotalTimeMs bucket counts): the window the percentiles are computed over
        self._latency_marks: collections.deque[tuple[float, dict[int, list[int]]]] = collections.deque()
        self._started = time.monotonic()

    def describe(self) -> list[Any]:
        return []  # no fixed set of families: do not let the registry call collect() at registration

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with _shards_lock:
            shards = list(_shards)
        yield from self._topic_families(shards, CounterMetricFamily)
        yield from self._request_families(shards, CounterMetricFamily)
        yield from self._percentile_families(shards)
        yield from self._failed_families(shards, CounterMetricFamily)
        yield from self._network_families(shards, GaugeMetricFamily)
        yield from self._log_families(GaugeMetricFamily)
        yield from self._fetch_session_families(GaugeMetricFamily, CounterMetricFamily)
        yield from self._group_families(GaugeMetricFamily)

    # -- BrokerTopicMetrics ------------------------------------------------------------------------------------

    @staticmethod
    def _topic_families(shards: list[tuple[str, Shard]], Counter: Any) -> Iterator[Any]:
        msgs, bytes_in, bytes_out = _topic_sums(shards)
        for name, doc, values in (
            ("kafka_server_brokertopicmetrics_messagesin", "Records appended, per topic", msgs),
            ("kafka_server_brokertopicmetrics_bytesin", "Record bytes produced, per topic", bytes_in),
            ("kafka_server_brokertopicmetrics_bytesout", "Record bytes fetched, per topic", bytes_out),
        ):
            fam = Counter(name, doc, labels=["topic"])
            for topic in sorted(values):
                fam.add_metric([topic], values[topic])
            yield fam

    # -- RequestMetrics ----------------------------------------------------------------------------------------

    @staticmethod
    def _request_families(shards: list[tuple[str, Shard]], Counter: Any) -> Iterator[Any]:
        from prometheus_client.core import HistogramMetricFamily

        requests = Counter("kafka_network_requestmetrics_requests", "Requests answered, per API", labels=["request"])
        queue = HistogramMetricFamily("kafka_network_requestmetrics_requestqueuetimems",
                                      "Time a request waited behind another on its connection, ms, per API",
                                      labels=["request"])
        for key in range(_NUM_API_KEYS):
            count = sum(s.requests[key] for _, s in shards)
            if not count:
                continue
            name = _api_name(key)
            requests.add_metric([name], count)
            # TotalTimeMs: see _percentile_families.
            # RequestQueueTimeMs: the requests not queued behind another waited 0 ms (the first bucket).
            queued = sum(s.queued[key] for _, s in shards)
            qbuckets = [0] * (len(REQUEST_BUCKETS_MS) + 1)
            qbuckets[0] = max(0, count - queued)
            for _, s in shards:
                b = s.queue_buckets[key]
                if b is not None:
                    for i, v in enumerate(b):
                        qbuckets[i] += v
            queue.add_metric([name], _cumulative(REQUEST_BUCKETS_MS, qbuckets), sum(s.queue_ms_sum[key]
                                                                                     for _, s in shards))
        yield requests
        yield queue

    def _percentile_families(self, shards: list[tuple[str, Shard]]) -> Iterator[Any]:
        """TotalTimeMs' percentiles over the last minutes, as the JMX exporter's Kafka rules expose a Histogram
        MBean's 50th..999thPercentile attributes: kafka_network_requestmetrics_totaltimems{quantile="0.99"}.
        The series share their family name with the latency histogram's _bucket/_sum/_count, so the family is a
        summary (quantiles, _sum, _count) and the buckets are their own family, kafka_..._totaltimems_bucket:
        every series name the histogram had stays, and both kinds of dashboards find theirs."""
        from prometheus_client.core import GaugeMetricFamily, SummaryMetricFamily
        from prometheus_client.samples import Sample

        now = time.monotonic()
        current: dict[int, list[int]] = {}
        summary = SummaryMetricFamily("kafka_network_requestmetrics_totaltimems",
                                      "Time from request decode to response encoded, ms, per API: percentiles of "
                                      "the last minutes", labels=["request"])
        buckets_fam = GaugeMetricFamily("kafka_network_requestmetrics_totaltimems_bucket",
                                        "Cumulative count of requests at most `le` ms, per API (histogram buckets)",
                                        labels=["request", "le"])
        for key in range(_NUM_API_KEYS):
            count = sum(s.requests[key] for _, s in shards)
            if not count:
                continue
            buckets = [0] * (len(REQUEST_BUCKETS_MS) + 1)
            for _, s in shards:
                b = s.time_buckets[key]
                if b is not None:
                    for i, v in enumerate(b):
                        buckets[i] += v
            current[key] = buckets
            name = _api_name(key)
            for le, n in _cumulative(REQUEST_BUCKETS_MS, buckets):
                buckets_fam.add_metric([name, le], n)
            # The window: the oldest snapshot kept (up to PERCENTILE_WINDOW_S old), or since start-up.
            base = self._latency_marks[0][1].get(key) if self._latency_marks else None
            window = [b - (base[i] if base else 0) for i, b in enumerate(buckets)]
            total_ms = sum(s.time_ms_sum[key] for _, s in shards)
            summary.add_metric([name], count_value=count, sum_value=total_ms)
            for q in PERCENTILES:
                summary.samples.append(Sample("kafka_network_requestmetrics_totaltimems",
                                              {"request": name, "quantile": q},
                                              _quantile(REQUEST_BUCKETS_MS, window, float(q))))
        self._latency_marks.append((now, current))
        while len(self._latency_marks) > 1 and now - self._latency_marks[1][0] >= PERCENTILE_WINDOW_S:
            self._latency_marks.popleft()
        yield summary
        yield buckets_fam

    @staticmethod
    def _failed_families(shards: list[tuple[str, Shard]], Counter: Any) -> Iterator[Any]:
        produce = Counter("kafka_server_brokertopicmetrics_failedproducerequests",
                          "Produce partitions that failed, per topic", labels=["topic"])
        fetch = Counter("kafka_server_brokertopicmetrics_failedfetchrequests",
                        "Fetch partitions that failed, per topic", labels=["topic"])
        sums: dict[str, list[int]] = {}
        for _, s in shards:
            for topic, (p, f) in list(s.failed.items()):
                c = sums.setdefault(topic, [0, 0])
                c[0] += p
                c[1] += f
        for topic in sorted(sums):
            produce.add_metric([topic], sums[topic][0])
            fetch.add_metric([topic], sums[topic][1])
        yield produce
        yield fetch

    # -- SocketServer, RequestChannel --------------------------------------------------------------------------

    def _network_families(self, shards: list[tuple[str, Shard]], Gauge: Any) -> Iterator[Any]:
        processors = self.server.socket_server.processors
        queue = Gauge("kafka_network_requestchannel_requestqueuesize",
                      "Requests waiting behind one in flight on their connection")
        conns = Gauge("kafka_server_socket_server_metrics_connection_count", "Open connections",
                      labels=["listener", "networkProcessor"])
        idle = Gauge("kafka_network_processor_idlepercent",
                     "Share of time a network processor did not spend handling requests since the last scrape",
                     labels=["networkProcessor"])
        queued = 0
        by_thread = dict(shards)
        now = time.monotonic()
        ratios = []
        for p in processors:
            counts: dict[str, int] = {}
            for c in list(p.connections.values()):
                counts[c.listener_name] = counts.get(c.listener_name, 0) + 1
                queued += len(c._pending)  # a deque's len: safe to read from another thread
            for listener in sorted(counts):
                conns.add_metric([listener, str(p.index)], counts[listener])
            s = by_thread.get(p.name)
            busy = s.busy_s if s is not None else 0.0
            last_wall, last_busy = self._idle_marks.get(p.name, (self._started, 0.0))
            wall = now - last_wall
            ratio = 1.0 if wall <= 0 else min(1.0, max(0.0, 1.0 - (busy - last_busy) / wall))
            self._idle_marks[p.name] = (now, busy)
            idle.add_metric([str(p.index)], ratio)
            ratios.append(ratio)
        queue.add_metric([], queued)
        avg = Gauge("kafka_network_socketserver_networkprocessoravgidlepercent",
                    "Average idle share of the network processors")
        avg.add_metric([], sum(ratios) / len(ratios) if ratios else 1.0)
        yield queue
        yield conns
        yield idle
        yield avg

    # -- Log, LogFlushStats, ReplicaManager, KafkaController ---------------------------------------------------

    def _is_controller(self) -> bool:
        try:
            return bool(self.server.controller_id() == self.server.broker_id)
        except Exception:  # noqa: BLE001 - no controller known (ZooKeeper unreachable): not this broker
            return False

    def _log_families(self, Gauge: Any) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily as Counter
        from prometheus_client.core import HistogramMetricFamily

        labels = ["topic", "partition"]
        size = Gauge("kafka_log_log_size", "Bytes of the partition's log segments", labels=labels)
        segments = Gauge("kafka_log_log_numlogsegments", "Segments of the partition's log", labels=labels)
        leo = Gauge("kafka_log_log_logendoffset", "Log end offset", labels=labels)
        start = Gauge("kafka_log_log_logstartoffset", "Log start offset", labels=labels)
        producers = 0
        logs = []
        log_manager = getattr(self.server, "log_manager", None)
        if log_manager is not None:
            logs = sorted(log_manager.logs(), key=lambda lg: (lg.topic, lg.partition))
        for lg in logs:
            key = [lg.topic, str(lg.partition)]
            segs = lg.segments
            size.add_metric(key, sum(s.size for s in segs))
            segments.add_metric(key, len(segs))
            leo.add_metric(key, lg.log_end_offset)
            start.add_metric(key, lg.log_start_offset)
            producers += len(lg.producer_state)
        yield from (size, segments, leo, start)
        offline_dirs = Gauge("kafka_log_logmanager_offlinelogdirectorycount", "Log dirs that failed")
        offline_dirs.add_metric([], len(log_manager.offline_dirs) if log_manager is not None else 0)
        offline_replicas = Gauge("kafka_server_replicamanager_offlinereplicacount", "Replicas in failed log dirs")
        offline_replicas.add_metric([], len(log_manager.offline_partitions) if log_manager is not None else 0)
        yield from (offline_dirs, offline_replicas)
        pids = Gauge("kafka_server_replicamanager_produceridcount", "Producer ids with state in this broker's logs")
        pids.add_metric([], producers)
        partitions = Gauge("kafka_server_replicamanager_partitioncount", "Partitions on this broker")
        partitions.add_metric([], len(logs))
        # Kafka's UnderReplicatedPartitions: led here with an ISR smaller than the replica set.
        under = Gauge("kafka_server_replicamanager_underreplicatedpartitions", "Partitions with replicas out of sync")
        rm = getattr(self.server, "replica_manager", None)
        under.add_metric([], rm.under_replicated_count() if rm is not None else 0)
        leaders = Gauge("kafka_server_replicamanager_leadercount", "Partitions led by this broker")
        under_min = Gauge("kafka_server_replicamanager_underminisrpartitioncount",
                          "Partitions led here whose ISR is smaller than their min.insync.replicas")
        led = [p for p in list(rm.partitions.values()) if p.is_leader] if rm is not None else []
        # Partitions without replication state (the embedded single node) are led here when their log is.
        leaders.add_metric([], len(led) if rm is not None and rm.partitions else len(logs))
        under_min.add_metric([], sum(1 for p in led if len(p.isr) < rm.min_insync_replicas(p.topic))
                             if rm is not None else 0)
        shrinks = Counter("kafka_server_replicamanager_isrshrinks", "ISR shrinks of partitions led here")
        shrinks.add_metric([], IsrChanges.shrinks)
        expands = Counter("kafka_server_replicamanager_isrexpands", "ISR expansions of partitions led here")
        expands.add_metric([], IsrChanges.expands)
        # Controller gauges, as Kafka: non-zero only on the controller. A single node names itself controller, and
        # the standard alert sum(activecontrollercount) != 1 expects exactly that.
        controller = getattr(self.server, "controller", None)
        active = self._is_controller()
        offline = Gauge("kafka_controller_kafkacontroller_offlinepartitionscount", "Partitions without a leader")
        offline.add_metric([], controller.offline_partitions if active and controller is not None else 0)
        active_count = Gauge("kafka_controller_kafkacontroller_activecontrollercount",
                             "1 on the broker that is the controller")
        active_count.add_metric([], 1 if active else 0)
        yield from (pids, partitions, under, leaders, under_min, shrinks, expands, offline, active_count)
        count, sum_ms, buckets = FLUSH_STATS.snapshot()
        flush = HistogramMetricFamily("kafka_log_logflushstats_logflushrateandtimems", "Log flush (fsync) time, ms")
        flush.add_metric([], _cumulative(FLUSH_BUCKETS_MS, buckets), sum_ms)
        yield flush

    # -- FetchSessionCache (KIP-227) ---------------------------------------------------------------------------

    def _fetch_session_families(self, Gauge: Any, Counter: Any) -> Iterator[Any]:
        manager = getattr(self.server, "fetch_manager", None)
        if manager is None:
            return
        cache = manager.cache  # each value one int, read without the cache's lock
        sessions = Gauge("kafka_server_fetchsessioncache_numincrementalfetchsessions", "Incremental fetch sessions")
        sessions.add_metric([], cache.size)
        partitions = Gauge("kafka_server_fetchsessioncache_numincrementalfetchpartitionscached",
                           "Partitions in all incremental fetch sessions")
        partitions.add_metric([], cache.total_partitions)
        evictions = Counter("kafka_server_fetchsessioncache_incrementalfetchsessionevictions",
                            "Fetch sessions evicted to make room for another")
        evictions.add_metric([], cache.evictions)
        yield from (sessions, partitions, evictions)
        rm = getattr(self.server, "replica_manager", None)
        if rm is not None:
            # Kafka's DelayedOperationPurgatory gauges of the Fetch purgatory (parked Fetches, idle plans' watches).
            entries, waiters = rm.purgatory.size()
            size = Gauge("kafka_server_delayedoperationpurgatory_purgatorysize", "Watch entries in the purgatory",
                         labels=["delayedOperation"])
            size.add_metric(["Fetch"], entries)
            delayed = Gauge("kafka_server_delayedoperationpurgatory_numdelayedoperations",
                            "Operations waiting in the purgatory", labels=["delayedOperation"])
            delayed.add_metric(["Fetch"], waiters)
            yield from (size, delayed)

    # -- consumer groups (named as kafka_exporter names them: the broker has no lag MBean) ----------------------

    def _group_families(self, Gauge: Any) -> Iterator[Any]:
        labels = ["consumergroup", "topic", "partition"]
        current = Gauge("kafka_consumergroup_current_offset", "Committed offset per group and partition", labels=labels)
        lag = Gauge("kafka_consumergroup_lag", "High watermark minus committed offset", labels=labels)
        rows = self._committed_offsets()
        rm = self.server.replica_manager
        for group, topic, partition, offset in sorted(rows):
            key = [group, topic, str(partition)]
            current.add_metric(key, offset)
            try:
                hw = rm.get_log(topic, partition).high_watermark
            except Exception:  # noqa: BLE001 - a deleted topic's offsets linger until expiry: no lag to show
                continue
            lag.add_metric(key, max(0, hw - offset))
        yield current
        yield lag

    def _committed_offsets(self) -> list[tuple[str, str, int, int]]:
        gc = self.server.group_coordinator
        loop = gc.loop
        if not loop.is_running():
            return []

        async def snapshot() -> list[tuple[str, str, int, int]]:
            return [(g.group_id, tp[0], tp[1], o.offset) for g in gc.groups.values() for tp, o in g.offsets.items()]

        try:
            return asyncio.run_coroutine_threadsafe(snapshot(), loop).result(5)
        except Exception as e:  # noqa: BLE001 - a scrape without group lag beats a failed scrape
            log.warning("Metrics scrape: could not read committed offsets from the group coordinator: %s", e)
            return []


def _quantile(bounds: tuple[float, ...], counts: list[int], q: float) -> float:
    """The q-quantile of bucketed samples, interpolated linearly inside its bucket (as Prometheus'
    histogram_quantile); the +Inf bucket answers its lower bound. NaN without samples, as an empty reservoir."""
    total = sum(counts)
    if total <= 0:
        return float("nan")
    rank = q * total
    running = 0
    for i, n in enumerate(counts):
        if n and running + n >= rank:
            lo = bounds[i - 1] if i > 0 else 0.0
            if i >= len(bounds):
                return float(bounds[-1])
            return lo + (bounds[i] - lo) * (rank - running) / n
        running += n
    return float(bounds[-1])


def _cumulative(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    out, running = [], 0
    for bound, n in zip((*bounds, float("inf")), counts, strict=True):
        running += n
        out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
    return out


def metrics_host(config: Any) -> str:
    """metrics.host, or when unset the host of the broker's first listener: a broker on loopback does not publish
    its metrics on every interface."""
    host = config["metrics.host"]
    if host is not None:
        return str(host)
    listeners = config.listeners
    return str(listeners[0].host).strip("[]") if listeners and listeners[0].host else "0.0.0.0"


class MetricsExporter:
    """The HTTP endpoint on metrics.host:metrics.port (prometheus_client's server on a daemon thread)."""

    def __init__(self, server: KafkaServer) -> None:
        self.server = server
        self._httpd: Any = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    def start(self) -> None:
        from prometheus_client import (
            CollectorRegistry,
            GCCollector,
            PlatformCollector,
            ProcessCollector,
            start_http_server,
        )

        registry = CollectorRegistry(auto_describe=False)
        registry.register(KafkaCollector(self.server))  # type: ignore[arg-type]
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, python_gc_*, python_info
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        host = metrics_host(self.server.config)
        port = self.server.config["metrics.port"]
        try:
            self._httpd, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as e:
            raise OSError(e.errno, f"cannot bind metrics.port to {host}:{port}: {e.strerror}") from None
        self.port = self._httpd.server_address[1]
        log.info("Serving Prometheus metrics on http://%s:%d/metrics", host, self.port)

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

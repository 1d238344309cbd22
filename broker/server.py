"""KafkaServer: wires the metadata store, log manager, request handlers and socket server together."""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from kbroker.broker import produce_codec
from kbroker.broker.admin_manager import AdminManager
from kbroker.broker.apis import KafkaApis
from kbroker.broker.config import KafkaConfig
from kbroker.broker.controller_channel import ControllerChannelManager
from kbroker.broker.fetch_session import FetchManager, FetchSessionCache
from kbroker.broker.handlers import all_handlers
from kbroker.broker.inter_broker import InterBrokerChannel
from kbroker.broker.metadata_answers import MetadataAnswers
from kbroker.broker.metrics import MetricsExporter
from kbroker.broker.network import SocketServer
from kbroker.broker.quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    ClientQuotaManager,
    RequestQuotaManager,
)
from kbroker.broker.replica_manager import ReplicaManager
from kbroker.broker.security.acls_store import LocalAclStore, ZkAclStore
from kbroker.broker.security.authorizer import AclAuthorizer
from kbroker.broker.security.client import ClientSecurity, inter_broker_listener
from kbroker.broker.security.credentials import LocalScramStore, ScramCredentialStore, ZkScramStore
from kbroker.broker.security.listener import listener_security
from kbroker.broker.share_partition_manager import ShareGroupLoading
from kbroker.broker.txn_marker_channel import TxnMarkerChannel
from kbroker.broker.txn_verification import TxnVerifier
from kbroker.coordinator.consumer_group_assignors import CLASS_NAMES
from kbroker.coordinator.controller import ControllerConfig, KafkaController
from kbroker.coordinator.group_coordinator import OFFSETS_TOPIC, GroupConfig, GroupCoordinator
from kbroker.coordinator.group_metadata_hash import topics_hash
from kbroker.coordinator.metadata_store import LocalMetadataStore, TopicRecord
from kbroker.coordinator.producer_ids import LocalBlockSource, ProducerIdManager
from kbroker.coordinator.transaction_coordinator import (
    TRANSACTION_STATE_TOPIC,
    TransactionCoordinator,
    TxnConfig,
)
from kbroker.coordinator.zk_store import ZkMetadataStore
from kbroker.protocol import codec, framing, record_walk, records
from kbroker.protocol.errors import ErrorCode, KafkaError
from kbroker.protocol.messages import ControlledShutdownRequest
from kbroker.storage.config import LogConfig
from kbroker.storage.manager import LogManager

if TYPE_CHECKING:
    from kbroker.console.server import ConsoleServer
    from kbroker.schema_registry.server import SchemaRegistryServer

log = logging.getLogger("kbroker.server")


def segment_file_budget() -> int:
    """Half the open-files limit for segment files (opened lazily, least recently used closed first); the
    other half stays for connections, sockets and everything else."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(64, soft // 2)


CONSUMER_GROUP_APIS = (68, 69)
STREAMS_GROUP_APIS = (88, 89)


class KafkaServer:
    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.metadata: LocalMetadataStore | ZkMetadataStore
        if config["zookeeper.connect"]:
            self.metadata = ZkMetadataStore(config)
            self.metadata.on_topic_removed = self._on_topic_removed
            self.metadata.on_topic_changed = self._on_topic_changed
            self.metadata.on_broker_configs_changed = self.apply_dynamic_configs
        else:
            self.metadata = LocalMetadataStore(config.log_dirs[0], self.broker_id)
        self.io_pool = ThreadPoolExecutor(config["num.io.threads"], thread_name_prefix="kafka-io")
        # None without authorizer.class.name: handlers then skip every authorization check.
        self.authorizer: AclAuthorizer | None = None
        if config["authorizer.class.name"]:
            metadata = self.metadata
            acl_store = (ZkAclStore(metadata.zk_client) if isinstance(metadata, ZkMetadataStore)
                         else LocalAclStore(config.log_dirs[0]))
            self.authorizer = AclAuthorizer(acl_store, config["super.users"],
                                            config["allow.everyone.if.no.acl.found"])
        self.log_manager: LogManager
        self.admin = AdminManager(self)
        self.replica_manager = ReplicaManager(self, self.io_pool)
        self.producer_ids = ProducerIdManager(
            self.metadata.producer_id_block_source()
            if isinstance(self.metadata, ZkMetadataStore)
            else LocalBlockSource(config.log_dirs[0], self.broker_id)
        )
        self.produce_quota = ClientQuotaManager(
            PRODUCER_BYTE_RATE, lambda: self.metadata.client_quotas,
            config["quota.window.num"], config["quota.window.size.seconds"],
        )
        self.fetch_quota = ClientQuotaManager(
            CONSUMER_BYTE_RATE, lambda: self.metadata.client_quotas,
            config["quota.window.num"], config["quota.window.size.seconds"],
        )
        self.request_quota = RequestQuotaManager(
            lambda: self.metadata.client_quotas, config["quota.window.num"], config["quota.window.size.seconds"],
        )
        # KIP-227 fetch sessions, shared by every network processor (a session outlives its connection).
        self.fetch_manager = FetchManager(FetchSessionCache(config["max.incremental.fetch.session.cache.slots"]))
        self.scram_credentials: ScramCredentialStore = (
            ZkScramStore(self.metadata) if isinstance(self.metadata, ZkMetadataStore)
            else LocalScramStore(config.log_dirs[0])
        )
        self.apis = KafkaApis(self, [
            h for h in all_handlers()
            # ConsumerGroupHeartbeat / ConsumerGroupDescribe exist only with the consumer rebalance protocol on.
            if (h.api_key not in CONSUMER_GROUP_APIS or "consumer" in config["group.coordinator.rebalance.protocols"])
            and (h.api_key not in STREAMS_GROUP_APIS or "streams" in config["group.coordinator.rebalance.protocols"])
        ])
        self.socket_server = SocketServer(config, self.apis, listener_security(config, self.scram_credentials))
        self.group_coordinator = GroupCoordinator(self, GroupConfig(
            num_partitions=config["offsets.topic.num.partitions"],
            initial_rebalance_delay_ms=config["group.initial.rebalance.delay.ms"],
            min_session_timeout_ms=config["group.min.session.timeout.ms"],
            max_session_timeout_ms=config["group.max.session.timeout.ms"],
            max_size=config["group.max.size"],
            offsets_retention_ms=config["offsets.retention.minutes"] * 60000,
            offsets_retention_check_ms=config["offsets.retention.check.interval.ms"],
            offset_metadata_max_bytes=config["offset.metadata.max.bytes"],
            consumer_session_timeout_ms=config["group.consumer.session.timeout.ms"],
            consumer_heartbeat_interval_ms=config["group.consumer.heartbeat.interval.ms"],
            consumer_max_size=config["group.consumer.max.size"],
            consumer_assignors=[CLASS_NAMES.get(a, a) for a in config["group.consumer.assignors"]],
            consumer_migration_policy=config["group.consumer.migration.policy"],
            streams_session_timeout_ms=config["group.streams.session.timeout.ms"],
            streams_heartbeat_interval_ms=config["group.streams.heartbeat.interval.ms"],
            streams_max_size=config["group.streams.max.size"],
            streams_num_standby_replicas=config["group.streams.num.standby.replicas"],
            streams_initial_rebalance_delay_ms=config["group.streams.initial.rebalance.delay.ms"],
        ), loop=self.socket_server.processors[0].loop)
        self.group_coordinator.share_hooks = ShareGroupLoading(self)
        ib_listener = inter_broker_listener(config)
        self.inter_broker = InterBrokerChannel(
            self.broker_id, self._inter_broker_endpoint, config["request.timeout.ms"],
            ClientSecurity(config, ib_listener) if config.security_protocol(ib_listener) != "PLAINTEXT" else None)
        self.txn_markers = TxnMarkerChannel(self)
        self.txn_verifier = TxnVerifier(self)
        self.txn_coordinator = TransactionCoordinator(self, TxnConfig(
            num_partitions=config["transaction.state.log.num.partitions"],
            max_timeout_ms=config["transaction.max.timeout.ms"],
            transactional_id_expiration_ms=config["transactional.id.expiration.ms"],
            abort_timed_out_interval_ms=config["transaction.abort.timed.out.transaction.cleanup.interval.ms"],
            remove_expired_interval_ms=config["transaction.remove.expired.transaction.cleanup.interval.ms"],
            segment_bytes=config["transaction.state.log.segment.bytes"],
            load_buffer_size=config["transaction.state.log.load.buffer.size"],
            # The embedded single node has one replica per partition: it cannot ask for more in-sync replicas.
            replication_factor=config["transaction.state.log.replication.factor"] if config["zookeeper.connect"] else 1,
            min_isr=config["transaction.state.log.min.isr"] if config["zookeeper.connect"] else 1,
        ), loop=self.socket_server.processors[0].loop)
        # LeaderAndIsr, UpdateMetadata and StopReplica are applied one at a time, in arrival order.
        self.controller_requests = ThreadPoolExecutor(1, thread_name_prefix="controller-requests")
        self.controller: KafkaController | None = None
        if isinstance(self.metadata, ZkMetadataStore):
            self.inter_broker.controller_of = lambda: self.metadata.current_controller  # type: ignore[union-attr]
            channel = self.controller_channel = ControllerChannelManager(self.inter_broker)
            store = self.metadata
            self.controller = KafkaController(
                self.broker_id, store, channel.send,
                lambda b: (store.broker_listeners(b), store.broker_rack(b)),
                ControllerConfig(
                    unclean_leader_election=config["unclean.leader.election.enable"],
                    auto_leader_rebalance=config["auto.leader.rebalance.enable"],
                    leader_imbalance_check_interval_s=float(config["leader.imbalance.check.interval.seconds"]),
                    leader_imbalance_per_broker_percentage=config["leader.imbalance.per.broker.percentage"],
                ),
                on_broker_gone=channel.remove_broker,
            )
            channel.on_response = self.controller.on_broker_response
        self._stopped = asyncio.Event()
        self.metrics_exporter: MetricsExporter | None = None
        self.console: ConsoleServer | None = None
        self.schema_registry: SchemaRegistryServer | None = None
        if config["schema.registry.listeners"]:
            # Built here so a registry setting the broker cannot serve stops start-up with one line (ConfigError).
            from kbroker.schema_registry.server import SchemaRegistryServer

            self.schema_registry = SchemaRegistryServer(self)
        self._ids_cache: tuple[dict[str, TopicRecord], dict[bytes, str]] | None = None
        self.metadata_answers = MetadataAnswers()

    def advertised_endpoints(self) -> dict[str, tuple[str, int]]:
        """Listener name -> the host:port clients are told, with the bound port when configured as 0."""
        out: dict[str, tuple[str, int]] = {}
        for adv in self.config.advertised_listeners:
            host, port = adv.host, adv.port
            bound = self.socket_server.bound.get(adv.name)
            if bound is not None:
                if port == 0:
                    port = bound[1]
                if not host or host in ("0.0.0.0", "::"):
                    host = bound[0] if bound[0] not in ("0.0.0.0", "::") else "localhost"
            out[adv.name] = (host, port)
        return out

    def advertised_endpoint(self, listener: str | None = None) -> tuple[str, int]:
        endpoints = self.advertised_endpoints()
        if listener is not None and listener in endpoints:
            return endpoints[listener]
        return next(iter(endpoints.values()))

    async def startup(self) -> None:
        t0 = time.monotonic()
        loop = asyncio.get_running_loop()
        self.metadata.start()
        self.scram_credentials.start()
        if self.authorizer is not None:
            await loop.run_in_executor(None, self.authorizer.start)
        base = self.admin.base_log_config()
        c = self.config
        self.log_manager = LogManager(
            c.log_dirs,
            base,
            retention_check_interval_ms=c["log.retention.check.interval.ms"],
            flush_check_interval_ms=c["log.flush.scheduler.interval.ms"],
            flush_offset_checkpoint_interval_ms=c["log.flush.offset.checkpoint.interval.ms"],
            cleaner_enabled=c["log.cleaner.enable"],
            cleaner_backoff_ms=c["log.cleaner.backoff.ms"],
            topic_config=self._topic_log_config,
            producer_id_expiration_ms=c["producer.id.expiration.ms"],
            # Replicated brokers keep high watermarks across restarts; the single node has no followers.
            high_watermark_checkpoint_interval_ms=(c["replica.high.watermark.checkpoint.interval.ms"]
                                                   if c["zookeeper.connect"] else None),
            max_open_segment_files=segment_file_budget(),
        )
        await loop.run_in_executor(None, self.log_manager.startup)
        self.replica_manager.attach_log_manager(self.log_manager)
        await loop.run_in_executor(None, self._claim_first_producer_id_block)
        self.apply_dynamic_configs()
        self.log_manager.start_background()
        offsets = self.metadata.topics.get(OFFSETS_TOPIC)
        self.group_coordinator.config.num_partitions = (
            offsets.num_partitions if offsets else self.config["offsets.topic.num.partitions"]
        )
        self.group_coordinator.start(
            [p for p in range(offsets.num_partitions) if offsets.leaders[p] == self.broker_id] if offsets else []
        )
        self.inter_broker.start()
        txn_state = self.metadata.topics.get(TRANSACTION_STATE_TOPIC)
        self.txn_coordinator.config.num_partitions = (
            txn_state.num_partitions if txn_state else self.config["transaction.state.log.num.partitions"]
        )
        self.txn_coordinator.start(
            [p for p in range(txn_state.num_partitions) if txn_state.leaders[p] == self.broker_id] if txn_state else []
        )
        if self.controller is not None:
            self.controller.start()  # before registering: the election may make this broker the controller
        self.socket_server.start_processors()
        self.socket_server.bind(loop)
        if self.config["metrics.port"] is not None:
            self.metrics_exporter = MetricsExporter(self)
            self.metrics_exporter.start()
        if self.config["console.listeners"]:
            # Imported here: only a broker with a console pays for importing it.
            from kbroker.console.server import ConsoleServer

            self.console = ConsoleServer(self)
            self.console.start()
        if self.schema_registry is not None:
            self.schema_registry.start()
        host, port = self.advertised_endpoint()
        await loop.run_in_executor(None, self.metadata.register_broker, self.advertised_endpoints())
        log.info(
            "kbroker %d started in %.2f s: cluster %s, %d topics, advertised %s:%d, codec %s, record walk %s, "
            "batch scan %s, produce path %s, framing %s",
            self.broker_id, time.monotonic() - t0, self.metadata.cluster_id, len(self.metadata.topics), host, port,
            codec.IMPLEMENTATION, record_walk.IMPLEMENTATION, records.SCAN_IMPLEMENTATION,
            produce_codec.IMPLEMENTATION, framing.IMPLEMENTATION,
        )

    def _claim_first_producer_id_block(self) -> None:
        try:
            self.producer_ids.start()
        except Exception as e:  # noqa: BLE001  (InitProducerId claims one on demand instead)
            log.warning("Could not claim a producer id block at startup: %s", e)

    def _topic_log_config(self, topic: str) -> LogConfig | None:
        rec = self.metadata.topics.get(topic)
        return None if rec is None else self.admin.log_config_for(rec)

    def apply_dynamic_configs(self) -> None:
        """After a change of the dynamic broker configs: the topics' defaults and the log manager's settings."""
        dynamic = self.metadata.broker_configs
        self.log_manager.producer_id_expiration_ms = self.config.effective("producer.id.expiration.ms", dynamic)
        self.log_manager.cleaner.backoff_ms = self.config.effective("log.cleaner.backoff.ms", dynamic)
        for rec in list(self.metadata.topics.values()):
            self.log_manager.update_topic_config(rec.name, self.admin.log_config_for(rec))

    # Changes other brokers made through ZooKeeper (called on kazoo's threads).

    def _on_topic_removed(self, rec: TopicRecord) -> None:
        for p in range(rec.num_partitions):
            self.log_manager.delete_log(rec.name, p)
            self.replica_manager.purgatory.notify((rec.name, p))
        self.forget_group_offsets(rec.name, rec.num_partitions)

    def forget_group_offsets(self, topic: str, partitions: int) -> None:
        """A deleted topic's committed offsets leave every group this broker coordinates (Kafka's
        onPartitionsDeleted); a topic created again later under the name starts without them."""
        if topic == OFFSETS_TOPIC:
            return
        gc = self.group_coordinator
        work = gc.on_partitions_deleted([(topic, p) for p in range(partitions)])
        try:
            done = asyncio.run_coroutine_threadsafe(work, gc.loop)
        except RuntimeError:  # the coordinator's loop is closed: the broker is stopping
            work.close()
            return
        done.add_done_callback(lambda f: f.cancelled() or f.exception() is None
                               or log.error("Forgetting the offsets of deleted topic %s failed: %s", topic,
                                            f.exception()))

    def _on_topic_changed(self, rec: TopicRecord) -> None:
        self.log_manager.update_topic_config(rec.name, self.admin.log_config_for(rec))

    async def controlled_shutdown(self) -> None:
        """Kafka's controlledShutdown: ask the controller to move this broker's leaderships away before it
        stops serving, retrying while some remain (controlled.shutdown.max.retries)."""
        c = self.config
        if self.controller is None or not c["controlled.shutdown.enable"]:
            return
        assert isinstance(self.metadata, ZkMetadataStore)
        t0 = time.monotonic()
        for attempt in range(c["controlled.shutdown.max.retries"] + 1):
            if attempt:
                await asyncio.sleep(c["controlled.shutdown.retry.backoff.ms"] / 1000)
            req = ControlledShutdownRequest(broker_id=self.broker_id, broker_epoch=self.metadata.broker_epoch)
            try:
                resp = await self.inter_broker.send_to_controller(7, 3, req)
            except (ConnectionError, KafkaError) as e:
                log.warning("Controlled shutdown attempt %d failed: %s", attempt + 1, e)
                continue
            if resp.error_code == ErrorCode.NONE and not resp.remaining_partitions:
                log.info("Controlled shutdown of broker %d succeeded in %.0f ms", self.broker_id,
                         (time.monotonic() - t0) * 1000)
                return
            log.warning("Controlled shutdown attempt %d: error %d, %d partitions still led here", attempt + 1,
                        resp.error_code, len(resp.remaining_partitions))
        log.warning("Controlled shutdown of broker %d did not complete; shutting down anyway", self.broker_id)

    async def shutdown(self) -> None:
        log.info("Shutting down broker %d", self.broker_id)
        await self.controlled_shutdown()
        loop = asyncio.get_running_loop()
        # The metrics endpoint stops alongside (its HTTP server notices a stop only at its next poll, up to half a
        # second later: first in line, it delayed the controlled shutdown by as much).
        metrics_stopped = (loop.run_in_executor(None, self.metrics_exporter.stop)
                           if self.metrics_exporter is not None else None)
        console_stopped = loop.run_in_executor(None, self.console.stop) if self.console is not None else None
        registry_stopped = (loop.run_in_executor(None, self.schema_registry.stop)
                            if self.schema_registry is not None else None)
        self.socket_server.stop_accepting()
        # Parked long polls and group joins answer now: otherwise the processors' drain waits them out (a fetch's
        # max_wait_ms, 500 ms for librdkafka; a rebalance, up to the drain's 5 s grace) while the clients' next
        # requests sit unread in the sockets, and producers reach the new leaders only when the connections close.
        self.replica_manager.purgatory.close()
        self.replica_manager.produce_purgatory.notify_all()
        self.group_coordinator.resign()
        await loop.run_in_executor(None, self.socket_server.stop_processors)
        self.replica_manager.shutdown()
        self.txn_coordinator.stop()
        self.group_coordinator.stop()
        if self.controller is not None:
            self.controller.stop()
            self.controller_channel.stop()
        self.inter_broker.stop()
        self.controller_requests.shutdown(wait=True)
        if self.authorizer is not None:
            self.authorizer.stop()
        self.io_pool.shutdown(wait=True)
        await loop.run_in_executor(None, self.log_manager.shutdown)
        self.metadata.stop()
        if metrics_stopped is not None:
            await metrics_stopped
        if console_stopped is not None:
            await console_stopped
        if registry_stopped is not None:
            await registry_stopped
        log.info("Broker %d shut down cleanly", self.broker_id)

    def request_stop(self) -> None:
        self._stopped.set()

    async def run_until_stopped(self, after_startup: Callable[[], None] | None = None) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        await self.startup()
        if after_startup is not None:
            after_startup()
        await self._stopped.wait()
        await self.shutdown()

    def brokers(self, listener: str | None = None) -> list[tuple[int, str, int, str | None]]:
        """Live brokers as (id, host, port, rack) on the listener a request came in on, as Kafka answers
        Metadata with the endpoints of the request's own listener."""
        name = listener or self.config.advertised_listeners[0].name
        endpoints = {b: (h, p, r) for b, h, p, r in self.metadata.broker_endpoints(name)}
        host, port = self.advertised_endpoint(name)
        endpoints[self.broker_id] = (host, port, None)
        return [(b, *endpoints[b]) for b in sorted(endpoints)]

    def broker_rack(self, broker_id: int) -> str | None:
        """A broker's rack as registered (ZooKeeper mode); None without one, as every broker of a single node."""
        rack_of = getattr(self.metadata, "broker_rack", None)
        return rack_of(broker_id) if rack_of is not None else None

    def group_metadata_hash(self, topic_names: Iterable[str]) -> int:
        """Kafka's group metadata hash (KIP-1101) of the named topics as they are now."""
        return topics_hash(topic_names, self.metadata.topics, self.broker_rack)

    def topic_names_by_id(self) -> dict[bytes, str]:
        """topic id -> name, rebuilt only when the store swaps in a new topics map (copy-on-write)."""
        topics = self.metadata.topics
        cache = self._ids_cache
        if cache is None or cache[0] is not topics:
            cache = self._ids_cache = (topics, {rec.topic_id: rec.name for rec in topics.values()})
        return cache[1]

    def controller_id(self) -> int:
        # The Java admin client sends CreateTopics/DeleteTopics only to the controller it is told about,
        # so always name a live broker: in a single-node cluster, this one.
        return self.metadata.controller_id()

    # ------------------------------------------------------------ group coordinator host

    def consumer_group_topics(self) -> dict[str, TopicRecord]:
        """The current topics map (replaced, never changed in place: consumer groups compare it by identity)."""
        return self.metadata.topics

    def consumer_group_config(self, group_id: str) -> Mapping[str, str]:
        """The group's config overrides (config resource type GROUP), validated when they were set."""
        return self.metadata.group_configs.get(group_id, {})

    def ensure_offsets_topic(self) -> TopicRecord:
        """__consumer_offsets, created on first use like Kafka (compacted, offsets.topic.* settings)."""
        rec = self.metadata.topics.get(OFFSETS_TOPIC)
        if rec is not None:
            return rec
        c = self.config
        try:
            return self.admin.create_topic(
                OFFSETS_TOPIC, c["offsets.topic.num.partitions"], self._internal_rf("offsets.topic.replication.factor"),
                {"cleanup.policy": "compact", "segment.bytes": str(c["offsets.topic.segment.bytes"]),
                 "compression.type": "producer"},
            )
        except KafkaError as e:
            if e.code == ErrorCode.TOPIC_ALREADY_EXISTS:
                return self._created_elsewhere(OFFSETS_TOPIC)
            raise

    def _created_elsewhere(self, name: str) -> TopicRecord:
        """Another broker created the internal topic first: until its registration reaches this broker's
        metadata, the coordinator is not available yet (retriable), as Kafka answers."""
        rec = self.metadata.topics.get(name)
        if rec is None:
            raise KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{name} is being created")
        return rec

    def _internal_rf(self, key: str) -> int:
        """Replication factor of an internal topic: the config in a cluster (as Kafka, creation fails while
        fewer brokers are alive), always 1 on the embedded single node."""
        return int(self.config[key]) if self.controller is not None else 1

    def offsets_log(self, partition: int):  # type: ignore[no-untyped-def]
        self.ensure_offsets_topic()
        return self.replica_manager.get_log(OFFSETS_TOPIC, partition)

    def leads_offsets_partition(self, partition: int) -> bool:
        leads = self.replica_manager.leads(OFFSETS_TOPIC, partition)
        if leads is not None:
            return leads
        rec = self.metadata.topics.get(OFFSETS_TOPIC)
        if rec is None:
            return True  # created on demand, by this broker
        return 0 <= partition < rec.num_partitions and rec.leaders[partition] == self.broker_id

    def topic_partition_exists(self, topic: str, partition: int) -> bool:
        rec = self.metadata.topics.get(topic)
        return rec is not None and 0 <= partition < rec.num_partitions

    async def flush_log(self, lg, offset: int) -> None:  # type: ignore[no-untyped-def]
        await asyncio.wrap_future(self.io_pool.submit(lg.flush, offset + 1))

    async def wait_replicated(self, lg, offset: int) -> ErrorCode:  # type: ignore[no-untyped-def]
        # A coordinator's write: followers parked in a long-poll fetch take it now, not at replica.fetch.wait.max.ms.
        self.replica_manager.purgatory.notify((lg.topic, lg.partition))
        return await self.replica_manager.wait_for_high_watermark(lg, offset, self.config["offsets.commit.timeout.ms"])

    # ------------------------------------------------------------ transaction coordinator host

    def ensure_transaction_state_topic(self) -> TopicRecord:
        """__transaction_state, created on first use like Kafka (compacted, transaction.state.log.* settings)."""
        rec = self.metadata.topics.get(TRANSACTION_STATE_TOPIC)
        if rec is not None:
            return rec
        try:
            return self.admin.create_topic(
                TRANSACTION_STATE_TOPIC, self.config["transaction.state.log.num.partitions"],
                self._internal_rf("transaction.state.log.replication.factor"),
                self.txn_coordinator.config.topic_configs(),
            )
        except KafkaError as e:
            if e.code == ErrorCode.TOPIC_ALREADY_EXISTS:
                return self._created_elsewhere(TRANSACTION_STATE_TOPIC)
            raise

    def txn_log(self, partition: int):  # type: ignore[no-untyped-def]
        self.ensure_transaction_state_topic()
        return self.replica_manager.get_log(TRANSACTION_STATE_TOPIC, partition)

    def leads_txn_partition(self, partition: int) -> bool:
        leads = self.replica_manager.leads(TRANSACTION_STATE_TOPIC, partition)
        if leads is not None:
            return leads
        rec = self.metadata.topics.get(TRANSACTION_STATE_TOPIC)
        if rec is None:
            return True  # created on demand, by this broker
        return 0 <= partition < rec.num_partitions and rec.leaders[partition] == self.broker_id

    async def generate_producer_id(self) -> int:
        return await asyncio.get_running_loop().run_in_executor(self.io_pool, self.producer_ids.generate)

    def partition_exists(self, topic: str, partition: int) -> bool:
        return self.topic_partition_exists(topic, partition)

    async def write_txn_markers(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                                partitions: list[tuple[str, int]]) -> dict[tuple[str, int], ErrorCode]:
        return await self.txn_markers.write_txn_markers(producer_id, producer_epoch, coordinator_epoch, commit,
                                                        partitions)

    def _inter_broker_endpoint(self, broker_id: int) -> tuple[str, int] | None:
        listener = inter_broker_listener(self.config)
        for b, host, port, _ in self.metadata.broker_endpoints(listener):
            if b == broker_id:
                return host, port
        return None

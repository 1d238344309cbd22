"""AdminManager: topic creation, deletion, partition growth and config changes."""

from __future__ import annotations

import logging
import random
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from kbroker.broker.group_config import InvalidGroupConfig, validate_group_configs
from kbroker.broker.topic_config import InvalidConfig, default_log_config, validate_topic_configs
from kbroker.coordinator.metadata_store import MetadataStorageError, PartitionState, TopicRecord, new_topic_id
from kbroker.protocol.errors import ErrorCode, KafkaError
from kbroker.storage.config import LogConfig
from kbroker.storage.errors import KafkaStorageError

if TYPE_CHECKING:
    from kbroker.broker.server import KafkaServer
    from kbroker.storage.log import Log

log = logging.getLogger("kbroker.admin")


@contextmanager
def _storage_errors() -> Iterator[None]:
    """A metadata change the log dir could not make durable (it was not made) is KAFKA_STORAGE_ERROR."""
    try:
        yield
    except MetadataStorageError as e:
        raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, str(e)) from None

MAX_TOPIC_NAME = 249
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
# Kafka's controller (ReplicationControlManager.MAX_PARTITIONS_PER_BATCH) refuses a CreateTopics request asking
# for more partitions than this in all, with POLICY_VIOLATION and this message.
MAX_PARTITIONS_PER_REQUEST = 10_000
EXCESSIVE_PARTITIONS = "Excessively large number of partitions per request."


def total_requested_partitions(topics: list[tuple[int, int]], default_partitions: int) -> int:
    """Kafka's validateTotalNumberOfPartitions count over (num_partitions, number of assignments) per topic."""
    total = 0
    for num_partitions, assignments in topics:
        if assignments:
            total += assignments
        elif num_partitions == -1:
            total += default_partitions
        elif num_partitions > 0:
            total += num_partitions
    return total


def validate_topic_name(name: str) -> str | None:
    """Kafka's Topic.validate: the reason a name is illegal, or None."""
    if not name:
        return "Topic name is illegal, it can't be empty"
    if name in (".", ".."):
        return "Topic name cannot be \".\" or \"..\""
    if len(name) > MAX_TOPIC_NAME:
        return f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME} characters, topic name: {name}"
    if not _LEGAL.fullmatch(name):
        return (
            f"Topic name \"{name}\" is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'"
        )
    return None


def _collides(a: str, b: str) -> bool:
    return a != b and a.replace(".", "_") == b.replace(".", "_")


def assign_replicas_rack_unaware(brokers: list[int], num_partitions: int, replication_factor: int,
                                 start_index: int = -1, start_partition: int = 0) -> list[list[int]]:
    """Kafka's AdminUtils.assignReplicasToBrokersRackUnaware: spread leaders round-robin from a random
    broker, and each further replica at a shift that grows every time the partitions wrap the brokers."""
    n = len(brokers)
    shift = start_index if start_index >= 0 else random.randrange(n)
    if start_index < 0:
        start_index = random.randrange(n)
    out: list[list[int]] = []
    for pid in range(max(0, start_partition), max(0, start_partition) + num_partitions):
        if pid > 0 and pid % n == 0:
            shift += 1
        first = (pid + start_index) % n
        replicas = [brokers[first]]
        for j in range(replication_factor - 1):
            replicas.append(brokers[(first + 1 + (shift + j) % (n - 1)) % n])
        out.append(replicas)
    return out


def check_assignment(assignment: list[list[int]], live: set[int]) -> None:
    """Kafka's validation of an explicit replica assignment (INVALID_REPLICA_ASSIGNMENT)."""
    sizes = {len(r) for r in assignment}
    for replicas in assignment:
        if not replicas:
            raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "Replica list cannot be empty.")
        if len(set(replicas)) != len(replicas):
            raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                             f"Duplicate brokers not allowed in replica assignment: {', '.join(map(str, replicas))}.")
        unknown = [b for b in replicas if b not in live]
        if unknown:
            raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                             f"Unknown broker(s) in replica assignment: {', '.join(map(str, unknown))}.")
    if len(sizes) > 1:
        raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                         "All partitions should have the same number of replicas.")


class AdminManager:
    def __init__(self, server: KafkaServer) -> None:
        self.server = server
        self._lock = threading.RLock()

    @property
    def metadata(self):  # type: ignore[no-untyped-def]
        return self.server.metadata

    def base_log_config(self) -> LogConfig:
        return default_log_config(self.server.config, self.metadata.broker_configs)

    def log_config_for(self, rec: TopicRecord) -> LogConfig:
        return validate_topic_configs(rec.configs, self.base_log_config())

    # ------------------------------------------------------------ create

    def check_new_topic(self, name: str, num_partitions: int, replication_factor: int,
                        configs: Mapping[str, str | None]) -> tuple[int, int, LogConfig]:
        """Validate a CreateTopics entry; returns the effective (partitions, replication factor, config)."""
        problem = validate_topic_name(name)
        if problem:
            raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        if name in self.metadata.topics:
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        for existing in self.metadata.topics:
            if _collides(name, existing):
                raise KafkaError(
                    ErrorCode.INVALID_TOPIC_EXCEPTION,
                    f"Topic '{name}' collides with existing topic: {existing}",
                )
        if num_partitions == -1:
            num_partitions = self.server.config["num.partitions"]
        if num_partitions <= 0:
            raise KafkaError(ErrorCode.INVALID_PARTITIONS, "Number of partitions must be larger than 0.")
        if replication_factor == -1:
            replication_factor = self.server.config["default.replication.factor"]
        if replication_factor <= 0:
            raise KafkaError(ErrorCode.INVALID_REPLICATION_FACTOR, "Replication factor must be larger than 0.")
        live = len(self.metadata.live_brokers())
        if replication_factor > live:
            raise KafkaError(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"Replication factor: {replication_factor} larger than available brokers: {live}.",
            )
        try:
            config = validate_topic_configs(configs, self.base_log_config())
        except InvalidConfig as e:
            raise KafkaError(ErrorCode.INVALID_CONFIG, str(e)) from None
        return num_partitions, replication_factor, config

    def assign_replicas(self, num_partitions: int, replication_factor: int, start_partition: int = 0,
                        start_index: int = -1) -> list[list[int]]:
        return assign_replicas_rack_unaware(sorted(self.metadata.live_brokers()), num_partitions, replication_factor,
                                            start_index, start_partition)

    def create_topic(self, name: str, num_partitions: int = -1, replication_factor: int = -1,
                     configs: Mapping[str, str | None] | None = None,
                     assignment: list[list[int]] | None = None) -> TopicRecord:
        """All or nothing: this broker's logs of the topic are created first, and the topic is published only
        once they all exist; a failure removes the ones created and leaves no trace in the metadata."""
        with self._lock:
            num_partitions, rf, config = self.check_new_topic(name, num_partitions, replication_factor, configs or {})
            if assignment is None:
                assignment = self.assign_replicas(num_partitions, rf)
            rec = TopicRecord(
                name,
                new_topic_id(),
                # The leader the controller will pick (the first replica); ZooKeeper mode keeps only the replicas.
                [PartitionState(r[0], 0, list(r), list(r)) for r in assignment],
                {k: str(v) for k, v in (configs or {}).items()},
            )
            mine = [p for p in range(num_partitions) if rec.leaders[p] == self.server.broker_id]
            self._create_logs(name, mine, config)
            try:
                self.metadata.create_topic(rec)
            except FileExistsError:
                self._remove_logs(name, mine)
                # Another broker sharing ZooKeeper created it first.
                raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.") from None
            except MetadataStorageError as e:
                self._remove_logs(name, mine)
                raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, str(e)) from None
            except BaseException:
                self._remove_logs(name, mine)
                raise
            log.info("Created topic %s with %d partitions (%d logs here), replication factor %d, configs %s", name,
                     num_partitions, len(mine), len(assignment[0]), rec.configs)
            return rec

    def _create_logs(self, name: str, partitions: list[int], config: LogConfig) -> None:
        log_manager = self.server.log_manager
        done: list[int] = []
        try:
            for p in partitions:
                log_manager.get_or_create_log(name, p, config, announce=False)
                done.append(p)
        except Exception as e:
            self._remove_logs(name, done)
            log.error("Creating topic %s failed after %d of %d logs, removed them again: %s", name, len(done),
                      len(partitions), e)
            # A full or failing log dir is a storage error, as for produce; anything else is unexpected.
            code = ErrorCode.KAFKA_STORAGE_ERROR if isinstance(e, OSError | KafkaStorageError) else (
                ErrorCode.UNKNOWN_SERVER_ERROR)
            raise KafkaError(code, f"Could not create the logs of topic '{name}': {e}") from None

    def _remove_logs(self, name: str, partitions: list[int]) -> None:
        for p in partitions:
            try:
                self.server.log_manager.discard_log(name, p)
            except OSError:
                log.warning("Could not remove log %s-%d of a topic that was not created", name, p, exc_info=True)

    def ensure_log(self, topic: str, partition: int) -> Log:
        rec = self.metadata.topics.get(topic)
        if rec is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        return self.server.log_manager.get_or_create_log(topic, partition, self.log_config_for(rec), is_new=False)

    def auto_create(self, name: str) -> TopicRecord | None:
        """Metadata-driven auto creation (auto.create.topics.enable)."""
        with self._lock:
            rec = self.metadata.topics.get(name)
            if rec is not None:
                return rec
            return self.create_topic(name)

    # ------------------------------------------------------------ delete

    def delete_topic(self, name: str) -> None:
        with self._lock:
            if not self.server.config["delete.topic.enable"]:
                raise KafkaError(ErrorCode.TOPIC_DELETION_DISABLED, "Topic deletion is disabled.")
            rec = self.metadata.topics.get(name)
            if rec is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            with _storage_errors():
                self.metadata.delete_topic(name)
            for p in range(rec.num_partitions):
                self.server.log_manager.delete_log(name, p, announce=False)
                self.server.replica_manager.purgatory.notify((name, p))
            self.server.forget_group_offsets(name, rec.num_partitions)
            log.info("Deleted topic %s (%d partitions)", name, rec.num_partitions)

    # ------------------------------------------------------------ partitions

    def create_partitions(self, name: str, count: int, assignments: list[list[int]] | None,
                          validate_only: bool) -> None:
        with self._lock:
            rec = self.metadata.topics.get(name)
            if rec is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}' does not exist.")
            current = rec.num_partitions
            if count < current:
                raise KafkaError(
                    ErrorCode.INVALID_PARTITIONS,
                    f"Topic currently has {current} partitions, which is higher than the requested {count}.",
                )
            if count == current:
                raise KafkaError(ErrorCode.INVALID_PARTITIONS, f"Topic already has {current} partitions.")
            new = count - current
            if new > MAX_PARTITIONS_PER_REQUEST:
                # As CreateTopics: the assignment alone of a huge count would exhaust the broker's memory.
                raise KafkaError(ErrorCode.POLICY_VIOLATION, EXCESSIVE_PARTITIONS)
            live = set(self.metadata.live_brokers())
            rf = rec.replication_factor
            if assignments is not None:
                if len(assignments) != new:
                    raise KafkaError(
                        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                        f"Increasing the number of partitions by {new} but {len(assignments)} assignments provided.",
                    )
                check_assignment(assignments, live)
                if len(assignments[0]) != rf:
                    raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                     f"Inconsistent replication factor between partitions, partition 0 has {rf} "
                                     f"while partitions [{current}] have replication factors [{len(assignments[0])}].")
                assignment = [list(r) for r in assignments]
            else:
                if rf > len(live):
                    raise KafkaError(ErrorCode.INVALID_REPLICATION_FACTOR,
                                     f"Replication factor: {rf} larger than available brokers: {len(live)}.")
                brokers = sorted(live)
                first = rec.partitions[0].replicas[0] if rec.partitions and rec.partitions[0].replicas else brokers[0]
                # As Kafka's AdminZkClient: continue the round-robin from partition 0's first replica.
                start = next((i for i, b in enumerate(brokers) if b >= first), 0)
                assignment = self.assign_replicas(new, rf, start_partition=current, start_index=start)
            if validate_only:
                return
            # All or nothing, as create_topic: this broker's new logs first, then the durable metadata.
            mine = [current + i for i, replicas in enumerate(assignment) if replicas[0] == self.server.broker_id]
            self._create_logs(name, mine, self.log_config_for(rec))
            try:
                with _storage_errors():
                    self.metadata.add_partitions(name, assignment)
            except BaseException:
                self._remove_logs(name, mine)
                raise
            log.info("Topic %s now has %d partitions (was %d)", name, count, current)

    # ------------------------------------------------------------ configs

    def set_topic_configs(self, name: str, configs: Mapping[str, str | None], validate_only: bool) -> None:
        with self._lock:
            rec = self.metadata.topics.get(name)
            if rec is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {name} does not exist")
            try:
                config = validate_topic_configs(configs, self.base_log_config())
            except InvalidConfig as e:
                raise KafkaError(ErrorCode.INVALID_CONFIG, str(e)) from None
            if validate_only:
                return
            with _storage_errors():
                self.metadata.set_topic_configs(name, {k: str(v) for k, v in configs.items()})
            self.server.log_manager.update_topic_config(name, config)
            log.info("Topic %s configs are now %s", name, dict(configs))

    def set_group_configs(self, group_id: str, configs: Mapping[str, str | None], validate_only: bool) -> None:
        """Kafka's ControllerConfigurationValidator for GROUP resources; the group need not exist."""
        if not group_id:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "Default group resources are not allowed.")
        with self._lock:
            try:
                validate_group_configs(configs, self.server.config)
            except InvalidGroupConfig as e:
                raise KafkaError(ErrorCode.INVALID_CONFIG, str(e)) from None
            if validate_only:
                return
            with _storage_errors():
                self.metadata.set_group_configs(group_id, {k: str(v) for k, v in configs.items()})
            log.info("Group %s configs are now %s", group_id, dict(configs))

    def set_broker_configs(self, configs: Mapping[str, str], validate_only: bool, own: bool = False) -> None:
        """The whole set of dynamic configs of the cluster-wide default BROKER resource, or with `own` of this
        broker's (its id as the resource name)."""
        from kbroker.broker.config import KAFKA_DYNAMIC_CONFIGS, KEYS, KafkaConfig

        with self._lock:
            for key, value in configs.items():
                spec = KEYS.get(key)
                if spec is None:
                    raise KafkaError(ErrorCode.INVALID_CONFIG, f"Unknown broker config {key}")
                if key not in KAFKA_DYNAMIC_CONFIGS:
                    raise KafkaError(ErrorCode.INVALID_CONFIG, f"Cannot update these configs dynamically: {key}")
                if not spec.dynamic and not spec.inert:
                    raise KafkaError(ErrorCode.INVALID_CONFIG,
                                     f"kbroker cannot update {key} at runtime: set it in server.properties and restart")
                try:
                    KafkaConfig({**self.server.config.originals, key: value})
                except ValueError as e:
                    raise KafkaError(ErrorCode.INVALID_CONFIG, str(e)) from None
            if validate_only:
                return
            with _storage_errors():
                self.metadata.set_broker_configs(dict(configs), own=own)
            self.server.apply_dynamic_configs()
            log.info("Dynamic broker configs are now %s", dict(configs))

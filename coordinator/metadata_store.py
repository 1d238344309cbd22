"""Cluster metadata: cluster id, brokers, topics (ids, partition leaders, configs).

`LocalMetadataStore` is the embedded single-node default: state in a JSON file on the first
log dir, replaced atomically (write, fsync, rename) on every change so a crash never leaves
half a registry behind.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from kbroker.storage.atomic_file import write_atomically

log = logging.getLogger("kbroker.metadata")

class MetadataStorageError(OSError):
    """The metadata could not be made durable (ENOSPC, EIO...): the change was not made. Answered
    KAFKA_STORAGE_ERROR."""

    code = 56  # KAFKA_STORAGE_ERROR, for handlers that answer an exception's code


# Kafka's name for the default client-id entity in /config/clients.
DEFAULT_ENTITY = "<default>"


def with_client_quotas(quotas: dict[str | None, dict[str, float]], entity: str | None,
                       values: dict[str, float]) -> dict[str | None, dict[str, float]]:
    """A copy of the quota map with the entity's values replaced (removed when empty)."""
    out = dict(quotas)
    if values:
        out[entity] = dict(values)
    else:
        out.pop(entity, None)
    return out


def with_group_configs(groups: dict[str, dict[str, str]], group_id: str,
                       configs: dict[str, str]) -> dict[str, dict[str, str]]:
    """A copy of the group config map with the group's overrides replaced (removed when empty)."""
    out = dict(groups)
    if configs:
        out[group_id] = dict(configs)
    else:
        out.pop(group_id, None)
    return out


def new_cluster_id() -> str:
    """22 characters of URL-safe base64, like Kafka's Uuid.randomUuid().toString()."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def new_topic_id() -> bytes:
    while True:
        tid = uuid.uuid4().bytes
        # Kafka reserves the zero id and the METADATA_TOPIC_ID-like all-ones prefix; avoid both.
        if tid != bytes(16) and tid[:8] != b"\x00" * 8:
            return tid


@dataclass
class PartitionState:
    """One partition's replication state, as the controller writes it (Kafka's LeaderAndIsrPartitionState
    + the assignment). Treat a state in a TopicRecord as read-only: the stores replace it.

    `partition_epoch` is the version of /brokers/topics/<t>/partitions/<p>/state in ZooKeeper mode (Kafka's
    zkVersion, the AlterPartition partition epoch); the embedded single node has everything at 0.
    """

    leader: int
    leader_epoch: int
    isr: list[int]
    replicas: list[int]
    partition_epoch: int = 0
    adding_replicas: list[int] = field(default_factory=list)
    removing_replicas: list[int] = field(default_factory=list)
    # Epoch of the controller that last wrote this state (0 on the embedded single node).
    controller_epoch: int = 0
    # Replicas in a failed log dir, as the controller's UpdateMetadata says (replicas of brokers that are not live
    # are offline too; the Metadata handler adds those).
    offline_replicas: list[int] = field(default_factory=list)

    @classmethod
    def sole(cls, broker_id: int) -> PartitionState:
        """The embedded single node: one replica, always leader, leader epoch 0."""
        return cls(broker_id, 0, [broker_id], [broker_id])

    @classmethod
    def unknown(cls, replicas: list[int]) -> PartitionState:
        """Assigned, but no leader known yet (the controller has not told this broker)."""
        return cls(NO_LEADER, -1, [], list(replicas))


# Kafka's LeaderAndIsr.NoLeader / MetadataResponse.NO_LEADER_ID.
NO_LEADER = -1


@dataclass
class TopicRecord:
    """A topic and the state of its partitions.

    Replace a record (or its `partitions` list) instead of changing it in place: request threads read
    records without a lock, and `leaders` is derived once from `partitions`.
    """

    name: str
    topic_id: bytes
    partitions: list[PartitionState]
    configs: dict[str, str] = field(default_factory=dict)
    # partition index -> leader broker id, NO_LEADER for none: the hot-path "do I lead it" view.
    leaders: list[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.leaders = [ps.leader for ps in self.partitions]

    @classmethod
    def single_replica(cls, name: str, topic_id: bytes, leaders: list[int],
                       configs: dict[str, str] | None = None) -> TopicRecord:
        return cls(name, topic_id, [PartitionState.sole(b) for b in leaders], dict(configs or {}))

    @property
    def num_partitions(self) -> int:
        return len(self.partitions)

    @property
    def replication_factor(self) -> int:
        return len(self.partitions[0].replicas) if self.partitions else 0

    def with_partitions(self, partitions: list[PartitionState]) -> TopicRecord:
        return TopicRecord(self.name, self.topic_id, partitions, dict(self.configs))

    def with_configs(self, configs: dict[str, str]) -> TopicRecord:
        return TopicRecord(self.name, self.topic_id, list(self.partitions), dict(configs))

    def to_json(self) -> dict[str, object]:
        # The embedded store's file: one replica per partition, so the leaders say everything.
        return {
            "id": str(uuid.UUID(bytes=self.topic_id)),
            "leaders": self.leaders,
            "configs": self.configs,
        }

    @classmethod
    def from_json(cls, name: str, d: dict[str, object]) -> TopicRecord:
        return cls.single_replica(
            name,
            uuid.UUID(str(d["id"])).bytes,
            [int(x) for x in d["leaders"]],  # type: ignore[attr-defined]
            {str(k): str(v) for k, v in d.get("configs", {}).items()},  # type: ignore[attr-defined]
        )


class LocalMetadataStore:
    """Single-node metadata kept on local disk (no ZooKeeper)."""

    FILE = "kbroker-metadata.json"

    def __init__(self, log_dir: str, broker_id: int) -> None:
        self.path = Path(log_dir) / self.FILE
        self.broker_id = broker_id
        self._lock = threading.Lock()
        self.topics: dict[str, TopicRecord] = {}
        self.cluster_id = ""
        # Dynamic broker configs: the cluster-wide default (BROKER resource ""), this broker's own (its id), and the
        # two merged, own over default, which is what the broker runs with.
        self.default_broker_configs: dict[str, str] = {}
        self.own_broker_configs: dict[str, str] = {}
        self.broker_configs: dict[str, str] = {}
        # client id (None: the default entity) -> quota key -> value
        self.client_quotas: dict[str | None, dict[str, float]] = {}
        # group id -> group config overrides (config resource type GROUP); replaced, never changed in place
        self.group_configs: dict[str, dict[str, str]] = {}

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            data = json.loads(self.path.read_text())
            self.cluster_id = data["cluster_id"]
            self.topics = {n: TopicRecord.from_json(n, t) for n, t in data.get("topics", {}).items()}
            self.default_broker_configs = dict(data.get("broker_configs", {}))
            self.own_broker_configs = dict(data.get("own_broker_configs", {}))
            self.broker_configs = {**self.default_broker_configs, **self.own_broker_configs}
            self.client_quotas = {
                (None if k == DEFAULT_ENTITY else k): {q: float(v) for q, v in vals.items()}
                for k, vals in data.get("client_quotas", {}).items()
            }
            self.group_configs = {str(g): {str(k): str(v) for k, v in c.items()}
                                  for g, c in data.get("group_configs", {}).items()}
        else:
            self.cluster_id = new_cluster_id()
            self._persist()
            log.info("Created cluster id %s in %s", self.cluster_id, self.path)

    def stop(self) -> None:
        pass

    def live_brokers(self) -> list[int]:
        return [self.broker_id]

    # Cluster membership, shared with coordinator.zk_store.ZkMetadataStore: a single node is its own
    # controller and knows no other broker's endpoint.

    def register_broker(self, endpoints: dict[str, tuple[str, int]], rack: str | None = None) -> None:
        """Called once the listener is bound; nothing to announce without ZooKeeper."""

    def broker_endpoints(self, listener: str) -> list[tuple[int, str, int, str | None]]:
        """Other brokers as (id, host, port, rack); the server adds its own endpoint."""
        return []

    def controller_id(self) -> int:
        return self.broker_id

    def answer_state(self) -> tuple[object, ...]:
        """What a Metadata answer reads from this store, as objects that are replaced, never changed in place: the
        same objects (by identity), the same answer (broker/metadata_answers.py). A single node's brokers and
        controller never change; every topic change replaces `topics`."""
        return (self.topics,)

    def _persist(self, **changes: object) -> None:
        """Write the state with `changes` (attribute -> new value) applied, then apply them: all or nothing, so
        a change that could not be made durable (a full or failing log dir) is never visible. An OSError comes
        back as MetadataStorageError."""
        state = {
            "topics": self.topics, "default_broker_configs": self.default_broker_configs,
            "own_broker_configs": self.own_broker_configs, "client_quotas": self.client_quotas,
            "group_configs": self.group_configs, **changes,
        }
        topics = state["topics"]
        quotas = state["client_quotas"]
        assert isinstance(topics, dict) and isinstance(quotas, dict)
        data = {
            "version": 1,
            "cluster_id": self.cluster_id,
            "topics": {n: t.to_json() for n, t in sorted(topics.items())},
            "broker_configs": state["default_broker_configs"],
            "own_broker_configs": state["own_broker_configs"],
            "client_quotas": {(DEFAULT_ENTITY if k is None else k): v for k, v in quotas.items()},
            "group_configs": state["group_configs"],
        }
        try:
            write_atomically(self.path, json.dumps(data, indent=1).encode())
        except OSError as e:
            log.error("Could not write the metadata to %s, change not made: %s", self.path, e)
            raise MetadataStorageError(f"Could not write the metadata to {self.path}: {e.strerror or e}") from e
        for attr, value in changes.items():
            setattr(self, attr, value)

    def create_topic(self, record: TopicRecord) -> None:
        with self._lock:
            if record.name in self.topics:
                raise FileExistsError(record.name)
            # Copy-on-write: request threads iterate `topics` without a lock.
            self._persist(topics={**self.topics, record.name: record})

    def delete_topic(self, name: str) -> TopicRecord:
        with self._lock:
            topics = dict(self.topics)
            rec = topics.pop(name)
            self._persist(topics=topics)
            return rec

    def set_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        with self._lock:
            self._persist(topics={**self.topics, name: self.topics[name].with_configs(configs)})

    def add_partitions(self, name: str, assignment: list[list[int]]) -> None:
        with self._lock:
            rec = self.topics[name]
            new = [PartitionState.sole(replicas[0]) for replicas in assignment]
            self._persist(topics={**self.topics, name: rec.with_partitions(rec.partitions + new)})

    def set_broker_configs(self, configs: dict[str, str], own: bool = False) -> None:
        """The cluster-wide default dynamic configs, or with `own` this broker's."""
        with self._lock:
            default, mine = (self.default_broker_configs, dict(configs)) if own else (dict(configs), self.own_broker_configs)
            self._persist(default_broker_configs=default, own_broker_configs=mine, broker_configs={**default, **mine})

    def set_group_configs(self, group_id: str, configs: dict[str, str]) -> None:
        with self._lock:
            self._persist(group_configs=with_group_configs(self.group_configs, group_id, configs))

    def set_client_quotas(self, entity: str | None, values: dict[str, float]) -> None:
        with self._lock:
            self._persist(client_quotas=with_client_quotas(self.client_quotas, entity, values))

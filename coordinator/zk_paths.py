"""Kafka's ZooKeeper layout (ZK-mode brokers, Kafka 2.8-3.x) and the JSON documents stored in it.

Only the parts kbroker reads or writes. Documents are byte-compatible with what a Kafka ZK-mode broker
writes, so `zookeeper-shell` and Kafka tooling see a familiar tree.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

CLUSTER_ID = "/cluster/id"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
BROKER_IDS = "/brokers/ids"
BROKER_TOPICS = "/brokers/topics"
CONFIG_TOPICS = "/config/topics"
CONFIG_BROKERS = "/config/brokers"
CONFIG_CHANGES = "/config/changes"
CONFIG_CLIENTS = "/config/clients"
# Kafka's ConfigType.GROUP entity name; Kafka 3.9 keeps group configs only in KRaft metadata (see zk_group_configs).
CONFIG_GROUPS = "/config/groups"
DELETE_TOPICS = "/admin/delete_topics"
REASSIGN_PARTITIONS = "/admin/reassign_partitions"
LATEST_PRODUCER_ID_BLOCK = "/latest_producer_id_block"
# Kafka's LogDirEventNotificationZNode: a broker whose log dir failed adds a sequential child for the controller.
LOG_DIR_EVENT_NOTIFICATION = "/log_dir_event_notification"
LOG_DIR_EVENT_PREFIX = "log_dir_event_"
LOG_DIR_FAILURE = 1  # Kafka's LogDirEventNotificationHandler.LogDirFailureEvent
DEFAULT_BROKER_ENTITY = "<default>"

# Persistent paths a Kafka broker creates on first start (KafkaZkClient.createTopLevelPaths).
PERSISTENT_PATHS = (
    "/consumers",
    BROKER_IDS,
    BROKER_TOPICS,
    CONFIG_CHANGES,
    DELETE_TOPICS,
    "/brokers/seqid",
    "/isr_change_notification",
    LATEST_PRODUCER_ID_BLOCK,
    LOG_DIR_EVENT_NOTIFICATION,
    CONFIG_TOPICS,
    CONFIG_CLIENTS,
    "/config/users",
    CONFIG_BROKERS,
    "/config/ips",
)


def group_config_path(group_id: str) -> str:
    # Group ids may hold any character, '/' included: percent-encoded so that each group is one znode.
    return f"{CONFIG_GROUPS}/{quote(group_id, safe='')}"


def client_config_path(entity: str | None) -> str:
    return f"{CONFIG_CLIENTS}/{DEFAULT_BROKER_ENTITY if entity is None else entity}"


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS}/{broker_id}"


def topic_path(topic: str) -> str:
    return f"{BROKER_TOPICS}/{topic}"


def partitions_path(topic: str) -> str:
    return f"{BROKER_TOPICS}/{topic}/partitions"


def partition_path(topic: str, partition: int) -> str:
    return f"{BROKER_TOPICS}/{topic}/partitions/{partition}"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{BROKER_TOPICS}/{topic}/partitions/{partition}/state"


def topic_config_path(topic: str) -> str:
    return f"{CONFIG_TOPICS}/{topic}"


def broker_config_path(entity: str = DEFAULT_BROKER_ENTITY) -> str:
    return f"{CONFIG_BROKERS}/{entity}"


def now_ms() -> int:
    return int(time.time() * 1000)


def dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def loads(data: bytes | None) -> dict[str, Any]:
    if not data:
        return {}
    doc = json.loads(data.decode())
    return doc if isinstance(doc, dict) else {}


# ------------------------------------------------------------------ ids


def uuid_to_string(raw: bytes) -> str:
    """Kafka's Uuid.toString(): URL-safe base64 of the 16 bytes, no padding (22 characters)."""
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def uuid_from_string(s: str) -> bytes:
    raw = base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
    if len(raw) != 16:
        raise ValueError(f"not a Kafka Uuid: {s!r}")
    return raw


# ------------------------------------------------------------------ documents


def cluster_id_doc(cluster_id: str) -> bytes:
    return dumps({"version": "1", "id": cluster_id})


def broker_registration_doc(endpoints: dict[str, tuple[str, int]], rack: str | None = None,
                            protocols: dict[str, str] | None = None) -> bytes:
    """Kafka's /brokers/ids/<id> JSON (version 5): one NAME://host:port endpoint per advertised listener."""
    host, port = endpoints.get("PLAINTEXT", next(iter(endpoints.values())))
    doc: dict[str, Any] = {
        "listener_security_protocol_map": {name: (protocols or {}).get(name, "PLAINTEXT") for name in endpoints},
        "endpoints": [f"{name}://{_host_literal(h)}:{p}" for name, (h, p) in endpoints.items()],
        "jmx_port": -1,
        "host": host,
        "timestamp": str(now_ms()),
        "port": port,
        "version": 5,
    }
    if rack is not None:
        doc["rack"] = rack
    return dumps(doc)


def _host_literal(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_broker_endpoints(data: bytes | None) -> tuple[dict[str, tuple[str, int]], str | None]:
    """Listener name -> (host, port) of a /brokers/ids/<id> document, and the rack."""
    doc = loads(data)
    out: dict[str, tuple[str, int]] = {}
    for ep in doc.get("endpoints") or []:
        # LISTENER://host:port, host may be a bracketed IPv6 literal
        name, _, hostport = str(ep).partition("://")
        host, _, port = hostport.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if port.isdigit():
            out[name.upper()] = (host, int(port))
    if not out and doc.get("host"):
        out["PLAINTEXT"] = (str(doc["host"]), int(doc.get("port", -1)))
    return out, doc.get("rack")


def parse_broker_registration(data: bytes | None) -> tuple[str, int, str | None]:
    """(host, port, rack) of a /brokers/ids/<id> document: its first endpoint."""
    endpoints, rack = parse_broker_endpoints(data)
    host, port = next(iter(endpoints.values()), ("", -1))
    return host, port, rack


def controller_doc(broker_id: int) -> bytes:
    return dumps({"version": 1, "brokerid": broker_id, "timestamp": str(now_ms())})


def parse_controller(data: bytes | None) -> int | None:
    try:
        bid = loads(data).get("brokerid")
    except ValueError:
        return None
    return None if bid is None else int(bid)


@dataclass(frozen=True)
class TopicAssignment:
    """/brokers/topics/<t> (version 3): replicas of each partition and the reassignment in progress."""

    topic_id: bytes | None
    replicas: list[list[int]]
    adding: dict[int, list[int]] = field(default_factory=dict)
    removing: dict[int, list[int]] = field(default_factory=dict)


def topic_assignment_doc(topic_id: bytes, replicas: list[list[int]], adding: dict[int, list[int]] | None = None,
                         removing: dict[int, list[int]] | None = None) -> bytes:
    return dumps(
        {
            "version": 3,
            "partitions": {str(p): list(r) for p, r in enumerate(replicas)},
            "topic_id": uuid_to_string(topic_id),
            "adding_replicas": {str(p): list(r) for p, r in sorted((adding or {}).items()) if r},
            "removing_replicas": {str(p): list(r) for p, r in sorted((removing or {}).items()) if r},
        }
    )


def parse_topic_assignment(data: bytes | None) -> TopicAssignment:
    doc = loads(data)
    parts = doc.get("partitions") or {}
    replicas = [[int(b) for b in parts[k]] for k in sorted(parts, key=int)]
    tid = doc.get("topic_id")

    def by_partition(key: str) -> dict[int, list[int]]:
        return {int(p): [int(b) for b in r] for p, r in (doc.get(key) or {}).items() if r}

    return TopicAssignment(uuid_from_string(tid) if tid else None, replicas, by_partition("adding_replicas"),
                           by_partition("removing_replicas"))


@dataclass(frozen=True)
class LeaderIsrState:
    """/brokers/topics/<t>/partitions/<p>/state (Kafka's LeaderIsrAndControllerEpoch) and its znode version."""

    leader: int
    leader_epoch: int
    isr: list[int]
    controller_epoch: int
    version: int = 0


def partition_state_doc(leader: int, leader_epoch: int, isr: list[int], controller_epoch: int) -> bytes:
    # leader_recovery_state is written only when not RECOVERED, as Kafka's TopicPartitionStateZNode.
    return dumps(
        {"controller_epoch": controller_epoch, "leader": leader, "version": 1, "leader_epoch": leader_epoch,
         "isr": list(isr)}
    )


def parse_partition_state(data: bytes | None, version: int) -> LeaderIsrState | None:
    doc = loads(data)
    if "leader" not in doc:
        return None
    return LeaderIsrState(int(doc["leader"]), int(doc.get("leader_epoch", 0)), [int(b) for b in doc.get("isr", [])],
                          int(doc.get("controller_epoch", 0)), version)


def reassign_partitions_doc(targets: dict[tuple[str, int], list[int]]) -> bytes:
    """/admin/reassign_partitions as Kafka's ReassignPartitionsZNode (version 1)."""
    return dumps({"version": 1, "partitions": [
        {"topic": t, "partition": p, "replicas": list(r)} for (t, p), r in sorted(targets.items())
    ]})


def parse_reassign_partitions(data: bytes | None) -> dict[tuple[str, int], list[int]]:
    return {(str(e["topic"]), int(e["partition"])): [int(b) for b in e["replicas"]]
            for e in loads(data).get("partitions") or []}


def config_doc(configs: dict[str, str]) -> bytes:
    return dumps({"version": 1, "config": dict(configs)})


def parse_config(data: bytes | None) -> dict[str, str]:
    return {str(k): str(v) for k, v in (loads(data).get("config") or {}).items()}


def config_change_doc(entity_path: str) -> bytes:
    return dumps({"version": 2, "entity_path": entity_path})


def log_dir_event_doc(broker_id: int) -> bytes:
    """Kafka's LogDirEventNotificationSequenceZNode.encode."""
    return json.dumps({"version": 1, "broker": broker_id, "event": LOG_DIR_FAILURE}, separators=(",", ":")).encode()


def parse_log_dir_event(data: bytes | None) -> int | None:
    """The broker id of a log dir failure notification; None for anything else (Kafka ignores those too)."""
    try:
        doc = loads(data)
        if int(doc.get("event", LOG_DIR_FAILURE)) != LOG_DIR_FAILURE:
            return None
        return int(doc["broker"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None

"""The controller's ZooKeeper reads and writes (Kafka's KafkaZkClient, the parts the controller uses).

Every write is conditional on the controller epoch znode still having the version this controller
wrote when it was elected (Kafka's checkControllerAndEpoch in one multi-op), so a controller that lost
its seat without noticing cannot overwrite its successor's decisions; partition states are written
with the znode version read (Kafka's zkVersion), so a concurrent change is detected, never lost.
"""

from __future__ import annotations

from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError
from kbroker.coordinator import zk_paths as zp
from kbroker.coordinator.controller_context import TopicPartition
from kbroker.coordinator.zk_paths import LeaderIsrState, TopicAssignment


class ControllerMovedError(Exception):
    """/controller_epoch changed: another broker is the controller now."""


def _commit(client: KazooClient, epoch_zk_version: int, ops: list[tuple[str, Any]]) -> list[Any]:
    tx = client.transaction()
    tx.check(zp.CONTROLLER_EPOCH, epoch_zk_version)
    for kind, args in ops:
        getattr(tx, kind)(*args[:-1], **args[-1])
    results = tx.commit()
    if isinstance(results[0], BadVersionError | NoNodeError):
        raise ControllerMovedError()
    return results[1:]


def read_live_brokers(client: KazooClient) -> dict[int, int]:
    """Registered broker ids and their epochs (the czxid of /brokers/ids/<id>, Kafka's broker epoch)."""
    ids = [c for c in client.get_children(zp.BROKER_IDS) if c.isdigit()]
    pending = [(int(c), client.exists_async(zp.broker_path(int(c)))) for c in ids]
    out: dict[int, int] = {}
    for b, res in pending:
        stat = res.get()
        if stat is not None:
            out[b] = stat.czxid
    return out


def read_topic_names(client: KazooClient) -> list[str]:
    return sorted(client.get_children(zp.BROKER_TOPICS))


def read_assignment(client: KazooClient, topic: str) -> TopicAssignment | None:
    try:
        data, _ = client.get(zp.topic_path(topic))
    except NoNodeError:
        return None
    return zp.parse_topic_assignment(data)


def read_assignments(client: KazooClient, topics: list[str]) -> dict[str, TopicAssignment]:
    """Assignment znodes of many topics, read pipelined."""
    pending = [(t, client.get_async(zp.topic_path(t))) for t in topics]
    out: dict[str, TopicAssignment] = {}
    for t, res in pending:
        try:
            data, _ = res.get()
        except NoNodeError:
            continue
        out[t] = zp.parse_topic_assignment(data)
    return out


def read_states(client: KazooClient, topic: str, partitions: int) -> dict[int, LeaderIsrState]:
    """The state znodes of a topic, read pipelined (one round trip's latency for all of them)."""
    pending = [(p, client.get_async(zp.partition_state_path(topic, p))) for p in range(partitions)]
    out: dict[int, LeaderIsrState] = {}
    for p, res in pending:
        try:
            data, stat = res.get()
        except NoNodeError:
            continue
        st = zp.parse_partition_state(data, stat.version)
        if st is not None:
            out[p] = st
    return out


def create_states(client: KazooClient, epoch_zk_version: int, topic: str,
                  states: dict[int, LeaderIsrState]) -> dict[int, LeaderIsrState]:
    """Kafka's createTopicPartitionStatesRaw: the state znodes of new partitions. Partitions whose state
    exists already are left out of the result (another controller got there first)."""
    try:
        client.create(zp.partitions_path(topic), b"")
    except NodeExistsError:
        pass
    except NoNodeError:
        return {}  # the topic is gone
    out: dict[int, LeaderIsrState] = {}
    for p, st in sorted(states.items()):
        try:
            client.create(zp.partition_path(topic, p), b"")
        except NodeExistsError:
            pass
        except NoNodeError:
            return out
        doc = zp.partition_state_doc(st.leader, st.leader_epoch, st.isr, st.controller_epoch)
        results = _commit(client, epoch_zk_version, [("create", (zp.partition_state_path(topic, p), doc, {}))])
        if isinstance(results[0], NodeExistsError | NoNodeError):
            continue  # already there, or the topic was deleted meanwhile
        if isinstance(results[0], Exception):
            raise results[0]
        out[p] = LeaderIsrState(st.leader, st.leader_epoch, st.isr, st.controller_epoch, 0)
    return out


def update_leader_and_isr(client: KazooClient, epoch_zk_version: int,
                          updates: dict[TopicPartition, LeaderIsrState]) -> tuple[dict[TopicPartition, LeaderIsrState],
                                                                                 list[TopicPartition]]:
    """Kafka's updateLeaderAndIsr: each state written only if its znode still has the version given in the
    state (`version`), every write pipelined (one round trip's latency for all: a controlled shutdown moves
    many leaders at once). Returns the written states with their new versions, and the partitions whose
    write lost a race (to be read again)."""
    pending = []
    for (topic, p), st in updates.items():
        doc = zp.partition_state_doc(st.leader, st.leader_epoch, st.isr, st.controller_epoch)
        tx = client.transaction()
        tx.check(zp.CONTROLLER_EPOCH, epoch_zk_version)
        tx.set_data(zp.partition_state_path(topic, p), doc, version=st.version)
        pending.append(((topic, p), st, tx.commit_async()))
    done: dict[TopicPartition, LeaderIsrState] = {}
    stale: list[TopicPartition] = []
    moved = False
    for tp, st, res in pending:
        results = res.get()
        if isinstance(results[0], BadVersionError | NoNodeError):
            moved = True
            continue
        r = results[1]
        if isinstance(r, BadVersionError | NoNodeError):
            stale.append(tp)
        elif isinstance(r, Exception) and not isinstance(r, RolledBackError):
            raise r
        else:
            done[tp] = LeaderIsrState(st.leader, st.leader_epoch, st.isr, st.controller_epoch, r.version)
    if moved:
        raise ControllerMovedError()
    return done, stale


def write_assignment(client: KazooClient, epoch_zk_version: int, topic: str, topic_id: bytes,
                     replicas: list[list[int]], adding: dict[int, list[int]], removing: dict[int, list[int]]) -> None:
    doc = zp.topic_assignment_doc(topic_id, replicas, adding, removing)
    results = _commit(client, epoch_zk_version, [("set_data", (zp.topic_path(topic), doc, {}))])
    if isinstance(results[0], Exception) and not isinstance(results[0], RolledBackError):
        raise results[0]


def read_log_dir_events(client: KazooClient) -> dict[str, int | None]:
    """Kafka's getAllLogDirEventNotifications and getBrokerIdsFromLogDirEvents: child name -> broker id (None when
    unreadable, or gone meanwhile)."""
    try:
        children = sorted(c for c in client.get_children(zp.LOG_DIR_EVENT_NOTIFICATION)
                          if c.startswith(zp.LOG_DIR_EVENT_PREFIX))
    except NoNodeError:
        return {}
    pending = [(c, client.get_async(f"{zp.LOG_DIR_EVENT_NOTIFICATION}/{c}")) for c in children]
    out: dict[str, int | None] = {}
    for c, res in pending:
        try:
            data, _ = res.get()
        except NoNodeError:
            out[c] = None
            continue
        out[c] = zp.parse_log_dir_event(data)
    return out


def delete_log_dir_events(client: KazooClient, epoch_zk_version: int, names: list[str]) -> None:
    """Kafka's deleteLogDirEventNotifications: each delete conditional on the controller epoch, pipelined."""
    pending = []
    for name in names:
        tx = client.transaction()
        tx.check(zp.CONTROLLER_EPOCH, epoch_zk_version)
        tx.delete(f"{zp.LOG_DIR_EVENT_NOTIFICATION}/{name}")
        pending.append(tx.commit_async())
    for res in pending:
        results = res.get()
        if isinstance(results[0], BadVersionError | NoNodeError):
            raise ControllerMovedError()

"""ZkMetadataStore: cluster metadata kept in ZooKeeper with Kafka's ZK-mode layout (see zk_paths).

Used when `zookeeper.connect` is set. Several kbroker processes sharing one ZooKeeper form a cluster:
each registers an ephemeral /brokers/ids/<id>, one of them holds the ephemeral /controller, and topics
(partition -> leader, topic id, configs) live under /brokers/topics and /config/topics, mirrored into
memory by kazoo watches.

Partition state (leader, leader epoch, ISR) is the controller's: this broker learns it from the
controller's LeaderAndIsr and UpdateMetadata requests (`apply_partition_states`), as a Kafka broker's
metadata cache does. Only until the first of those arrives after startup, the state znodes seed it, so
that a restarted broker serves (and loads the coordinators of) what it led before the controller speaks.

Threading: request handlers read `topics`, `broker_configs` and the broker map on processor threads
without locks; every change replaces the dict (copy-on-write). Syncing ZooKeeper -> memory and local
writes (write ZooKeeper, then memory) both run under `_sync_lock`, so a stale read can never be
applied after a newer one. Callbacks into the server (`on_topic_removed`, `on_topic_changed`,
`on_broker_configs_changed`) run outside that lock, on kazoo's threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    ZookeeperError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.watchers import ChildrenWatch, DataWatch
from kazoo.retry import KazooRetry
from kbroker.coordinator import zk_paths as zp
from kbroker.coordinator.metadata_store import (
    PartitionState,
    TopicRecord,
    new_cluster_id,
    new_topic_id,
    with_client_quotas,
)
from kbroker.coordinator.zk_group_configs import ZkGroupConfigs
from kbroker.coordinator.zk_producer_ids import ZkProducerIdBlockAllocator
from kbroker.protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from kbroker.broker.config import KafkaConfig

log = logging.getLogger("kbroker.zookeeper")


class ZkStartupError(OSError):
    """Startup cannot go on (ZooKeeper unreachable, broker.id taken).

    An OSError so that broker.cli reports it as a fatal startup error and exits with status 1.
    """


def _set_or_create(client: KazooClient, path: str, data: bytes) -> None:
    """Write a znode's data, creating it (and its parents) when missing."""
    try:
        client.set(path, data)
    except NoNodeError:
        client.create(path, data, makepath=True)


class ZkMetadataStore:
    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.connect_string = str(config["zookeeper.connect"])
        self.session_timeout_s = config["zookeeper.session.timeout.ms"] / 1000.0
        conn_ms = config["zookeeper.connection.timeout.ms"]
        self.connection_timeout_s = (conn_ms if conn_ms is not None else config["zookeeper.session.timeout.ms"]) / 1000.0
        self.client: KazooClient | None = None

        self.cluster_id = ""
        self.topics: dict[str, TopicRecord] = {}
        # Dynamic broker configs: /config/brokers/<default>, /config/brokers/<this id>, and the two merged (own over
        # default), which is what the broker runs with.
        self.default_broker_configs: dict[str, str] = {}
        self.own_broker_configs: dict[str, str] = {}
        self.broker_configs: dict[str, str] = {}
        # client id (None: the default entity) -> quota key -> value, mirrored from /config/clients
        self.client_quotas: dict[str | None, dict[str, float]] = {}
        self._client_watches: set[str] = set()
        self._group_configs = ZkGroupConfigs()
        self._brokers: dict[int, tuple[dict[str, tuple[str, int]], str | None]] = {}
        # broker id -> broker epoch (czxid of its /brokers/ids/<id>, as Kafka)
        self._broker_epochs: dict[int, int] = {}
        self.broker_epoch = -1
        self._controller: int | None = None
        # Partition states from the controller (or the state znodes until it speaks): (topic, p) -> state.
        self._states: dict[tuple[str, int], PartitionState] = {}
        self._assignments: dict[str, zp.TopicAssignment] = {}
        self.controller_epoch = 0
        self._fed_by_controller = False
        # The controller (coordinator.controller) listens here: ("brokers" | "topic" | "controller", name).
        self.on_cluster_event: Callable[[str, str | None], None] | None = None
        # (epoch, /controller_epoch znode version) once this broker won the election.
        self.on_controller_elected: Callable[[int, int], None] | None = None

        # Server hooks; only called once register_broker() has run (the log manager exists by then).
        self.on_topic_removed: Callable[[TopicRecord], None] | None = None
        self.on_topic_changed: Callable[[TopicRecord], None] | None = None
        self.on_broker_configs_changed: Callable[[], None] | None = None

        self._sync_lock = threading.RLock()
        self._topic_watch_tokens: dict[str, object] = {}
        self._endpoints: dict[str, tuple[str, int]] | None = None
        self._rack: str | None = None
        self._registered = False
        self._notify = False
        self._stopping = False
        self._session_lost = False
        self._was_connected = True

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.client = self._connect()
        client = self.client
        for path in zp.PERSISTENT_PATHS:
            client.ensure_path(path)
        self.cluster_id = self._get_or_create_cluster_id()
        self._check_broker_id_free()
        client.add_listener(self._on_state)
        DataWatch(client, zp.broker_config_path(), self._on_default_broker_config_data)
        DataWatch(client, zp.broker_config_path(str(self.broker_id)), self._on_own_broker_config_data)
        ChildrenWatch(client, zp.BROKER_IDS, self._on_broker_ids)
        ChildrenWatch(client, zp.BROKER_TOPICS, self._on_topic_children)
        ChildrenWatch(client, zp.CONFIG_CLIENTS, self._on_client_children)
        self._group_configs.start(client)
        DataWatch(client, zp.CONTROLLER, self._on_controller_data)
        log.info(
            "Connected to ZooKeeper at %s: cluster id %s, %d topics, live brokers %s, controller %s",
            self.connect_string, self.cluster_id, len(self.topics), sorted(self._brokers), self._controller,
        )

    def _connect(self) -> KazooClient:
        deadline = time.monotonic() + self.connection_timeout_s
        attempt = 0
        while True:
            attempt += 1
            client = KazooClient(
                hosts=self.connect_string,
                timeout=self.session_timeout_s,
                connection_retry=KazooRetry(max_tries=-1, delay=0.2, max_delay=1.0),
                command_retry=KazooRetry(max_tries=3, delay=0.2, max_delay=1.0),
                logger=logging.getLogger("kbroker.kazoo"),
            )
            remaining = deadline - time.monotonic()
            try:
                client.start(timeout=max(0.1, min(1.0, remaining)))
                self._ensure_chroot(client)
                return client
            except KazooTimeoutError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ZkStartupError(
                        f"Timed out waiting for connection to ZooKeeper at {self.connect_string} after "
                        f"{self.connection_timeout_s:.1f} s (zookeeper.connection.timeout.ms); is ZooKeeper running?"
                    ) from None
                log.warning(
                    "ZooKeeper at %s is not reachable (attempt %d); retrying for another %.1f s",
                    self.connect_string, attempt, remaining,
                )

    @staticmethod
    def _ensure_chroot(client: KazooClient) -> None:
        """zookeeper.connect=host:port/chroot: create the chroot if missing, as Kafka does."""
        chroot = client.chroot
        if not chroot:
            return
        client.chroot = ""
        try:
            client.ensure_path(chroot)
        finally:
            client.chroot = chroot

    def stop(self) -> None:
        self._stopping = True
        client = self.client
        if client is None:
            return
        try:
            # Closing the session removes our ephemerals (/brokers/ids/<id>, /controller) at once.
            client.stop()
            client.close()
        except Exception:  # noqa: BLE001
            log.warning("Error while closing the ZooKeeper session", exc_info=True)
        log.info("Closed the ZooKeeper session of broker %d", self.broker_id)

    def _on_state(self, state: str) -> None:
        # Called on kazoo's connection thread: log and hand any ZooKeeper work to another thread.
        if self._stopping:
            return
        if state == KazooState.SUSPENDED:
            self._was_connected = False
            log.warning("Lost the connection to ZooKeeper; serving the metadata already known")
        elif state == KazooState.LOST:
            self._was_connected = False
            self._session_lost = True
            log.warning("ZooKeeper session expired; broker %d will register again on reconnect", self.broker_id)
        elif state == KazooState.CONNECTED and not self._was_connected:
            self._was_connected = True
            log.info("Reconnected to ZooKeeper")
            assert self.client is not None
            self.client.handler.spawn(self._after_reconnect)

    def _after_reconnect(self) -> None:
        if self._stopping:
            return
        try:
            if self._registered:
                self._register()
                self._elect()
            self._resync_all()
            self._session_lost = False
        except Exception:  # noqa: BLE001
            if not self._stopping:
                log.error("Restoring the ZooKeeper registration of broker %d failed", self.broker_id, exc_info=True)

    # ------------------------------------------------------------ cluster id

    def _get_or_create_cluster_id(self) -> str:
        assert self.client is not None
        try:
            self.client.create(zp.CLUSTER_ID, zp.cluster_id_doc(new_cluster_id()), makepath=True)
        except NodeExistsError:
            pass
        data, _ = self.client.get(zp.CLUSTER_ID)
        cid = zp.loads(data).get("id")
        if not cid:
            raise ZkStartupError(f"{zp.CLUSTER_ID} in ZooKeeper holds no cluster id: {data!r}")
        return str(cid)

    # ------------------------------------------------------------ brokers

    def _configured_endpoint(self) -> tuple[str, int]:
        adv = self.config.advertised_listeners[0]
        return adv.host, adv.port

    def _check_broker_id_free(self) -> None:
        """Fail fast, before binding, when a live broker already uses our broker.id.

        A registration with our own endpoint is most likely our previous process, killed before its
        session timed out: wait for the session timeout, then it is gone (or someone else really has it).
        """
        assert self.client is not None
        path = zp.broker_path(self.broker_id)
        started = time.monotonic()
        deadline = started + self.session_timeout_s + 2.0
        waited = False
        while True:
            try:
                data, stat = self.client.get(path)
            except NoNodeError:
                if waited:
                    log.info("The stale registration of broker.id %d expired after %.1f s; starting up",
                             self.broker_id, time.monotonic() - started)
                return
            host, port, _ = zp.parse_broker_registration(data)
            same_endpoint = (host, port) == self._configured_endpoint()
            if not same_endpoint or time.monotonic() >= deadline:
                raise ZkStartupError(self._duplicate_message(host, port, stat.ephemeralOwner))
            if not waited:
                # Said once: ZooKeeper removes the ephemeral only when the old session times out, and
                # nothing here can end that session sooner (it is not ours).
                log.warning(
                    "broker.id %d is still registered at %s:%d by ZooKeeper session 0x%x, most likely this broker's "
                    "previous run that did not shut down cleanly; ZooKeeper removes it when that session times out: "
                    "startup waits up to %.1f s more (zookeeper.session.timeout.ms=%d)",
                    self.broker_id, host, port, stat.ephemeralOwner, deadline - time.monotonic(),
                    int(self.session_timeout_s * 1000),
                )
                waited = True
            time.sleep(0.25)

    def _duplicate_message(self, host: str, port: int, owner: int) -> str:
        return (
            f"broker.id {self.broker_id} is already registered in ZooKeeper at {zp.broker_path(self.broker_id)} "
            f"by another broker ({host}:{port}, session 0x{owner:x}); each broker needs a unique broker.id"
        )

    def register_broker(self, endpoints: dict[str, tuple[str, int]], rack: str | None = None) -> None:
        """Create the ephemeral /brokers/ids/<id> (after the listener is bound) and join the controller election."""
        self._endpoints = dict(endpoints)
        self._rack = rack
        self._register()
        self._registered = True
        self._notify = True
        self._elect()
        log.info("Registered broker %d at %s in ZooKeeper; controller is %s", self.broker_id,
                 ", ".join(f"{n}://{h}:{p}" for n, (h, p) in endpoints.items()), self._controller)

    def _register(self) -> None:
        assert self.client is not None and self._endpoints is not None
        path = zp.broker_path(self.broker_id)
        protocols = self.config["listener.security.protocol.map"]
        doc = zp.broker_registration_doc(self._endpoints, self._rack, protocols)
        try:
            _, stat = self.client.create(path, doc, ephemeral=True, include_data=True)
            self.broker_epoch = stat.czxid
            return
        except NodeExistsError:
            pass
        data, stat = self.client.get(path)
        if stat.ephemeralOwner == self.client.client_id[0]:
            self.client.set(path, doc)  # ours already (a retried create after a connection loss)
            self.broker_epoch = stat.czxid
            return
        h, p, _ = zp.parse_broker_registration(data)
        raise ZkStartupError(self._duplicate_message(h, p, stat.ephemeralOwner))

    def _on_broker_ids(self, children: list[str]) -> None:
        if self._stopping:
            return
        assert self.client is not None
        brokers: dict[int, tuple[dict[str, tuple[str, int]], str | None]] = {}
        epochs: dict[int, int] = {}
        for child in children:
            try:
                data, stat = self.client.get(f"{zp.BROKER_IDS}/{child}")
                brokers[int(child)] = zp.parse_broker_endpoints(data)
                epochs[int(child)] = stat.czxid
            except NoNodeError:
                continue
            except (ValueError, KeyError):
                log.warning("Ignoring unreadable broker registration %s/%s", zp.BROKER_IDS, child)
            except ZookeeperError:
                log.warning("Reading broker registration %s failed", child, exc_info=True)
                return  # keep the last known brokers; the watch fires again once reconnected
        if self._stopping:
            return
        if set(brokers) != set(self._brokers):
            log.info("Live brokers are now %s", sorted(brokers))
        self._brokers = brokers
        self._broker_epochs = epochs
        self._cluster_event("brokers", None)

    def broker_epochs(self) -> dict[int, int]:
        """Registered brokers and their epochs, as the controller sees them."""
        return dict(self._broker_epochs)

    def broker_rack(self, broker_id: int) -> str | None:
        entry = self._brokers.get(broker_id)
        return entry[1] if entry else None

    def broker_listeners(self, broker_id: int) -> dict[str, tuple[str, int]]:
        entry = self._brokers.get(broker_id)
        return dict(entry[0]) if entry else {}

    def _cluster_event(self, kind: str, name: str | None) -> None:
        cb = self.on_cluster_event
        if cb is not None and not self._stopping:
            try:
                cb(kind, name)
            except Exception:  # noqa: BLE001
                log.error("Handling the cluster event %s %s failed", kind, name, exc_info=True)

    def propagate_log_dir_event(self) -> None:
        """Kafka's propagateLogDirEvent: a sequential /log_dir_event_notification child tells the controller that a
        log dir of this broker failed. Written from a thread of its own (the caller holds the replica state lock) and
        retried while ZooKeeper is away, as Kafka's retryRequestUntilConnected."""

        def write() -> None:
            path = f"{zp.LOG_DIR_EVENT_NOTIFICATION}/{zp.LOG_DIR_EVENT_PREFIX}"
            deadline = time.monotonic() + 60
            while not self._stopping and self.client is not None:
                try:
                    created = self.client.create(path, zp.log_dir_event_doc(self.broker_id), sequence=True,
                                                 makepath=True)
                    log.info("Told the controller about the failed log dir (%s)", created)
                    return
                except (ZookeeperError, KazooTimeoutError) as e:
                    if time.monotonic() > deadline:
                        log.error("Could not write the log dir event notification: %s", e)
                        return
                    time.sleep(0.5)

        threading.Thread(target=write, name="log-dir-event", daemon=True).start()

    def live_brokers(self) -> list[int]:
        # This broker serves whatever ZooKeeper currently says (e.g. while its session is being restored).
        return sorted(set(self._brokers) | {self.broker_id})

    def broker_endpoints(self, listener: str) -> list[tuple[int, str, int, str | None]]:
        """(id, host, port, rack) of the live brokers that have the listener (Kafka omits the others)."""
        return [
            (b, *eps[listener], rack) for b, (eps, rack) in sorted(self._brokers.items()) if listener in eps
        ]

    # ------------------------------------------------------------ controller

    def _on_controller_data(self, data: bytes | None, stat: Any) -> None:
        if self._stopping:
            return
        cid = zp.parse_controller(data)
        if cid != self._controller:
            log.info("Controller is now %s", "unknown (election pending)" if cid is None else f"broker {cid}")
        self._controller = cid
        self._cluster_event("controller", None)
        if cid is None and self._registered:
            self._elect()

    def _elect(self) -> None:
        """Kafka's registerControllerAndIncrementControllerEpoch: /controller and /controller_epoch in one
        transaction, the epoch write conditional on the version read, so two winners cannot share an epoch."""
        assert self.client is not None
        client = self.client
        for _ in range(5):
            try:
                try:
                    data, stat = client.get(zp.CONTROLLER_EPOCH)
                    epoch, version = int(data or b"0") + 1, stat.version
                except NoNodeError:
                    try:
                        client.create(zp.CONTROLLER_EPOCH, b"0")
                    except NodeExistsError:
                        pass
                    continue
                tx = client.transaction()
                tx.create(zp.CONTROLLER, zp.controller_doc(self.broker_id), ephemeral=True)
                tx.set_data(zp.CONTROLLER_EPOCH, str(epoch).encode(), version=version)
                results = tx.commit()
            except ZookeeperError:
                log.warning("Controller election failed", exc_info=True)
                return
            if isinstance(results[0], NodeExistsError):
                try:
                    data, _ = client.get(zp.CONTROLLER)
                    self._controller = zp.parse_controller(data)
                except NoNodeError:
                    pass  # gone again: the data watch fires and we try once more
                return
            if isinstance(results[1], BadVersionError):
                continue  # another broker bumped the epoch between our read and write
            try:
                self._check_results(results)
            except ZookeeperError:
                log.warning("Controller election failed", exc_info=True)
                return
            self._controller = self.broker_id
            self.controller_epoch = max(self.controller_epoch, epoch)
            log.info("Broker %d is now the controller (controller epoch %d)", self.broker_id, epoch)
            cb = self.on_controller_elected
            if cb is not None:
                cb(epoch, version + 1)
            return

    @property
    def current_controller(self) -> int | None:
        """The broker in /controller, None while an election is pending."""
        return self._controller

    def controller_id(self) -> int:
        """The controller per /controller if it is live, else the lowest live broker id (always a live broker)."""
        live = self.live_brokers()
        c = self._controller
        return c if c is not None and c in live else live[0]

    def answer_state(self) -> tuple[object, ...]:
        """What a Metadata answer reads from this store, as objects that are replaced, never changed in place: the
        same objects (by identity), the same answer (broker/metadata_answers.py). Topics and partition states
        (ZooKeeper watches, UpdateMetadata, LeaderAndIsr) replace `topics`, a broker registration change `_brokers`
        (live brokers, endpoints, racks), an election `_controller`."""
        return (self.topics, self._brokers, self._controller)

    # ------------------------------------------------------------ topics: ZooKeeper -> memory

    def _on_topic_children(self, children: list[str]) -> None:
        if self._stopping:
            return False  # type: ignore[return-value]
        names = set(children)
        with self._sync_lock:
            added = names - set(self._topic_watch_tokens)
            removed = set(self._topic_watch_tokens) - names
            for name in removed:
                self._topic_watch_tokens.pop(name, None)
            for name in added:
                self._topic_watch_tokens[name] = object()
            gone = {n for n in self.topics if n not in names}
        for name in sorted(removed | gone):
            self._resync_topic(name)
        for name in sorted(added):
            self._resync_topic(name)
            self._watch_topic(name, token=self._topic_watch_tokens.get(name))
        return None

    def _watch_topic(self, name: str, token: object | None) -> None:
        if token is None:
            return
        assert self.client is not None
        for path in (zp.topic_path(name), zp.topic_config_path(name)):
            DataWatch(self.client, path, self._topic_watcher(name, token))

    def _topic_watcher(self, name: str, token: object) -> Callable[[bytes | None, Any], bool | None]:
        first = True

        def changed(data: bytes | None, stat: Any) -> bool | None:
            nonlocal first
            if self._stopping or self._topic_watch_tokens.get(name) is not token:
                return False  # topic deleted (or recreated, with a new watch): stop this one
            if first:
                first = False  # the initial call: _on_topic_children has just read the topic
                return None
            self._resync_topic(name)
            return None

        return changed

    def _read_topic(self, name: str) -> TopicRecord | None:
        assert self.client is not None
        try:
            data, stat = self.client.get(zp.topic_path(name))
        except NoNodeError:
            return None
        try:
            cdata, _ = self.client.get(zp.topic_config_path(name))
        except NoNodeError:
            cdata = None
        assignment = zp.parse_topic_assignment(data)
        if assignment.topic_id is None:
            # Written by a tool that assigns no id (pre-2.8 layout): give it one, as Kafka's controller does.
            doc = zp.topic_assignment_doc(new_topic_id(), assignment.replicas, assignment.adding, assignment.removing)
            try:
                self.client.set(zp.topic_path(name), doc, version=stat.version)
            except (BadVersionError, NoNodeError):
                pass
            return self._read_topic(name)
        known = self._assignments.get(name)
        if known is not None and known.topic_id != assignment.topic_id:
            self._forget_topic(name)  # deleted and created again: the old states are not this topic's
        self._assignments[name] = assignment
        if not self._fed_by_controller:
            self._seed_states(name, len(assignment.replicas))
        return TopicRecord(name, assignment.topic_id, self._partition_states(name, assignment),
                           zp.parse_config(cdata))

    def _seed_states(self, name: str, partitions: int) -> None:
        """Until the controller's first request: what the state znodes say (see the module docstring)."""
        assert self.client is not None
        # Pipelined: one round trip's latency for the whole topic.
        pending = [(p, self.client.get_async(zp.partition_state_path(name, p)))
                   for p in range(partitions) if (name, p) not in self._states]
        for p, res in pending:
            try:
                data, stat = res.get()
            except NoNodeError:
                continue
            st = zp.parse_partition_state(data, stat.version)
            if st is not None:
                self._states[(name, p)] = PartitionState(st.leader, st.leader_epoch, st.isr, [], st.version,
                                                         controller_epoch=st.controller_epoch)

    def _partition_states(self, name: str, assignment: zp.TopicAssignment) -> list[PartitionState]:
        out = []
        for p, replicas in enumerate(assignment.replicas):
            st = self._states.get((name, p))
            if st is None:
                out.append(PartitionState.unknown(replicas))
            else:
                # The controller's replicas (its UpdateMetadata is what Kafka's metadata cache serves); the
                # assignment znode's until it has spoken (seeded states carry none).
                out.append(PartitionState(st.leader, st.leader_epoch, list(st.isr), list(st.replicas or replicas),
                                          st.partition_epoch,
                                          assignment.adding.get(p, []), assignment.removing.get(p, []),
                                          st.controller_epoch, list(st.offline_replicas)))
        return out

    # ------------------------------------------------------------ partition states from the controller

    def ensure_topics_known(self, names: set[str]) -> None:
        """Read topics this broker has not seen yet (the controller's request can overtake our watch)."""
        for name in sorted(names - set(self.topics)):
            if self.client is not None and self.client.connected:
                self._resync_topic(name)

    def apply_partition_states(self, controller_epoch: int, states: list[tuple[str, int, PartitionState]]) -> bool:
        """Partition states from the controller's LeaderAndIsr / UpdateMetadata. False (nothing applied) when
        the request comes from an older controller than one already heard from (STALE_CONTROLLER_EPOCH)."""
        with self._sync_lock:
            if controller_epoch < self.controller_epoch:
                return False
            self.controller_epoch = controller_epoch
            self._fed_by_controller = True
            touched: set[str] = set()
            for topic, p, st in states:
                self._states[(topic, p)] = st
                touched.add(topic)
            topics = dict(self.topics)
            for name in touched:
                rec = topics.get(name)
                assignment = self._assignments.get(name)
                if rec is not None and assignment is not None:
                    topics[name] = rec.with_partitions(self._partition_states(name, assignment))
            self.topics = topics
            return True

    def _resync_topic(self, name: str) -> None:
        events: list[tuple[str, TopicRecord]] = []
        try:
            with self._sync_lock:
                new = self._read_topic(name)
                old = self.topics.get(name)
                if new is None:
                    self._forget_topic(name)
                    if old is not None:
                        self._replace_topics(remove=name)
                        events.append(("removed", old))
                elif new != old:
                    if old is not None and old.topic_id != new.topic_id:
                        events.append(("removed", old))
                    self._replace_topics(put=new)
                    events.append(("changed", new))
        except ZookeeperError:
            if not self._stopping:
                log.warning("Reading topic %s from ZooKeeper failed; will retry on reconnect", name, exc_info=True)
            return
        except (ValueError, KeyError, IndexError, TypeError):
            log.error("Topic %s has an unreadable znode in ZooKeeper; ignoring it", name, exc_info=True)
            return
        for kind, rec in events:
            if kind == "removed":
                log.info("Topic %s was deleted (seen in ZooKeeper)", rec.name)
            self._fire(kind, rec)
        self._cluster_event("topic", name)

    def _forget_topic(self, name: str) -> None:
        self._assignments.pop(name, None)
        for key in [k for k in self._states if k[0] == name]:
            del self._states[key]

    def _resync_all(self) -> None:
        assert self.client is not None
        names = set(self.client.get_children(zp.BROKER_TOPICS))
        self._on_topic_children(sorted(names))
        for name in sorted(names):
            self._resync_topic(name)
        self._on_broker_ids(self.client.get_children(zp.BROKER_IDS))
        try:
            data, _ = self.client.get(zp.CONTROLLER)
            self._controller = zp.parse_controller(data)
        except NoNodeError:
            self._controller = None
            if self._registered:
                self._elect()

    def _replace_topics(self, put: TopicRecord | None = None, remove: str | None = None) -> None:
        topics = dict(self.topics)
        if put is not None:
            topics[put.name] = put
        if remove is not None:
            topics.pop(remove, None)
        self.topics = topics

    def _fire(self, kind: str, rec: TopicRecord) -> None:
        if not self._notify:
            return
        cb = self.on_topic_removed if kind == "removed" else self.on_topic_changed
        if cb is None:
            return
        try:
            cb(rec)
        except Exception:  # noqa: BLE001
            log.error("Handling the %s topic %s failed", kind, rec.name, exc_info=True)

    def _on_default_broker_config_data(self, data: bytes | None, stat: Any) -> None:
        self._on_broker_config_data(zp.broker_config_path(), data, own=False)

    def _on_own_broker_config_data(self, data: bytes | None, stat: Any) -> None:
        self._on_broker_config_data(zp.broker_config_path(str(self.broker_id)), data, own=True)

    def _on_broker_config_data(self, path: str, data: bytes | None, own: bool) -> None:
        if self._stopping:
            return
        try:
            configs = zp.parse_config(data)
        except ValueError:
            log.error("Unreadable %s in ZooKeeper: %r", path, data)
            return
        if configs == (self.own_broker_configs if own else self.default_broker_configs):
            return
        self._set_broker_config_views(configs, own)
        if self._notify and self.on_broker_configs_changed is not None:
            try:
                self.on_broker_configs_changed()
            except Exception:  # noqa: BLE001
                log.error("Applying dynamic broker configs failed", exc_info=True)

    def _set_broker_config_views(self, configs: dict[str, str], own: bool) -> None:
        if own:
            self.own_broker_configs = configs
        else:
            self.default_broker_configs = configs
        self.broker_configs = {**self.default_broker_configs, **self.own_broker_configs}

    # ------------------------------------------------------------ client quotas

    @staticmethod
    def _entity_of(child: str) -> str | None:
        return None if child == zp.DEFAULT_BROKER_ENTITY else child

    def _on_client_children(self, children: list[str]) -> None:
        if self._stopping or self.client is None:
            return
        for child in children:
            if child not in self._client_watches:
                self._client_watches.add(child)
                DataWatch(self.client, f"{zp.CONFIG_CLIENTS}/{child}", self._client_watcher(child))
        gone = {self._entity_of(c) for c in self._client_watches - set(children)}
        if gone & set(self.client_quotas):
            self.client_quotas = {k: v for k, v in self.client_quotas.items() if k not in gone}

    def _client_watcher(self, child: str) -> Callable[[bytes | None, Any], bool | None]:
        def changed(data: bytes | None, stat: Any) -> bool | None:
            entity = self._entity_of(child)
            quotas = dict(self.client_quotas)
            if data is None:
                self._client_watches.discard(child)
                quotas.pop(entity, None)
                self.client_quotas = quotas
                return False
            try:
                values = {k: float(v) for k, v in zp.parse_config(data).items()}
            except ValueError:
                log.error("Unreadable client quota config %s/%s: %r", zp.CONFIG_CLIENTS, child, data)
                return None
            self.client_quotas = with_client_quotas(quotas, entity, values)
            return None

        return changed

    def set_client_quotas(self, entity: str | None, values: dict[str, float]) -> None:
        with self._sync_lock:
            client = self._zk()
            path = zp.client_config_path(entity)
            doc = zp.config_doc({k: repr(v) for k, v in values.items()})
            _set_or_create(client, path, doc)
            self._notify_config_change(path.removeprefix("/config/"))
            self.client_quotas = with_client_quotas(self.client_quotas, entity, values)

    @property
    def group_configs(self) -> dict[str, dict[str, str]]:
        """group id -> config overrides, mirrored from /config/groups."""
        return self._group_configs.configs

    def set_group_configs(self, group_id: str, configs: dict[str, str]) -> None:
        with self._sync_lock:
            client = self._zk()
            path = zp.group_config_path(group_id)
            if configs:
                _set_or_create(client, path, zp.config_doc(configs))
            else:
                try:
                    client.delete(path)
                except NoNodeError:
                    pass
            self._group_configs.put(group_id, configs)

    def producer_id_block_source(self) -> ZkProducerIdBlockAllocator:
        """Producer id blocks from /latest_producer_id_block (usable once start() has connected)."""

        def client() -> KazooClient:
            return self._zk()

        return ZkProducerIdBlockAllocator(client, self.broker_id)

    # ------------------------------------------------------------ writes: memory follows ZooKeeper

    def zk_client(self) -> KazooClient:
        """The live session, for other stores that keep their state in the same ZooKeeper (ACLs)."""
        return self._zk()

    def _zk(self) -> KazooClient:
        client = self.client
        if client is None or not client.connected:
            # Retriable for clients: they refresh metadata and try again.
            raise KafkaError(ErrorCode.NOT_CONTROLLER, "ZooKeeper is not reachable from this broker right now")
        return client

    @staticmethod
    def _check_results(results: list[Any]) -> None:
        for r in results:
            if isinstance(r, Exception) and not isinstance(r, RolledBackError):
                raise r

    def _notify_config_change(self, entity_path: str) -> None:
        """Kafka's /config/changes/config_change_<seq>, which Kafka brokers watch for config updates."""
        try:
            self._zk().create(
                f"{zp.CONFIG_CHANGES}/config_change_", zp.config_change_doc(entity_path), sequence=True
            )
        except ZookeeperError:
            log.warning("Could not write a config change notification for %s", entity_path, exc_info=True)

    def create_topic(self, record: TopicRecord) -> None:
        with self._sync_lock:
            client = self._zk()
            name = record.name
            if client.exists(zp.topic_path(name)):
                raise FileExistsError(name)
            tx = client.transaction()
            cfg = zp.topic_config_path(name)
            if client.exists(cfg):
                tx.set_data(cfg, zp.config_doc(record.configs))
            else:
                tx.create(cfg, zp.config_doc(record.configs))
            # As Kafka's AdminZkClient: the assignment only; the controller sees it and writes the partition
            # states (leader, ISR), then tells the replicas with LeaderAndIsr.
            replicas = [list(ps.replicas) for ps in record.partitions]
            tx.create(zp.topic_path(name), zp.topic_assignment_doc(record.topic_id, replicas))
            try:
                self._check_results(tx.commit())
            except NodeExistsError:
                raise FileExistsError(name) from None
            self._forget_topic(name)
            self._assignments[name] = zp.TopicAssignment(record.topic_id, replicas)
            rec = TopicRecord(name, record.topic_id, [PartitionState.unknown(r) for r in replicas],
                              dict(record.configs))
            self._replace_topics(put=rec)

    def _descendants(self, path: str) -> list[str]:
        """path and everything under it, deepest first (the order a transaction must delete them in)."""
        assert self.client is not None
        out: list[str] = []
        try:
            for child in self.client.get_children(path):
                out += self._descendants(f"{path}/{child}")
        except NoNodeError:
            return out
        out.append(path)
        return out

    def delete_topic(self, name: str) -> TopicRecord:
        with self._sync_lock:
            client = self._zk()
            rec = self.topics.get(name)
            if rec is None:
                raise KeyError(name)
            for _ in range(5):
                paths = self._descendants(zp.topic_path(name))
                if not paths:
                    break
                tx = client.transaction()
                for path in paths:
                    tx.delete(path)
                if client.exists(zp.topic_config_path(name)):
                    tx.delete(zp.topic_config_path(name))
                try:
                    self._check_results(tx.commit())
                    break
                except (NoNodeError, ZookeeperError) as e:
                    # The tree changed under us (a concurrent delete or new partitions): look again.
                    log.info("Deleting topic %s raced with another change (%s); retrying", name, type(e).__name__)
            self._replace_topics(remove=name)
            return rec

    def set_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        with self._sync_lock:
            client = self._zk()
            rec = self.topics[name]
            path = zp.topic_config_path(name)
            doc = zp.config_doc(configs)
            _set_or_create(client, path, doc)
            self._notify_config_change(f"topics/{name}")
            self._replace_topics(put=rec.with_configs(configs))

    def add_partitions(self, name: str, assignment: list[list[int]]) -> None:
        """New partitions in the assignment znode; the controller creates their states."""
        with self._sync_lock:
            client = self._zk()
            path = zp.topic_path(name)
            while True:
                data, stat = client.get(path)
                current = zp.parse_topic_assignment(data)
                assert current.topic_id is not None
                replicas = current.replicas + [list(r) for r in assignment]
                try:
                    client.set(path, zp.topic_assignment_doc(current.topic_id, replicas, current.adding,
                                                             current.removing), version=stat.version)
                    break
                except BadVersionError:
                    continue
            self._assignments[name] = zp.TopicAssignment(current.topic_id, replicas, current.adding, current.removing)
            rec = self.topics[name]
            self._replace_topics(put=rec.with_partitions(self._partition_states(name, self._assignments[name])))

    def set_broker_configs(self, configs: dict[str, str], own: bool = False) -> None:
        """The cluster-wide default dynamic configs (/config/brokers/<default>), or with `own` this broker's."""
        entity = str(self.broker_id) if own else zp.DEFAULT_BROKER_ENTITY
        with self._sync_lock:
            client = self._zk()
            _set_or_create(client, zp.broker_config_path(entity), zp.config_doc(configs))
            self._notify_config_change(f"brokers/{entity}")
            self._set_broker_config_views(dict(configs), own)

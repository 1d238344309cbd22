"""KafkaController (ZooKeeper mode): the broker that won /controller owns partition leadership.

It follows Kafka 2.8-3.x: on election (onControllerFailover) it reads every topic's assignment and
partition state from ZooKeeper, tells every live broker (UpdateMetadata) and every replica
(LeaderAndIsr), and elects leaders for partitions without one. Afterwards it reacts to broker
registrations coming and going (/brokers/ids), new topics and partitions (/brokers/topics), and to
requests: ControlledShutdown, AlterPartition (ISR changes from leaders; kbroker uses Kafka's
AlterPartition path, not /isr_change_notification), ElectLeaders and partition reassignments.

Concurrency: like Kafka's ControllerEventManager, every event runs on one thread, in order, so the
context needs no lock. ZooKeeper callbacks and request handlers only enqueue; requests to brokers are
queued per broker by the sender (broker.controller_channel) and never block this thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import BadVersionError, NoNodeError, ZookeeperError
from kazoo.recipe.watchers import ChildrenWatch, DataWatch
from kbroker.coordinator import controller_zk as czk
from kbroker.coordinator import zk_paths as zp
from kbroker.coordinator.controller_context import (
    NO_LEADER,
    ControllerContext,
    Reassignment,
    TopicPartition,
    controlled_shutdown_leader,
    elect_offline,
    imbalanced_partitions,
    initial_state,
    preferred_leader,
    reassign_leader,
    without_replicas,
)
from kbroker.coordinator.controller_requests import LEADER_AND_ISR, BrokerInfo, RequestBatch, Send
from kbroker.coordinator.zk_paths import LeaderIsrState
from kbroker.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from kbroker.coordinator.zk_store import ZkMetadataStore

log = logging.getLogger("kbroker.controller")

PREFERRED, UNCLEAN = 0, 1  # ElectLeaders election types
RETRY_FAILOVER_S = 1.0


@dataclass(frozen=True)
class ControllerConfig:
    unclean_leader_election: bool = False
    auto_leader_rebalance: bool = True
    leader_imbalance_check_interval_s: float = 300.0
    leader_imbalance_per_broker_percentage: int = 10


@dataclass
class IsrUpdate:
    """One partition of an AlterPartition request."""

    topic: str
    partition: int
    leader_epoch: int
    new_isr: list[int]
    partition_epoch: int


@dataclass
class IsrResult:
    error: ErrorCode
    leader: int = NO_LEADER
    leader_epoch: int = -1
    isr: list[int] | None = None
    partition_epoch: int = -1


class KafkaController:
    def __init__(self, broker_id: int, store: ZkMetadataStore, send: Send, broker_info: BrokerInfo,
                 config: ControllerConfig, on_broker_gone: Callable[[int], None] | None = None) -> None:
        self.broker_id = broker_id
        self.store = store
        self._send = send
        self._broker_info = broker_info
        self.config = config
        self._on_broker_gone = on_broker_gone
        self.ctx: ControllerContext | None = None
        self._events: queue.Queue[tuple[Callable[..., Any], tuple[Any, ...]]] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="controller-event-thread", daemon=True)
        self._stopping = False
        self._next_rebalance = 0.0
        # (controller epoch, /controller_epoch version) while this broker holds /controller
        self._seat: tuple[int, int] | None = None
        # Kafka's OfflinePartitionsCount (partitions without a live leader), as of the last event
        self.offline_partitions = 0
        self._reassign_watch = False
        self._log_dir_watch = False
        # partitions this controller moves for /admin/reassign_partitions
        self._zk_reassigning: set[TopicPartition] = set()

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.store.on_cluster_event = self._on_cluster_event
        self.store.on_controller_elected = lambda epoch, version: self._put(self._failover, epoch, version)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._put(lambda: None)
        self._thread.join(timeout=5)

    @property
    def is_active(self) -> bool:
        return self.ctx is not None

    def _put(self, fn: Callable[..., Any], *args: Any) -> None:
        self._events.put((fn, args))

    def _call(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run fn on the event thread; its result (or NOT_CONTROLLER when not active) comes in the future."""
        fut: Future[Any] = Future()

        def run() -> None:
            try:
                fut.set_result(fn(*args))
            except (czk.ControllerMovedError, ZookeeperError):
                # The caller hears NOT_CONTROLLER; the event loop resigns (and retries) as for any event.
                fut.set_exception(NotControllerError())
                raise
            except BaseException as e:
                fut.set_exception(e)
                raise

        self._put(run)
        return fut

    def _run(self) -> None:
        while not self._stopping:
            try:
                fn, args = self._events.get(timeout=self._tick_timeout())
            except queue.Empty:
                fn, args = self._maybe_rebalance, ()
            if self._stopping:
                break
            try:
                fn(*args)
                self._maybe_rebalance()
            except czk.ControllerMovedError:
                log.info("Controller epoch moved on in ZooKeeper: broker %d resigns", self.broker_id)
                self._seat = None
                self._resign()
            except ZookeeperError as e:
                # Connection trouble: the seat (/controller) is still ours unless the session expires, and
                # then the store elects again. Start over from ZooKeeper once it answers.
                seat = self._seat
                log.warning("ZooKeeper error in the controller (%s); taking over again in %.1f s", type(e).__name__,
                            RETRY_FAILOVER_S)
                self._resign()
                if seat is not None:
                    self._retry_failover(*seat)
            except NotControllerError:
                pass  # answered to the caller already
            except Exception:  # noqa: BLE001
                log.exception("Controller event failed")
            self._update_metrics()

    def _update_metrics(self) -> None:
        ctx = self.ctx
        self.offline_partitions = 0 if ctx is None else sum(
            1 for tp, st in ctx.states.items() if not ctx.is_replica_online(st.leader, tp))

    def _retry_failover(self, epoch: int, epoch_zk_version: int) -> None:
        def again() -> None:
            if (self.store.current_controller == self.broker_id and self.ctx is None and not self._stopping
                    and self._seat == (epoch, epoch_zk_version)):
                self._failover(epoch, epoch_zk_version)

        timer = threading.Timer(RETRY_FAILOVER_S, lambda: self._put(again))
        timer.daemon = True
        timer.start()

    def _tick_timeout(self) -> float:
        if self.ctx is None or not self.config.auto_leader_rebalance:
            return 1.0
        return max(0.05, min(1.0, self._next_rebalance - time.monotonic()))

    def _on_cluster_event(self, kind: str, name: str | None) -> None:
        if kind == "brokers":
            self._put(self._broker_change)
        elif kind == "topic" and name is not None:
            self._put(self._topic_change, name)
        elif kind == "controller":
            self._put(self._controller_change)

    # ------------------------------------------------------------ election and resignation

    def _controller_change(self) -> None:
        if self.store.current_controller != self.broker_id:
            if self.ctx is not None or self._seat is not None:
                log.info("Broker %d is no longer the controller", self.broker_id)
            self._seat = None
            self._resign()

    def _resign(self) -> None:
        ctx, self.ctx = self.ctx, None
        if ctx is not None and self._on_broker_gone is not None:
            for b in ctx.live_brokers:
                self._on_broker_gone(b)

    def _failover(self, epoch: int, epoch_zk_version: int) -> None:
        """Kafka's onControllerFailover."""
        t0 = time.monotonic()
        self._seat = (epoch, epoch_zk_version)
        self._zk_reassigning = set()
        client = self.store.client
        assert client is not None
        ctx = ControllerContext(epoch, epoch_zk_version, live_brokers=czk.read_live_brokers(client))
        names = czk.read_topic_names(client)
        assignments = czk.read_assignments(client, names)
        for topic in names:
            self._load_topic(ctx, topic, assignments.get(topic))
        self.ctx = ctx
        # Kafka's onControllerFailover tells every live broker of the live brokers first, in a round of its own:
        # a Kafka broker does not follow a leader its metadata cache lacks (see _send_startup_metadata).
        first = self._batch()
        first.add_update_metadata(sorted(ctx.live_brokers), [])
        first.send(ctx, self._broker_info, self._send)
        batch = self._batch()
        # New partitions get their first state; partitions whose leader is gone get a new one.
        self._init_new_partitions(ctx.partitions(), batch)
        # Brokers that died while no controller was watching (often the previous controller itself) leave
        # the ISRs now, as if their failure had been seen.
        gone = {b for st in ctx.states.values() for b in (*st.isr, st.leader) if b >= 0 and not ctx.is_live(b)}
        if gone:
            self._on_replicas_offline(gone, batch)
        self._elect_offline(batch)
        for tp in ctx.partitions():
            replicas = ctx.replicas(tp)
            if tp in ctx.states:
                batch.add_leader_and_isr([b for b in replicas if ctx.is_live(b)], tp)
        batch.add_update_metadata(sorted(ctx.live_brokers), None)
        batch.send(ctx, self._broker_info, self._send)
        for tp, r in list(ctx.reassignments.items()):
            self._continue_reassignment(tp, r)
        self._watch_reassign_znode()
        self._zk_reassign()
        # Kafka's onControllerFailover deletes every pending log dir event: the LeaderAndIsr just sent to every
        # replica finds the failed dirs anyway (their answers are KAFKA_STORAGE_ERROR).
        self._delete_log_dir_events(czk.read_log_dir_events(client))
        self._watch_log_dir_events()
        self._next_rebalance = time.monotonic() + self.config.leader_imbalance_check_interval_s
        log.info("Controller %d (epoch %d) took over in %.0f ms: %d partitions, live brokers %s",
                 self.broker_id, epoch, (time.monotonic() - t0) * 1000, len(ctx.states), sorted(ctx.live_brokers))

    def _load_topic(self, ctx: ControllerContext, topic: str, assignment: zp.TopicAssignment | None) -> None:
        client = self.store.client
        assert client is not None
        if assignment is None or assignment.topic_id is None:
            return
        ctx.topic_ids[topic] = assignment.topic_id
        ctx.assignments[topic] = [list(r) for r in assignment.replicas]
        for p, st in czk.read_states(client, topic, len(assignment.replicas)).items():
            ctx.states[(topic, p)] = st
        for p in set(assignment.adding) | set(assignment.removing):
            replicas = assignment.replicas[p]
            adding, removing = assignment.adding.get(p, []), assignment.removing.get(p, [])
            original = [b for b in replicas if b not in adding]
            target = [b for b in replicas if b not in removing]
            ctx.reassignments[(topic, p)] = Reassignment(original, target)

    def _batch(self) -> RequestBatch:
        return RequestBatch(self.broker_id)

    # ------------------------------------------------------------ partition state changes

    def _write_states(self, updates: dict[TopicPartition, LeaderIsrState]) -> dict[TopicPartition, LeaderIsrState]:
        """Conditional writes; a partition whose znode changed meanwhile is read again and left for the caller's
        next round (Kafka retries the same way)."""
        ctx = self.ctx
        client = self.store.client
        assert ctx is not None and client is not None
        done, stale = czk.update_leader_and_isr(client, ctx.epoch_zk_version, updates)
        ctx.states.update(done)
        for topic, p in stale:
            fresh = czk.read_states(client, topic, p + 1).get(p)
            if fresh is not None:
                ctx.states[(topic, p)] = fresh
            log.warning("Partition state of %s-%d changed under the controller; read it again", topic, p)
        return done

    def _init_new_partitions(self, tps: list[TopicPartition], batch: RequestBatch) -> None:
        """NewPartition -> OnlinePartition for partitions without a state znode."""
        ctx = self.ctx
        client = self.store.client
        assert ctx is not None and client is not None
        live = set(ctx.live_brokers)
        by_topic: dict[str, dict[int, LeaderIsrState]] = {}
        for tp in tps:
            if tp in ctx.states:
                continue
            st = initial_state(ctx.replicas(tp), live, ctx.epoch)
            if st is None:
                log.error("No live replica of %s-%d among %s: it stays without a leader", tp[0], tp[1], ctx.replicas(tp))
                continue
            by_topic.setdefault(tp[0], {})[tp[1]] = st
        for topic, states in by_topic.items():
            created = czk.create_states(client, ctx.epoch_zk_version, topic, states)
            missing = set(states) - set(created)
            if missing:
                created.update({p: st for p, st in czk.read_states(client, topic, max(missing) + 1).items()
                                if p in missing})
            for p, st in created.items():
                ctx.states[(topic, p)] = st
                batch.add_leader_and_isr([b for b in ctx.replicas((topic, p)) if ctx.is_live(b)], (topic, p),
                                         is_new=True)
            if created:
                log.info("Partitions %s of %s are online: leaders %s", sorted(created), topic,
                         {p: st.leader for p, st in sorted(created.items())})

    def _elect_offline(self, batch: RequestBatch, only: set[TopicPartition] | None = None) -> None:
        """Kafka's triggerOnlinePartitionStateChange: a leader for every partition whose leader is not live."""
        ctx = self.ctx
        assert ctx is not None
        updates: dict[TopicPartition, LeaderIsrState] = {}
        for tp, st in ctx.states.items():
            if only is not None and tp not in only:
                continue
            if ctx.is_replica_online(st.leader, tp) and st.leader not in ctx.shutting_down:
                continue
            new = elect_offline(st, ctx.replicas(tp), ctx.eligible_replicas(tp), self._unclean(tp), ctx.epoch)
            if new is not None:
                updates[tp] = new
        self._apply(updates, batch, "offline partition election")

    def _unclean(self, tp: TopicPartition) -> bool:
        rec = self.store.topics.get(tp[0])
        value = rec.configs.get("unclean.leader.election.enable") if rec is not None else None
        if value is None:
            value = self.store.broker_configs.get("unclean.leader.election.enable")
        return self.config.unclean_leader_election if value is None else value.strip().lower() == "true"

    def _apply(self, updates: dict[TopicPartition, LeaderIsrState], batch: RequestBatch, why: str) -> None:
        if not updates:
            return
        ctx = self.ctx
        assert ctx is not None
        done = self._write_states(updates)
        for tp, st in done.items():
            batch.add_leader_and_isr(ctx.online_replicas(tp), tp)
            log.info("%s-%d: leader %d, leader epoch %d, ISR %s (%s)", tp[0], tp[1], st.leader, st.leader_epoch,
                     st.isr, why)

    # ------------------------------------------------------------ brokers

    def _broker_change(self) -> None:
        """Kafka's BrokerChange: failures first (onBrokerFailure), then new and bounced brokers (onBrokerStartup)."""
        ctx = self.ctx
        if ctx is None:
            return
        assert self.store.client is not None
        now = czk.read_live_brokers(self.store.client)
        old = ctx.live_brokers
        dead = {b for b in old if b not in now}
        bounced = {b for b in old if b in now and now[b] != old[b]}
        new = {b for b in now if b not in old}
        if not (dead or bounced or new):
            return
        log.info("Brokers changed: new %s, dead %s, bounced %s", sorted(new), sorted(dead), sorted(bounced))
        batch = self._batch()
        gone = dead | bounced
        if gone:
            for b in gone:
                ctx.live_brokers.pop(b, None)
                ctx.shutting_down.discard(b)
                ctx.replicas_on_offline_dirs.pop(b, None)
                if self._on_broker_gone is not None:
                    self._on_broker_gone(b)
            self._on_replicas_offline(gone, batch)
        arrived = new | bounced
        if arrived and gone:
            # The failures' round goes before the arrivals are live: their first request is UpdateMetadata.
            batch.send(ctx, self._broker_info, self._send)
            batch = self._batch()
        for b in arrived:
            ctx.live_brokers[b] = now[b]
            # A broker that registers again starts from its dirs as they are now: its LeaderAndIsr answers say.
            ctx.replicas_on_offline_dirs.pop(b, None)
        if arrived:
            self._send_startup_metadata(arrived)
            for tp in ctx.partitions():
                hosted = [b for b in ctx.replicas(tp) if b in arrived]
                if hosted and tp in ctx.states:
                    batch.add_leader_and_isr(hosted, tp)
            self._init_new_partitions([tp for tp in ctx.partitions() if tp not in ctx.states], batch)
            self._elect_offline(batch)
        batch.add_update_metadata(sorted(ctx.live_brokers), [])
        batch.send(ctx, self._broker_info, self._send)
        if arrived:
            for tp, r in list(ctx.reassignments.items()):
                if set(r.target) & arrived:
                    self._continue_reassignment(tp, r)

    def _send_startup_metadata(self, arrived: set[int]) -> None:
        """Kafka's onBrokerStartup: UpdateMetadata before any LeaderAndIsr, in rounds of their own; the brokers
        already there learn of the new ones, the new ones of every partition. A Kafka broker answers a LeaderAndIsr
        naming a leader its metadata cache lacks with "cannot become follower since the new leader is
        unavailable" and does not follow until the next LeaderAndIsr, which may never come."""
        ctx = self.ctx
        assert ctx is not None
        existing = self._batch()
        existing.add_update_metadata(sorted(set(ctx.live_brokers) - arrived), [])
        existing.send(ctx, self._broker_info, self._send)
        newcomers = self._batch()
        newcomers.add_update_metadata(sorted(arrived), None)
        newcomers.send(ctx, self._broker_info, self._send)

    def _on_replicas_offline(self, gone: set[int], batch: RequestBatch) -> None:
        """Kafka's onReplicasBecomeOffline: new leaders where the leader went, then the gone replicas leave
        every ISR (a partition left with no live ISR member keeps leader -1 until one returns)."""
        ctx = self.ctx
        assert ctx is not None
        affected = {tp for tp, st in ctx.states.items() if st.leader in gone}
        self._elect_offline(batch, only=affected)
        updates = {tp: without_replicas(st, gone, ctx.epoch) for tp, st in ctx.states.items()
                   if set(st.isr) & gone or st.leader in gone}
        self._apply(updates, batch, f"brokers {sorted(gone)} offline")
        for tp in affected | set(updates):
            batch.update_metadata_partitions.add(tp)

    # ------------------------------------------------------------ failed log dirs

    def _watch_log_dir_events(self) -> None:
        """Kafka's LogDirEventNotificationHandler: a broker whose log dir failed adds a child to
        /log_dir_event_notification."""
        if self._log_dir_watch:
            return
        self._log_dir_watch = True
        client = self.store.client
        assert client is not None

        def changed(children: list[str]) -> None:
            if children and not self._stopping:
                self._put(self._log_dir_event_notification)

        ChildrenWatch(client, zp.LOG_DIR_EVENT_NOTIFICATION, changed)

    def _log_dir_event_notification(self) -> None:
        """Kafka's processLogDirEventNotification: the brokers named by the notifications are asked about every
        replica they host, and the notifications are deleted."""
        ctx = self.ctx
        client = self.store.client
        if ctx is None or client is None:
            return
        events = czk.read_log_dir_events(client)
        if not events:
            return
        try:
            brokers = sorted({b for b in events.values() if b is not None})
            self._on_broker_log_dir_failure(brokers)
        finally:
            self._delete_log_dir_events(events)

    def _delete_log_dir_events(self, events: dict[str, int | None]) -> None:
        ctx = self.ctx
        client = self.store.client
        if ctx is not None and client is not None and events:
            czk.delete_log_dir_events(client, ctx.epoch_zk_version, list(events))

    def _on_broker_log_dir_failure(self, brokers: list[int]) -> None:
        """Kafka's onBrokerLogDirFailure: LeaderAndIsr for every replica on those brokers (OnlineReplica ->
        OnlineReplica); their answers name the replicas in failed dirs (KAFKA_STORAGE_ERROR)."""
        ctx = self.ctx
        assert ctx is not None
        live = [b for b in brokers if ctx.is_live(b)]
        log.info("Handling log dir failure for brokers %s", live)
        batch = self._batch()
        for b in live:
            for tp in ctx.partitions_on(b):
                if tp in ctx.states:
                    batch.leader_and_isr.setdefault(b, {})[tp] = False
        batch.send(ctx, self._broker_info, self._send)

    def on_broker_response(self, broker_id: int, api_key: int, response: Any) -> None:
        """A broker's answer to one of this controller's requests (from the request queues' loop)."""
        if api_key == LEADER_AND_ISR and not self._stopping:
            self._put(self._leader_and_isr_response, broker_id, response)

    def _leader_and_isr_response(self, broker_id: int, response: Any) -> None:
        """Kafka's processLeaderAndIsrResponseReceived: replicas answered with KAFKA_STORAGE_ERROR are in a failed
        log dir and go offline; replicas answered without an error are online again."""
        ctx = self.ctx
        if ctx is None or not ctx.is_live(broker_id):
            return
        if response.error_code:
            return  # logged by the request queue; Kafka ignores such an answer too
        names = {tid: name for name, tid in ctx.topic_ids.items()}
        answers: list[tuple[TopicPartition, int]] = []
        for t in getattr(response, "topics", None) or []:
            name = names.get(t.topic_id)
            if name is not None:
                answers += [((name, pe.partition_index), pe.error_code) for pe in t.partition_errors]
        for pe in getattr(response, "partition_errors", None) or []:
            answers.append(((pe.topic_name, pe.partition_index), pe.error_code))
        previous = ctx.replicas_on_offline_dirs.get(broker_id, set())
        current = set(previous)
        for tp, code in answers:
            if code == ErrorCode.KAFKA_STORAGE_ERROR:
                current.add(tp)
            elif code == ErrorCode.NONE:
                current.discard(tp)
        if current:
            ctx.replicas_on_offline_dirs[broker_id] = current
        else:
            ctx.replicas_on_offline_dirs.pop(broker_id, None)
        new = {tp for tp in current - previous if tp in ctx.states}
        if new:
            log.info("Replicas of broker %d in a failed log dir are offline: %s", broker_id,
                     ", ".join(f"{t}-{p}" for t, p in sorted(new)[:8]) + ("..." if len(new) > 8 else ""))
            self._on_offline_dir_replicas(broker_id, new)

    def _on_offline_dir_replicas(self, broker_id: int, tps: set[TopicPartition]) -> None:
        """Kafka's onReplicasBecomeOffline for replicas of one broker: partitions it led elect a leader among the
        online ISR members, and the replicas leave every ISR (OfflineReplica: StopReplica without deletion)."""
        ctx = self.ctx
        assert ctx is not None
        batch = self._batch()
        self._elect_offline(batch, only={tp for tp in tps if ctx.states[tp].leader == broker_id})
        updates = {tp: without_replicas(ctx.states[tp], {broker_id}, ctx.epoch) for tp in tps
                   if tp in ctx.states and (broker_id in ctx.states[tp].isr or ctx.states[tp].leader == broker_id)}
        self._apply(updates, batch, f"replica of broker {broker_id} in a failed log dir")
        for tp in tps:
            batch.add_stop_replica([broker_id], tp, delete=False)
        batch.add_update_metadata(sorted(ctx.live_brokers), sorted(tps))
        batch.send(ctx, self._broker_info, self._send)

    # ------------------------------------------------------------ topics

    def _topic_change(self, topic: str) -> None:
        """A topic's assignment znode appeared, changed or went: new partitions come online."""
        ctx = self.ctx
        client = self.store.client
        if ctx is None or client is None:
            return
        assignment = czk.read_assignment(client, topic)
        if assignment is None or assignment.topic_id is None:
            if topic in ctx.assignments:
                log.info("Topic %s deleted", topic)
                for p in range(len(ctx.assignments[topic])):
                    ctx.states.pop((topic, p), None)
                    ctx.reassignments.pop((topic, p), None)
                del ctx.assignments[topic]
                ctx.topic_ids.pop(topic, None)
                for offline in ctx.replicas_on_offline_dirs.values():
                    offline.difference_update([tp for tp in offline if tp[0] == topic])
            return
        if ctx.topic_ids.get(topic) not in (None, assignment.topic_id):
            for p in range(len(ctx.assignments.get(topic, []))):
                ctx.states.pop((topic, p), None)
        known = ctx.assignments.get(topic, [])
        ctx.topic_ids[topic] = assignment.topic_id
        ctx.assignments[topic] = [list(r) for r in assignment.replicas]
        new = [(topic, p) for p in range(len(assignment.replicas)) if (topic, p) not in ctx.states]
        if not new and known == ctx.assignments[topic]:
            return
        if new:
            existing = czk.read_states(client, topic, len(assignment.replicas))
            for p, st in existing.items():
                ctx.states.setdefault((topic, p), st)
        batch = self._batch()
        self._init_new_partitions([tp for tp in new if tp not in ctx.states], batch)
        for tp in new:
            if tp in ctx.states:
                batch.add_leader_and_isr(ctx.online_replicas(tp), tp)
        batch.send(ctx, self._broker_info, self._send)

    # ------------------------------------------------------------ requests (called from handlers)

    def controlled_shutdown(self, broker_id: int, broker_epoch: int) -> Future[tuple[ErrorCode, list[TopicPartition]]]:
        return self._call(self._controlled_shutdown, broker_id, broker_epoch)

    def _controlled_shutdown(self, broker_id: int, broker_epoch: int) -> tuple[ErrorCode, list[TopicPartition]]:
        """Kafka's doControlledShutdown: move the leaderships of a stopping broker to other ISR members and
        take it out of every ISR; answer with the partitions it still leads."""
        ctx = self.ctx
        if ctx is None:
            return ErrorCode.NOT_CONTROLLER, []
        if broker_id not in ctx.live_brokers:
            return ErrorCode.BROKER_NOT_AVAILABLE, []
        if broker_epoch != -1 and broker_epoch < ctx.live_brokers[broker_id]:
            return ErrorCode.STALE_BROKER_EPOCH, []
        ctx.shutting_down.add(broker_id)
        batch = self._batch()
        leader_moves: dict[TopicPartition, LeaderIsrState] = {}
        isr_removals: dict[TopicPartition, LeaderIsrState] = {}
        for tp in ctx.partitions_on(broker_id):
            st = ctx.states.get(tp)
            replicas = ctx.replicas(tp)
            if st is None or len(replicas) < 2:
                continue
            if st.leader == broker_id:
                leader = controlled_shutdown_leader(replicas, st.isr, set(ctx.online_replicas(tp)), ctx.shutting_down)
                if leader is not None:
                    isr = [b for b in st.isr if b not in ctx.shutting_down]
                    leader_moves[tp] = LeaderIsrState(leader, st.leader_epoch + 1, isr, ctx.epoch, st.version)
            elif broker_id in st.isr and len(st.isr) > 1:
                isr_removals[tp] = without_replicas(st, {broker_id}, ctx.epoch)
                batch.add_stop_replica([broker_id], tp, delete=False)
        self._apply({**leader_moves, **isr_removals}, batch, f"controlled shutdown of broker {broker_id}")
        batch.send(ctx, self._broker_info, self._send)
        remaining = [tp for tp in ctx.partitions_on(broker_id)
                     if tp in ctx.states and ctx.states[tp].leader == broker_id and len(ctx.replicas(tp)) > 1]
        log.info("Controlled shutdown of broker %d: %d leaderships moved, %d remain", broker_id, len(leader_moves),
                 len(remaining))
        return ErrorCode.NONE, remaining

    def alter_partition(self, broker_id: int, broker_epoch: int,
                        updates: list[IsrUpdate]) -> Future[tuple[ErrorCode, list[IsrResult]]]:
        return self._call(self._alter_partition, broker_id, broker_epoch, updates)

    def _alter_partition(self, broker_id: int, broker_epoch: int,
                         updates: list[IsrUpdate]) -> tuple[ErrorCode, list[IsrResult]]:
        """Kafka's ZK-mode processAlterPartition: ISR changes from a leader, checked against the leader epoch
        and the partition epoch (the state znode version), written conditionally."""
        ctx = self.ctx
        if ctx is None:
            return ErrorCode.NOT_CONTROLLER, []
        if broker_id not in ctx.live_brokers or (broker_epoch != -1 and broker_epoch != ctx.live_brokers[broker_id]):
            return ErrorCode.STALE_BROKER_EPOCH, []
        results: list[IsrResult] = []
        writes: dict[TopicPartition, LeaderIsrState] = {}
        index: dict[TopicPartition, int] = {}
        for u in updates:
            tp = (u.topic, u.partition)
            st = ctx.states.get(tp)
            res = IsrResult(ErrorCode.NONE)
            results.append(res)
            if st is None:
                res.error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif st.leader != broker_id:
                res.error = ErrorCode.NOT_LEADER_OR_FOLLOWER
            elif u.leader_epoch != st.leader_epoch:
                res.error = ErrorCode.FENCED_LEADER_EPOCH
            elif u.partition_epoch < st.version:
                res.error = ErrorCode.INVALID_UPDATE_VERSION
            elif sorted(u.new_isr) == sorted(st.isr):
                res.leader, res.leader_epoch, res.isr, res.partition_epoch = st.leader, st.leader_epoch, st.isr, st.version
            elif any(not ctx.is_eligible(b) or not ctx.is_replica_online(b, tp) or b not in ctx.replicas(tp)
                     for b in u.new_isr if b != broker_id):
                res.error = ErrorCode.INELIGIBLE_REPLICA
            elif broker_id not in u.new_isr:
                res.error = ErrorCode.INVALID_REQUEST
            else:
                writes[tp] = LeaderIsrState(st.leader, st.leader_epoch, list(u.new_isr), ctx.epoch, st.version)
                index[tp] = len(results) - 1
        done = self._write_states(writes)
        batch = self._batch()
        for tp, i in index.items():
            res = results[i]
            st = done.get(tp)
            if st is None:
                res.error = ErrorCode.INVALID_UPDATE_VERSION
                continue
            res.leader, res.leader_epoch, res.isr, res.partition_epoch = st.leader, st.leader_epoch, st.isr, st.version
            log.info("%s-%d: ISR %s (AlterPartition from leader %d, partition epoch %d)", tp[0], tp[1], st.isr,
                     broker_id, st.version)
        batch.add_update_metadata(sorted(ctx.live_brokers), list(done))
        batch.send(ctx, self._broker_info, self._send)
        for tp in done:
            r = ctx.reassignments.get(tp)
            if r is not None:
                self._continue_reassignment(tp, r)
        return ErrorCode.NONE, results

    def elect_leaders(self, election_type: int,
                      partitions: list[TopicPartition] | None) -> Future[dict[TopicPartition, tuple[ErrorCode, str | None]]]:
        return self._call(self._elect_leaders, election_type, partitions)

    def _elect_leaders(self, election_type: int, partitions: list[TopicPartition] | None
                       ) -> dict[TopicPartition, tuple[ErrorCode, str | None]]:
        ctx = self.ctx
        if ctx is None:
            return {tp: (ErrorCode.NOT_CONTROLLER, None) for tp in partitions or []}
        out: dict[TopicPartition, tuple[ErrorCode, str | None]] = {}
        updates: dict[TopicPartition, LeaderIsrState] = {}
        for tp in partitions if partitions is not None else ctx.partitions():
            st = ctx.states.get(tp)
            replicas = ctx.replicas(tp)
            live = ctx.eligible_replicas(tp)
            if st is None or not replicas:
                out[tp] = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "The partition does not exist.")
                continue
            if election_type == PREFERRED:
                if st.leader == replicas[0]:
                    out[tp] = (ErrorCode.ELECTION_NOT_NEEDED, "Leader election not needed for topic partition.")
                    continue
                leader = preferred_leader(replicas, st.isr, live)
                if leader is None:
                    out[tp] = (ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
                               f"Failed to elect leader for partition {tp[0]}-{tp[1]} under strategy "
                               f"PreferredReplicaPartitionLeaderElectionStrategy")
                    continue
                updates[tp] = LeaderIsrState(leader, st.leader_epoch + 1, list(st.isr), ctx.epoch, st.version)
            else:
                if st.leader in live:
                    out[tp] = (ErrorCode.ELECTION_NOT_NEEDED, "Leader election not needed for topic partition.")
                    continue
                new = elect_offline(st, replicas, live, True, ctx.epoch)
                if new is None:
                    out[tp] = (ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
                               f"Failed to elect leader for partition {tp[0]}-{tp[1]} under strategy "
                               f"OfflinePartitionLeaderElectionStrategy(true)")
                    continue
                updates[tp] = new
        batch = self._batch()
        done = self._write_states(updates)
        for tp, st in done.items():
            batch.add_leader_and_isr(ctx.online_replicas(tp), tp)
            log.info("%s-%d: leader %d, leader epoch %d (%s election)", tp[0], tp[1], st.leader, st.leader_epoch,
                     "preferred" if election_type == PREFERRED else "unclean")
            out[tp] = (ErrorCode.NONE, None)
        for tp in set(updates) - set(done):
            out[tp] = (ErrorCode.UNKNOWN_SERVER_ERROR, "The partition state changed during the election; retry.")
        batch.send(ctx, self._broker_info, self._send)
        return out

    def _maybe_rebalance(self) -> None:
        ctx = self.ctx
        if ctx is None or not self.config.auto_leader_rebalance or time.monotonic() < self._next_rebalance:
            return
        self._next_rebalance = time.monotonic() + self.config.leader_imbalance_check_interval_s
        tps = imbalanced_partitions(ctx, self.config.leader_imbalance_per_broker_percentage)
        if tps:
            log.info("Auto leader rebalance: preferred leaders for %d partitions", len(tps))
            self._elect_leaders(PREFERRED, tps)

    # ------------------------------------------------------------ reassignments

    def alter_reassignments(self, targets: dict[TopicPartition, list[int] | None]
                            ) -> Future[dict[TopicPartition, tuple[ErrorCode, str | None]]]:
        return self._call(self._alter_reassignments, targets)

    def _alter_reassignments(self, targets: dict[TopicPartition, list[int] | None]
                             ) -> dict[TopicPartition, tuple[ErrorCode, str | None]]:
        ctx = self.ctx
        if ctx is None:
            return {tp: (ErrorCode.NOT_CONTROLLER, None) for tp in targets}
        out: dict[TopicPartition, tuple[ErrorCode, str | None]] = {}
        for tp, target in targets.items():
            replicas = ctx.replicas(tp)
            if not replicas or tp not in ctx.states:
                out[tp] = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "The partition does not exist.")
                continue
            ongoing = ctx.reassignments.get(tp)
            if target is None:
                if ongoing is None:
                    out[tp] = (ErrorCode.NO_REASSIGNMENT_IN_PROGRESS,
                               f"Unable to find an ongoing reassignment for partition {tp[0]}-{tp[1]}")
                    continue
                self._finish_reassignment(tp, ongoing.original, cancelled=True)
                out[tp] = (ErrorCode.NONE, None)
                continue
            problem = self._check_target(target)
            if problem is not None:
                out[tp] = (ErrorCode.INVALID_REPLICA_ASSIGNMENT, problem)
                continue
            original = ongoing.original if ongoing is not None else replicas
            r = Reassignment(list(original), list(target))
            self._start_reassignment(tp, r)
            out[tp] = (ErrorCode.NONE, None)
        return out

    def _check_target(self, target: list[int]) -> str | None:
        ctx = self.ctx
        assert ctx is not None
        if not target:
            return "The replica list cannot be empty."
        if len(set(target)) != len(target):
            return "The proposed assignment contains duplicate replicas."
        unknown = [b for b in target if b not in ctx.live_brokers]
        if unknown:
            return f"The proposed assignment contains non-live brokers: {unknown}"
        return None

    def list_reassignments(self, partitions: list[TopicPartition] | None) -> Future[dict[TopicPartition, Reassignment]]:
        return self._call(self._list_reassignments, partitions)

    def _list_reassignments(self, partitions: list[TopicPartition] | None) -> dict[TopicPartition, Reassignment]:
        ctx = self.ctx
        if ctx is None:
            raise NotControllerError()
        if partitions is None:
            return dict(ctx.reassignments)
        return {tp: ctx.reassignments[tp] for tp in partitions if tp in ctx.reassignments}

    def _write_assignment(self, topic: str) -> None:
        ctx = self.ctx
        client = self.store.client
        assert ctx is not None and client is not None
        adding = {p: r.adding for (t, p), r in ctx.reassignments.items() if t == topic}
        removing = {p: r.removing for (t, p), r in ctx.reassignments.items() if t == topic}
        czk.write_assignment(client, ctx.epoch_zk_version, topic, ctx.topic_ids[topic], ctx.assignments[topic],
                             adding, removing)

    def _start_reassignment(self, tp: TopicPartition, r: Reassignment) -> None:
        """Kafka's onPartitionReassignment, first half: RS = target + original in the assignment znode with the
        adding and removing replicas, a leader epoch bump, and LeaderAndIsr to every replica of RS so new ones
        start following."""
        ctx = self.ctx
        assert ctx is not None
        if r.target == ctx.replicas(tp) and tp not in ctx.reassignments:
            return
        ctx.reassignments[tp] = r
        ctx.assignments[tp[0]][tp[1]] = r.replicas
        self._write_assignment(tp[0])
        st = ctx.states[tp]
        batch = self._batch()
        done = self._write_states({tp: LeaderIsrState(st.leader, st.leader_epoch + 1, list(st.isr), ctx.epoch,
                                                      st.version)})
        if tp in done:
            online = [b for b in r.replicas if ctx.is_replica_online(b, tp)]
            batch.add_leader_and_isr([b for b in online if b not in r.adding], tp, is_new=False)
            # NewReplica (Kafka's isNew): the only replicas whose logs may be created while a log dir is offline
            batch.add_leader_and_isr([b for b in online if b in r.adding], tp, is_new=True)
        batch.send(ctx, self._broker_info, self._send)
        log.info("Reassignment of %s-%d to %s started: adding %s, removing %s", tp[0], tp[1], r.target, r.adding,
                 r.removing)
        self._continue_reassignment(tp, r)

    def _continue_reassignment(self, tp: TopicPartition, r: Reassignment) -> None:
        ctx = self.ctx
        assert ctx is not None
        st = ctx.states.get(tp)
        if st is not None and all(b in st.isr for b in r.target):
            self._finish_reassignment(tp, r.target, cancelled=False)

    def _finish_reassignment(self, tp: TopicPartition, target: list[int], cancelled: bool) -> None:
        """Second half: every target replica is in the ISR (or the reassignment is cancelled). The leader
        moves into the target if needed, the ISR keeps only target replicas, the removed replicas stop and
        are deleted, and the assignment znode holds the target alone."""
        ctx = self.ctx
        assert ctx is not None
        st = ctx.states[tp]
        previous = ctx.replicas(tp)
        removed = [b for b in previous if b not in target]
        live = ctx.eligible_replicas(tp)
        isr = [b for b in st.isr if b in target] or [b for b in target if b in live][:1]
        leader = st.leader if st.leader in target and st.leader in live else reassign_leader(target, isr, live)
        if leader is None:
            leader = NO_LEADER
        batch = self._batch()
        done = self._write_states({tp: LeaderIsrState(leader, st.leader_epoch + 1, isr, ctx.epoch, st.version)})
        if tp not in done:
            return  # read again; the next ISR change or request finishes it
        ctx.reassignments.pop(tp, None)
        ctx.assignments[tp[0]][tp[1]] = list(target)
        self._write_assignment(tp[0])
        batch.add_leader_and_isr([b for b in target if ctx.is_replica_online(b, tp)], tp)
        batch.add_update_metadata(sorted(ctx.live_brokers), [tp])
        for b in removed:
            batch.add_stop_replica([b], tp, delete=True)
        batch.send(ctx, self._broker_info, self._send)
        log.info("Reassignment of %s-%d %s: replicas %s, leader %d, ISR %s", tp[0], tp[1],
                 "cancelled" if cancelled else "completed", target, leader, isr)
        if tp in self._zk_reassigning:
            self._drop_from_reassign_znode({tp})

    # ------------------------------------------------------------ /admin/reassign_partitions

    def _watch_reassign_znode(self) -> None:
        """Tools of the ZooKeeper era (kafka-reassign-partitions --zookeeper) write /admin/reassign_partitions;
        Kafka's controller still executes it, removing each partition once its reassignment completes."""
        if self._reassign_watch:
            return
        self._reassign_watch = True
        client = self.store.client
        assert client is not None

        def changed(data: bytes | None, stat: Any) -> None:
            if data is not None and not self._stopping:
                self._put(self._zk_reassign)

        DataWatch(client, zp.REASSIGN_PARTITIONS, changed)

    def _zk_reassign(self) -> None:
        ctx = self.ctx
        client = self.store.client
        if ctx is None or client is None:
            return
        try:
            data, _ = client.get(zp.REASSIGN_PARTITIONS)
        except NoNodeError:
            return
        try:
            targets = zp.parse_reassign_partitions(data)
        except (ValueError, KeyError, TypeError):
            log.error("Unreadable %s: %r; deleting it", zp.REASSIGN_PARTITIONS, data)
            targets = {}
        invalid = set()
        for tp, target in targets.items():
            if tp in self._zk_reassigning:
                continue
            problem = self._check_target(target) if tp in ctx.states else "unknown partition"
            if problem is not None:
                log.warning("%s: %s-%d cannot move to %s: %s", zp.REASSIGN_PARTITIONS, tp[0], tp[1], target, problem)
                invalid.add(tp)
                continue
            self._zk_reassigning.add(tp)
            ongoing = ctx.reassignments.get(tp)
            original = ongoing.original if ongoing is not None else ctx.replicas(tp)
            self._start_reassignment(tp, Reassignment(list(original), list(target)))
            if tp not in ctx.reassignments and target == ctx.replicas(tp):
                self._drop_from_reassign_znode({tp})  # nothing to move, or done at once
        if invalid or not targets:
            self._drop_from_reassign_znode(invalid)

    def _drop_from_reassign_znode(self, done: set[TopicPartition]) -> None:
        client = self.store.client
        assert client is not None
        self._zk_reassigning -= done
        try:
            data, stat = client.get(zp.REASSIGN_PARTITIONS)
            left = {tp: r for tp, r in zp.parse_reassign_partitions(data).items() if tp not in done}
            if left:
                client.set(zp.REASSIGN_PARTITIONS, zp.reassign_partitions_doc(left), version=stat.version)
            else:
                client.delete(zp.REASSIGN_PARTITIONS, version=stat.version)
                log.info("All reassignments of %s completed; deleted it", zp.REASSIGN_PARTITIONS)
        except NoNodeError:
            pass
        except BadVersionError:
            self._put(self._drop_from_reassign_znode, done)  # a tool rewrote it meanwhile
        except (ValueError, KeyError, TypeError):
            client.delete(zp.REASSIGN_PARTITIONS)


class NotControllerError(Exception):
    """This broker is not the active controller."""

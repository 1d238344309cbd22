"""Replication control APIs: LeaderAndIsr (4), StopReplica (5), UpdateMetadata (6) from the controller;
ControlledShutdown (7), AlterPartition (56), ElectLeaders (43), AlterPartitionReassignments (45) and
ListPartitionReassignments (46) to the controller (the log dir APIs are in log_dirs.py).

The controller's requests run one at a time, in arrival order, on the server's controller-requests
thread (Kafka processes them in order too): a LeaderAndIsr must never be applied after a newer one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from kbroker.broker.apis import ApiHandler, RequestContext
from kbroker.broker.security.acls import AclOperation, ResourceType
from kbroker.coordinator.controller import IsrUpdate, KafkaController, NotControllerError
from kbroker.coordinator.metadata_store import PartitionState
from kbroker.coordinator.single_node_controller import SingleNodeController
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    AlterPartitionRequest,
    AlterPartitionResponse,
    ControlledShutdownRequest,
    ControlledShutdownResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
    LeaderAndIsrRequest,
    LeaderAndIsrResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    StopReplicaRequest,
    StopReplicaResponse,
    UpdateMetadataRequest,
    UpdateMetadataResponse,
)

log = logging.getLogger("kbroker.replication")
T = TypeVar("T")
DENIED = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
# How long a ControlledShutdown answer waits for the new leaderships to reach the other brokers: bounded, as a
# broker that is unreachable must not hold up another one's shutdown.
CONTROLLED_SHUTDOWN_PROPAGATION_S = 2.0


def _cluster_denied(ctx: RequestContext, op: AclOperation) -> bool:
    """Kafka's checks for these APIs: ClusterAction for broker-to-broker ones (the brokers' principal must be a
    super user or hold it), Alter or Describe on the cluster for the admin ones."""
    return ctx.server.authorizer is not None and not ctx.authorized(op, ResourceType.CLUSTER)


async def _in_order(ctx: RequestContext, fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(ctx.server.controller_requests, fn, *args)


def _controller_check(ctx: RequestContext, controller_epoch: int, broker_epoch: int) -> ErrorCode:
    """Kafka's checks of a request from the controller: a stale controller epoch, or a broker epoch older than
    this broker's registration (the request was meant for its previous incarnation)."""
    store = ctx.server.metadata
    if not hasattr(store, "apply_partition_states"):
        # The embedded single node is its own controller: no other broker may direct its partitions.
        return ErrorCode.STALE_CONTROLLER_EPOCH
    if controller_epoch < store.controller_epoch:
        return ErrorCode.STALE_CONTROLLER_EPOCH
    if broker_epoch != -1 and broker_epoch < store.broker_epoch:
        return ErrorCode.STALE_BROKER_EPOCH
    return ErrorCode.NONE


# ---------------------------------------------------------------- LeaderAndIsr


def _leader_and_isr_states(req: LeaderAndIsrRequest, version: int) -> list[tuple[str, int, PartitionState]]:
    parts = req.ungrouped_partition_states if version < 2 else [p for t in req.topic_states for p in t.partition_states]
    names = {} if version < 2 else {id(p): t.topic_name for t in req.topic_states for p in t.partition_states}
    return [
        (names.get(id(p), p.topic_name), p.partition_index,
         PartitionState(p.leader, p.leader_epoch, list(p.isr), list(p.replicas), p.partition_epoch,
                        list(p.adding_replicas), list(p.removing_replicas), p.controller_epoch))
        for p in parts
    ]


def _leader_and_isr(ctx: RequestContext, req: LeaderAndIsrRequest) -> LeaderAndIsrResponse:
    v = ctx.api_version
    states = _leader_and_isr_states(req, v)
    code = _controller_check(ctx, req.controller_epoch, req.broker_epoch)
    errors: dict[tuple[str, int], ErrorCode]
    if code != ErrorCode.NONE:
        log.warning("Ignoring LeaderAndIsr from controller %d (epoch %d): %s", req.controller_id,
                    req.controller_epoch, code.name)
        return _leader_and_isr_response(req, v, states, {}, code)
    server = ctx.server
    server.metadata.ensure_topics_known({t for t, _, _ in states})
    # The controller's decision goes into the metadata before the replicas act on it: a leader that stops leading
    # answers NOT_LEADER_OR_FOLLOWER from here on, and the client's next Metadata must not name it again (librdkafka
    # then waits out its leader query backoff, 0.3-1.4 s in the controlled shutdown test).
    server.metadata.apply_partition_states(req.controller_epoch, states)
    rm = server.replica_manager
    become = getattr(rm, "become_leader_or_follower", None)
    if become is not None:
        parts = req.ungrouped_partition_states if v < 2 else [p for t in req.topic_states for p in t.partition_states]
        new = {(t, p) for (t, p, _), ps in zip(states, parts, strict=True) if v >= 1 and ps.is_new}
        errors = become(req.controller_id, req.controller_epoch, states, new_partitions=new)
    else:
        # Until the replica manager follows leaders itself: every replica named here gets its local log
        # (Kafka's makeLeader / makeFollower create it too).
        errors = {}
        for topic, p, st in states:
            if server.broker_id in st.replicas and topic in server.metadata.topics:
                try:
                    server.admin.ensure_log(topic, p)
                except Exception as e:  # noqa: BLE001
                    log.error("Creating the log of %s-%d failed: %s", topic, p, e)
                    errors[(topic, p)] = ErrorCode.KAFKA_STORAGE_ERROR
    accepted = [(t, p, st) for t, p, st in states if errors.get((t, p), ErrorCode.NONE) == ErrorCode.NONE]
    led = [f"{t}-{p}" for t, p, st in accepted if st.leader == server.broker_id]
    log.info("LeaderAndIsr from controller %d (epoch %d): %d partitions, leading %d%s", req.controller_id,
             req.controller_epoch, len(states), len(led), f" ({', '.join(led[:8])}{'...' if len(led) > 8 else ''})"
             if led else "")
    return _leader_and_isr_response(req, v, states, errors, ErrorCode.NONE)


def _leader_and_isr_response(req: LeaderAndIsrRequest, v: int, states: list[tuple[str, int, PartitionState]],
                             errors: dict[tuple[str, int], ErrorCode], code: ErrorCode) -> LeaderAndIsrResponse:
    R = LeaderAndIsrResponse
    if code != ErrorCode.NONE:
        return R(error_code=code)
    if v < 5:
        return R(error_code=0, partition_errors=[
            R.LeaderAndIsrPartitionError(topic_name=t, partition_index=p, error_code=errors.get((t, p), 0))
            for t, p, _ in states])
    return R(error_code=0, topics=[
        R.LeaderAndIsrTopicError(topic_id=ts.topic_id, partition_errors=[
            R.LeaderAndIsrPartitionError(partition_index=ps.partition_index,
                                         error_code=errors.get((ts.topic_name, ps.partition_index), 0))
            for ps in ts.partition_states])
        for ts in req.topic_states])


async def handle_leader_and_isr(ctx: RequestContext, req: LeaderAndIsrRequest) -> LeaderAndIsrResponse:
    if _cluster_denied(ctx, AclOperation.CLUSTER_ACTION):
        return LeaderAndIsrResponse(error_code=DENIED)
    return await _in_order(ctx, _leader_and_isr, ctx, req)


# ---------------------------------------------------------------- UpdateMetadata


def _update_metadata(ctx: RequestContext, req: UpdateMetadataRequest) -> UpdateMetadataResponse:
    code = _controller_check(ctx, req.controller_epoch, req.broker_epoch)
    if code != ErrorCode.NONE:
        return UpdateMetadataResponse(error_code=code)
    v = ctx.api_version
    parts = req.ungrouped_partition_states if v < 5 else [p for t in req.topic_states for p in t.partition_states]
    names = {} if v < 5 else {id(p): t.topic_name for t in req.topic_states for p in t.partition_states}
    states = [
        (names.get(id(p), p.topic_name), p.partition_index,
         PartitionState(p.leader, p.leader_epoch, list(p.isr), list(p.replicas), p.zk_version,
                        controller_epoch=p.controller_epoch, offline_replicas=list(p.offline_replicas or [])))
        for p in parts
    ]
    if not ctx.server.metadata.apply_partition_states(req.controller_epoch, states):
        return UpdateMetadataResponse(error_code=ErrorCode.STALE_CONTROLLER_EPOCH)
    return UpdateMetadataResponse(error_code=0)


async def handle_update_metadata(ctx: RequestContext, req: UpdateMetadataRequest) -> UpdateMetadataResponse:
    if _cluster_denied(ctx, AclOperation.CLUSTER_ACTION):
        return UpdateMetadataResponse(error_code=DENIED)
    return await _in_order(ctx, _update_metadata, ctx, req)


# ---------------------------------------------------------------- StopReplica


def _stop_replica(ctx: RequestContext, req: StopReplicaRequest) -> StopReplicaResponse:
    R = StopReplicaResponse
    code = _controller_check(ctx, req.controller_epoch, req.broker_epoch)
    if code != ErrorCode.NONE:
        return R(error_code=code)
    v = ctx.api_version
    by_delete: dict[bool, list[tuple[str, int]]] = {False: [], True: []}
    if v == 0:
        for p0 in req.ungrouped_partitions:
            by_delete[req.delete_partitions].append((p0.topic_name, p0.partition_index))
    elif v <= 2:
        for t in req.topics:
            by_delete[req.delete_partitions] += [(t.name, p) for p in t.partition_indexes]
    else:
        for ts in req.topic_states:
            for ps in ts.partition_states:
                by_delete[ps.delete_partition].append((ts.topic_name, ps.partition_index))
    server = ctx.server
    stop = getattr(server.replica_manager, "stop_replicas", None)
    errors: dict[tuple[str, int], ErrorCode] = {}
    for delete, tps in by_delete.items():
        if not tps:
            continue
        if stop is not None:
            errors.update(stop(tps, delete))
        elif delete:
            for topic, p in tps:
                server.log_manager.delete_log(topic, p)
                server.replica_manager.purgatory.notify((topic, p))
        log.info("StopReplica from controller %d: %d partitions%s", req.controller_id, len(tps),
                 " (deleted)" if delete else "")
    return R(error_code=0, partition_errors=[
        R.StopReplicaPartitionError(topic_name=t, partition_index=p, error_code=errors.get((t, p), 0))
        for tps in by_delete.values() for t, p in tps])


async def handle_stop_replica(ctx: RequestContext, req: StopReplicaRequest) -> StopReplicaResponse:
    if _cluster_denied(ctx, AclOperation.CLUSTER_ACTION):
        return StopReplicaResponse(error_code=DENIED)
    return await _in_order(ctx, _stop_replica, ctx, req)


# ---------------------------------------------------------------- requests to the controller


def _active_controller(ctx: RequestContext) -> KafkaController | None:
    c: KafkaController | None = getattr(ctx.server, "controller", None)
    return c if c is not None and c.is_active else None


def _admin_controller(ctx: RequestContext) -> KafkaController | SingleNodeController | None:
    """Who answers the controller's admin APIs here: the embedded single node is its own controller (Metadata names
    it), in a cluster the active controller, else nobody (NOT_CONTROLLER, and the client asks Metadata again)."""
    if not ctx.server.config["zookeeper.connect"]:
        return SingleNodeController(ctx.server)
    return _active_controller(ctx)


async def handle_controlled_shutdown(ctx: RequestContext, req: ControlledShutdownRequest) -> ControlledShutdownResponse:
    R = ControlledShutdownResponse
    if _cluster_denied(ctx, AclOperation.CLUSTER_ACTION):
        return R(error_code=DENIED)
    controller = _active_controller(ctx)
    if controller is None:
        return R(error_code=ErrorCode.NOT_CONTROLLER)
    try:
        code, remaining = await asyncio.wrap_future(controller.controlled_shutdown(req.broker_id, req.broker_epoch))
    except NotControllerError:
        return R(error_code=ErrorCode.NOT_CONTROLLER)
    if code == ErrorCode.NONE:
        # The stopping broker closes its connections once answered. Its clients ask for metadata meanwhile and then:
        # every broker, the stopping one included, must already know the new leaders (LeaderAndIsr and
        # UpdateMetadata answered), or librdkafka is told the old leader again and asks once more a second later
        # (a ~1.1 s produce pause instead of ~0.1 s).
        await ctx.server.controller_channel.sent(timeout=CONTROLLED_SHUTDOWN_PROPAGATION_S)
    return R(error_code=code, remaining_partitions=[
        R.RemainingPartition(topic_name=t, partition_index=p) for t, p in remaining])


async def handle_alter_partition(ctx: RequestContext, req: AlterPartitionRequest) -> AlterPartitionResponse:
    R = AlterPartitionResponse
    v = ctx.api_version
    if _cluster_denied(ctx, AclOperation.CLUSTER_ACTION):
        return R(error_code=DENIED)
    controller = _active_controller(ctx)
    if controller is None:
        return R(error_code=ErrorCode.NOT_CONTROLLER)
    names = ctx.server.topic_names_by_id() if v >= 2 else {}
    updates: list[IsrUpdate] = []
    unknown: list[tuple[AlterPartitionRequest.TopicData, int]] = []
    for t in req.topics:
        name = t.topic_name if v < 2 else names.get(t.topic_id)
        for p in t.partitions:
            if name is None:
                unknown.append((t, p.partition_index))
                continue
            isr = [b.broker_id for b in p.new_isr_with_epochs] if v >= 3 else list(p.new_isr)
            updates.append(IsrUpdate(name, p.partition_index, p.leader_epoch, isr, p.partition_epoch))
    try:
        code, results = await asyncio.wrap_future(controller.alter_partition(req.broker_id, req.broker_epoch, updates))
    except NotControllerError:
        return R(error_code=ErrorCode.NOT_CONTROLLER)
    if code != ErrorCode.NONE:
        return R(error_code=code)
    by_topic: dict[str, list[R.PartitionData]] = {}
    for u, res in zip(updates, results, strict=True):
        by_topic.setdefault(u.topic, []).append(R.PartitionData(
            partition_index=u.partition, error_code=res.error, leader_id=res.leader, leader_epoch=res.leader_epoch,
            isr=list(res.isr or []), partition_epoch=res.partition_epoch))
    ids = {rec.name: rec.topic_id for rec in ctx.server.metadata.topics.values()}
    topics = [R.TopicData(topic_name=name, topic_id=ids.get(name, bytes(16)), partitions=parts)
              for name, parts in by_topic.items()]
    for t, p in unknown:
        topics.append(R.TopicData(topic_name=t.topic_name, topic_id=t.topic_id, partitions=[
            R.PartitionData(partition_index=p, error_code=ErrorCode.UNKNOWN_TOPIC_ID, leader_id=-1, leader_epoch=-1)]))
    return R(error_code=0, topics=topics)


async def handle_elect_leaders(ctx: RequestContext, req: ElectLeadersRequest) -> ElectLeadersResponse:
    R = ElectLeadersResponse
    election_type = req.election_type if ctx.api_version >= 1 else 0
    if election_type not in (0, 1):
        return R(error_code=ErrorCode.INVALID_REQUEST)
    requested = None if req.topic_partitions is None else [
        (t.topic, p) for t in req.topic_partitions for p in t.partitions]
    controller = _admin_controller(ctx)
    denied = _cluster_denied(ctx, AclOperation.ALTER)
    if denied:
        results = {tp: (DENIED, None) for tp in requested or []}
    elif controller is None:
        results = {tp: (ErrorCode.NOT_CONTROLLER, None) for tp in requested or []}
    else:
        try:
            results = await asyncio.wrap_future(controller.elect_leaders(election_type, requested))
        except NotControllerError:
            results = {tp: (ErrorCode.NOT_CONTROLLER, None) for tp in requested or []}
        if requested is None:
            # As Kafka: an election over all partitions reports only those elected or failed.
            results = {tp: r for tp, r in results.items() if r[0] != ErrorCode.ELECTION_NOT_NEEDED}
    by_topic: dict[str, list[R.PartitionResult]] = {}
    for (topic, p), (code, message) in sorted(results.items()):
        by_topic.setdefault(topic, []).append(R.PartitionResult(partition_id=p, error_code=code, error_message=message))
    return R(error_code=DENIED if denied else 0, replica_election_results=[
        R.ReplicaElectionResult(topic=t, partition_result=ps) for t, ps in by_topic.items()])


async def handle_alter_partition_reassignments(ctx: RequestContext, req: AlterPartitionReassignmentsRequest
                                               ) -> AlterPartitionReassignmentsResponse:
    R = AlterPartitionReassignmentsResponse
    if _cluster_denied(ctx, AclOperation.ALTER):
        return R(error_code=DENIED, error_message=None)
    controller = _admin_controller(ctx)
    if controller is None:
        return R(error_code=ErrorCode.NOT_CONTROLLER, error_message="This broker is not the controller.")
    targets = {(t.name, p.partition_index): (None if p.replicas is None else list(p.replicas))
               for t in req.topics for p in t.partitions}
    try:
        results = await asyncio.wrap_future(controller.alter_reassignments(targets))
    except NotControllerError:
        return R(error_code=ErrorCode.NOT_CONTROLLER, error_message="This broker is not the controller.")
    return R(error_code=0, error_message=None, responses=[
        R.ReassignableTopicResponse(name=t.name, partitions=[
            R.ReassignablePartitionResponse(partition_index=p.partition_index,
                                            error_code=results[(t.name, p.partition_index)][0],
                                            error_message=results[(t.name, p.partition_index)][1])
            for p in t.partitions])
        for t in req.topics])


async def handle_list_partition_reassignments(ctx: RequestContext, req: ListPartitionReassignmentsRequest
                                              ) -> ListPartitionReassignmentsResponse:
    R = ListPartitionReassignmentsResponse
    if _cluster_denied(ctx, AclOperation.DESCRIBE):
        return R(error_code=DENIED, error_message=None)
    controller = _admin_controller(ctx)
    if controller is None:
        return R(error_code=ErrorCode.NOT_CONTROLLER, error_message="This broker is not the controller.")
    requested = None if req.topics is None else [(t.name, p) for t in req.topics for p in t.partition_indexes]
    try:
        ongoing = await asyncio.wrap_future(controller.list_reassignments(requested))
    except NotControllerError:
        return R(error_code=ErrorCode.NOT_CONTROLLER, error_message="This broker is not the controller.")
    by_topic: dict[str, list[R.OngoingPartitionReassignment]] = {}
    for (topic, p), r in sorted(ongoing.items()):
        by_topic.setdefault(topic, []).append(R.OngoingPartitionReassignment(
            partition_index=p, replicas=r.replicas, adding_replicas=r.adding, removing_replicas=r.removing))
    return R(error_code=0, error_message=None, topics=[
        R.OngoingTopicReassignment(name=t, partitions=ps) for t, ps in by_topic.items()])


HANDLERS = [
    ApiHandler(4, 0, 7, handle_leader_and_isr),
    ApiHandler(5, 0, 4, handle_stop_replica),
    ApiHandler(6, 0, 8, handle_update_metadata),
    ApiHandler(7, 0, 3, handle_controlled_shutdown),
    ApiHandler(43, 0, 2, handle_elect_leaders),
    ApiHandler(45, 0, 0, handle_alter_partition_reassignments),
    ApiHandler(46, 0, 0, handle_list_partition_reassignments),
    ApiHandler(56, 0, 3, handle_alter_partition),
]

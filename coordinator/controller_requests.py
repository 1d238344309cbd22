"""Kafka's ControllerBrokerRequestBatch: the LeaderAndIsr, UpdateMetadata and StopReplica requests the
controller sends after a round of state changes, one of each per broker at most.

Versions are those a Kafka 3.x ZooKeeper-mode controller sends (topic ids, no KRaft migration fields).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kbroker.coordinator.controller_context import ControllerContext, TopicPartition
from kbroker.protocol.messages import LeaderAndIsrRequest, StopReplicaRequest, UpdateMetadataRequest

LEADER_AND_ISR, STOP_REPLICA, UPDATE_METADATA = 4, 5, 6
LEADER_AND_ISR_VERSION = 6
STOP_REPLICA_VERSION = 3
UPDATE_METADATA_VERSION = 7
# Kafka's SecurityProtocol ids, for the listener names that are also protocol names.
SECURITY_PROTOCOLS = {"PLAINTEXT": 0, "SSL": 1, "SASL_PLAINTEXT": 2, "SASL_SSL": 3}
# Kafka's LeaderAndIsr.EpochDuringDelete: StopReplica for a deleted partition fences every leader epoch.
EPOCH_DURING_DELETE = -2

# broker id -> (listener name -> (host, port), rack)
BrokerInfo = Callable[[int], "tuple[dict[str, tuple[str, int]], str | None]"]
# (broker id, api key, version, body)
Send = Callable[[int, int, int, Any], None]


@dataclass
class RequestBatch:
    controller_id: int
    leader_and_isr: dict[int, dict[TopicPartition, bool]] = field(default_factory=dict)  # broker -> tp -> is_new
    update_metadata_brokers: set[int] = field(default_factory=set)
    update_metadata_partitions: set[TopicPartition] = field(default_factory=set)
    update_metadata_all: bool = False
    stop_replica: dict[int, dict[TopicPartition, bool]] = field(default_factory=dict)  # broker -> tp -> delete

    def add_leader_and_isr(self, brokers: list[int], tp: TopicPartition, is_new: bool = False) -> None:
        for b in brokers:
            self.leader_and_isr.setdefault(b, {})[tp] = is_new
        self.update_metadata_partitions.add(tp)

    def add_update_metadata(self, brokers: list[int], partitions: list[TopicPartition] | None) -> None:
        """partitions None: every partition (a new broker, a new controller)."""
        self.update_metadata_brokers.update(brokers)
        if partitions is None:
            self.update_metadata_all = True
        else:
            self.update_metadata_partitions.update(partitions)

    def add_stop_replica(self, brokers: list[int], tp: TopicPartition, delete: bool) -> None:
        for b in brokers:
            self.stop_replica.setdefault(b, {})[tp] = delete

    def send(self, ctx: ControllerContext, broker_info: BrokerInfo, send: Send) -> None:
        """LeaderAndIsr first, then UpdateMetadata to every live broker, then StopReplica (Kafka's order)."""
        for broker, tps in sorted(self.leader_and_isr.items()):
            if ctx.is_live(broker):
                send(broker, LEADER_AND_ISR, LEADER_AND_ISR_VERSION, self._leader_and_isr(ctx, broker, tps, broker_info))
        if self.update_metadata_partitions or self.update_metadata_all or self.update_metadata_brokers:
            partitions = ctx.partitions() if self.update_metadata_all else sorted(self.update_metadata_partitions)
            body = self._update_metadata(ctx, partitions, broker_info)
            targets = set(ctx.live_brokers) if self.update_metadata_partitions else self.update_metadata_brokers
            for broker in sorted(targets | self.update_metadata_brokers):
                if ctx.is_live(broker):
                    body_for = dataclasses.replace(body, broker_epoch=ctx.live_brokers[broker])
                    send(broker, UPDATE_METADATA, UPDATE_METADATA_VERSION, body_for)
        for broker, tps in sorted(self.stop_replica.items()):
            if ctx.is_live(broker):
                send(broker, STOP_REPLICA, STOP_REPLICA_VERSION, self._stop_replica(ctx, broker, tps))

    def _leader_and_isr(self, ctx: ControllerContext, broker: int, tps: dict[TopicPartition, bool],
                        broker_info: BrokerInfo) -> LeaderAndIsrRequest:
        R = LeaderAndIsrRequest
        by_topic: dict[str, list[R.LeaderAndIsrPartitionState]] = {}
        leaders: set[int] = set()
        for (topic, p), is_new in sorted(tps.items()):
            st = ctx.states.get((topic, p))
            if st is None:
                continue
            r = ctx.reassignments.get((topic, p))
            by_topic.setdefault(topic, []).append(R.LeaderAndIsrPartitionState(
                topic_name=topic, partition_index=p, controller_epoch=st.controller_epoch, leader=st.leader,
                leader_epoch=st.leader_epoch, isr=list(st.isr), partition_epoch=st.version,
                replicas=ctx.replicas((topic, p)), adding_replicas=r.adding if r else [],
                removing_replicas=r.removing if r else [], is_new=is_new,
            ))
            if ctx.is_live(st.leader):
                leaders.add(st.leader)
        live_leaders = []
        for b in sorted(leaders):
            listeners, _ = broker_info(b)
            if listeners:
                host, port = next(iter(listeners.values()))
                live_leaders.append(R.LeaderAndIsrLiveLeader(broker_id=b, host_name=host, port=port))
        return R(
            controller_id=self.controller_id, controller_epoch=ctx.epoch, broker_epoch=ctx.live_brokers.get(broker, -1),
            type=0,
            topic_states=[R.LeaderAndIsrTopicState(topic_name=t, topic_id=ctx.topic_ids.get(t, bytes(16)),
                                                   partition_states=ps) for t, ps in sorted(by_topic.items())],
            live_leaders=live_leaders,
        )

    def _update_metadata(self, ctx: ControllerContext, partitions: list[TopicPartition],
                         broker_info: BrokerInfo) -> UpdateMetadataRequest:
        R = UpdateMetadataRequest
        by_topic: dict[str, list[R.UpdateMetadataPartitionState]] = {}
        for topic, p in partitions:
            st = ctx.states.get((topic, p))
            if st is None:
                continue
            replicas = ctx.replicas((topic, p))
            by_topic.setdefault(topic, []).append(R.UpdateMetadataPartitionState(
                topic_name=topic, partition_index=p, controller_epoch=st.controller_epoch, leader=st.leader,
                leader_epoch=st.leader_epoch, isr=list(st.isr), zk_version=st.version, replicas=replicas,
                offline_replicas=[b for b in replicas if not ctx.is_replica_online(b, (topic, p))],
            ))
        brokers = []
        for b in sorted(ctx.live_brokers):
            listeners, rack = broker_info(b)
            brokers.append(R.UpdateMetadataBroker(id=b, rack=rack, endpoints=[
                R.UpdateMetadataEndpoint(port=port, host=host, listener=name,
                                         security_protocol=SECURITY_PROTOCOLS.get(name, 0))
                for name, (host, port) in listeners.items()
            ]))
        return R(
            controller_id=self.controller_id, controller_epoch=ctx.epoch, broker_epoch=-1,
            topic_states=[R.UpdateMetadataTopicState(topic_name=t, topic_id=ctx.topic_ids.get(t, bytes(16)),
                                                     partition_states=ps) for t, ps in sorted(by_topic.items())],
            live_brokers=brokers,
        )

    def _stop_replica(self, ctx: ControllerContext, broker: int, tps: dict[TopicPartition, bool]) -> StopReplicaRequest:
        R = StopReplicaRequest
        by_topic: dict[str, list[R.StopReplicaPartitionState]] = {}
        for (topic, p), delete in sorted(tps.items()):
            st = ctx.states.get((topic, p))
            epoch = EPOCH_DURING_DELETE if topic not in ctx.assignments else (st.leader_epoch if st else -1)
            by_topic.setdefault(topic, []).append(
                R.StopReplicaPartitionState(partition_index=p, leader_epoch=epoch, delete_partition=delete))
        return R(
            controller_id=self.controller_id, controller_epoch=ctx.epoch, broker_epoch=ctx.live_brokers.get(broker, -1),
            topic_states=[R.StopReplicaTopicState(topic_name=t, partition_states=ps) for t, ps in sorted(by_topic.items())],
        )

"""TxnVerifier: asks a transaction's coordinator whether partitions belong to the producer's ongoing
transaction before the first transactional batch is appended to them (KIP-890 part 1, Kafka's
AddPartitionsToTxnManager), so a late or stray batch cannot open a transaction that no marker will close.

The coordinator is the leader of the transactional id's __transaction_state partition: this broker's own
TransactionCoordinator, or another broker over AddPartitionsToTxn v4+ with verify_only.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kbroker.broker.inter_broker import TXN_VERIFICATION, partitions_by_topic
from kbroker.coordinator.group_coordinator import partition_for
from kbroker.coordinator.transaction_coordinator import TRANSACTION_STATE_TOPIC
from kbroker.protocol.errors import ErrorCode, KafkaError
from kbroker.protocol.messages import AddPartitionsToTxnRequest, AddPartitionsToTxnResponse
from kbroker.storage.manager import TopicPartition

if TYPE_CHECKING:
    from kbroker.broker.server import KafkaServer

log = logging.getLogger("kbroker.txn_verification")

ADD_PARTITIONS_TO_TXN = 24
VERIFY_VERSION = 5


class TxnVerifier:
    def __init__(self, server: KafkaServer) -> None:
        self.server = server

    def verify_now(self, transactional_id: str, producer_id: int, producer_epoch: int,
                   tps: list[TopicPartition]) -> dict[TopicPartition, ErrorCode] | None:
        """verify() without waiting, when this broker is the coordinator and the transaction is settled
        (the usual case); None when only the asynchronous verify() can answer."""
        server = self.server
        rec = server.metadata.topics.get(TRANSACTION_STATE_TOPIC)
        if rec is None or rec.leaders[partition_for(transactional_id, rec.num_partitions)] != server.broker_id:
            return None
        results = server.txn_coordinator.verify_partitions_now(transactional_id, producer_id, producer_epoch, tps)
        return None if results is None else self._failures(results)

    def confirmed_now(self, transactional_id: str, producer_id: int, producer_epoch: int, tp: TopicPartition
                      ) -> bool:
        """verify_now for one partition, True only when it passes (the single-partition Produce path asks once per
        request and needs no error: on False the general path verifies again and answers)."""
        server = self.server
        rec = server.metadata.topics.get(TRANSACTION_STATE_TOPIC)
        if rec is None or rec.leaders[partition_for(transactional_id, rec.num_partitions)] != server.broker_id:
            return False
        return server.txn_coordinator.in_transaction_now(transactional_id, producer_id, producer_epoch, tp)

    async def verify(self, transactional_id: str, producer_id: int, producer_epoch: int,
                     tps: list[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        """The partitions that failed verification, with the error the producer must see (PRODUCER_FENCED is
        reported as INVALID_PRODUCER_EPOCH, which producers expect here); an empty map when all passed."""
        server = self.server
        rec = server.metadata.topics.get(TRANSACTION_STATE_TOPIC)
        if rec is None:
            # No transaction was ever started on this cluster, so none can include these partitions.
            return {tp: ErrorCode.INVALID_TXN_STATE for tp in tps}
        leader = rec.leaders[partition_for(transactional_id, rec.num_partitions)]
        if leader == server.broker_id:
            tc = server.txn_coordinator
            results = await tc.call(tc.add_partitions, transactional_id, producer_id, producer_epoch, tps, True)
        else:
            results = await self._verify_remote(leader, transactional_id, producer_id, producer_epoch, tps)
        return self._failures(results)

    @staticmethod
    def _failures(results: dict[TopicPartition, ErrorCode]) -> dict[TopicPartition, ErrorCode]:
        failed = {}
        for tp, code in results.items():
            if code == ErrorCode.NONE:
                continue
            failed[tp] = ErrorCode.INVALID_PRODUCER_EPOCH if code == ErrorCode.PRODUCER_FENCED else ErrorCode(code)
        return failed

    async def _verify_remote(self, leader: int, transactional_id: str, producer_id: int, producer_epoch: int,
                             tps: list[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        req = AddPartitionsToTxnRequest(transactions=[AddPartitionsToTxnRequest.AddPartitionsToTxnTransaction(
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
            verify_only=True,
            topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=t, partitions=ps)
                    for t, ps in partitions_by_topic(tps).items()],
        )])
        try:
            resp: AddPartitionsToTxnResponse = await self.server.inter_broker.send(
                leader, ADD_PARTITIONS_TO_TXN, VERIFY_VERSION, req, TXN_VERIFICATION)
        except (ConnectionError, KafkaError) as e:
            log.warning("Verifying %s with the coordinator on broker %d failed: %s", transactional_id, leader, e)
            return {tp: ErrorCode.NETWORK_EXCEPTION for tp in tps}
        if resp.error_code:
            return {tp: ErrorCode(resp.error_code) for tp in tps}
        out: dict[TopicPartition, ErrorCode] = {}
        for txn in resp.results_by_transaction:
            for t in txn.topic_results:
                for p in t.results_by_partition:
                    out[(t.name, p.partition_index)] = ErrorCode(p.partition_error_code)
        return out

"""A mixed ZooKeeper cluster for failure scenarios: Apache Kafka 3.9 brokers and kbrokers by broker id, each started,
killed (kill -9), stopped (controlled shutdown), paused (SIGSTOP) and resumed, and what each broker says of a topic."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kbroker.protocol import records as R
from kbroker.protocol.messages import FetchRequest, ListOffsetsRequest

from kbroker_tools.wire import WireClient
from tests.broker_process import BrokerProcess
from tests.differential.rolling import log

LIST_OFFSETS, FETCH = 2, 1
DEBUGGING_REPLICA = -2  # ListOffsets from a follower too, its log end offset (Kafka's DEBUGGING_REPLICA_ID)
LATEST = -1


class StepFailed(Exception):
    """A step of a scenario did not happen in time."""


@dataclass(frozen=True)
class View:
    """One broker's Metadata for one topic: the controller and each partition's leader and ISR."""

    controller: int
    partitions: dict[int, tuple[int, tuple[int, ...]]]

    def leader(self, partition: int) -> int:
        return self.partitions.get(partition, (-1, ()))[0]

    def isr(self, partition: int) -> set[int]:
        return set(self.partitions.get(partition, (-1, ()))[1])


@dataclass(frozen=True)
class ReplicaLog:
    """What one replica holds: its log end offset, high watermark and (offset, batch leader epoch, value) up to it."""

    log_end: int
    high_watermark: int
    records: tuple[tuple[int, int, bytes | None], ...]


class MixedCluster:
    """ZooKeeper plus brokers of both kinds; the Kafka ones get inter.broker.protocol.version 3.9."""

    def __init__(self, root: Path, zookeeper: str, settings: dict[str, str]) -> None:
        self.root = root
        self.zookeeper = zookeeper
        self.settings = settings
        self.brokers: dict[int, Any] = {}

    def add_kafka(self, broker_id: int, overrides: dict[str, str] | None = None) -> None:
        from bench.peers.kafka import KafkaPeer

        self.brokers[broker_id] = KafkaPeer(
            "3.9",
            mode="zk",
            zookeeper=self.zookeeper,
            broker_id=broker_id,
            base=self.root / f"kafka-{broker_id}",
            # INFO: Kafka's truncation and ISR lines are the evidence the scenarios print.
            log_level="INFO",
            overrides={**self.settings, "inter.broker.protocol.version": "3.9", **(overrides or {})},
        )

    def add_kbroker(self, broker_id: int, overrides: dict[str, str] | None = None) -> None:
        self.brokers[broker_id] = BrokerProcess(
            self.root / f"kbroker-{broker_id}",
            overrides={
                **self.settings,
                "zookeeper.connect": self.zookeeper,
                "broker.id": str(broker_id),
                **(overrides or {}),
            },
        )

    def is_kafka(self, broker_id: int) -> bool:
        return not isinstance(self.brokers[broker_id], BrokerProcess)

    def name(self, broker_id: int) -> str:
        return f"{'Kafka' if self.is_kafka(broker_id) else 'kbroker'} {broker_id}"

    def address(self, broker_id: int) -> str:
        return str(self.brokers[broker_id].bootstrap)

    @property
    def bootstrap(self) -> str:
        return ",".join(self.address(b) for b in sorted(self.brokers))

    def alive(self) -> list[int]:
        return sorted(b for b, p in self.brokers.items() if p.proc is not None and p.proc.poll() is None)

    def start(self, broker_id: int) -> None:
        broker = self.brokers[broker_id]
        broker.start(timeout=180 if self.is_kafka(broker_id) else 60)

    def kill(self, broker_id: int) -> None:
        self.brokers[broker_id].kill()

    def stop(self, broker_id: int) -> None:
        self.brokers[broker_id].stop()

    def pause(self, broker_id: int) -> None:
        os.kill(self.brokers[broker_id].proc.pid, signal.SIGSTOP)

    def resume(self, broker_id: int) -> None:
        os.kill(self.brokers[broker_id].proc.pid, signal.SIGCONT)

    def close(self) -> None:
        """kill -9 every broker: the scenario is over, and a controlled shutdown of the last replicas only waits out
        Kafka's retries (controlled.shutdown.max.retries x 5 s) with nowhere to move leadership."""
        for broker in self.brokers.values():
            broker.kill()

    def log_text(self, broker_id: int) -> str:
        broker = self.brokers[broker_id]
        path = broker.log_path
        try:
            return Path(path).read_text(errors="replace")
        except OSError:
            return ""

    def view(self, broker_id: int, topic: str) -> View | None:
        """What broker_id's Metadata says, None while it does not answer."""
        try:
            with WireClient(self.address(broker_id), timeout=5) as c:
                md = c.metadata([topic])
        except Exception:  # noqa: BLE001 - down, paused or starting: no view
            return None
        parts = {
            p.partition_index: (p.leader_id, tuple(sorted(p.isr_nodes)))
            for t in md.topics
            if t.error_code == 0
            for p in t.partitions
        }
        return View(md.controller_id, parts)

    def views_agree(
        self, topic: str, check: Callable[[View], bool], brokers: list[int] | None = None
    ) -> bool:
        """Whether every live broker (or those named) answers and its view passes `check`."""
        for b in brokers if brokers is not None else self.alive():
            v = self.view(b, topic)
            if v is None or not check(v):
                return False
        return True

    def create_topic(
        self, topic: str, assignment: list[list[int]], config: dict[str, str] | None = None
    ) -> None:
        """CreateTopics with a replica assignment; the AdminClient sends it to the controller (ZooKeeper mode)."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics(
            [NewTopic(topic, len(assignment), replica_assignment=assignment, config=config or {})],
            request_timeout=30,
        )
        futures[topic].result(60)

    def replica_log(self, broker_id: int, topic: str, partition: int) -> ReplicaLog:
        """broker_id's own copy of the partition, leader or follower: its log end by ListOffsets as a debugging
        replica, its records by Fetch v12 as a consumer (KIP-392 lets one read a follower, up to its high
        watermark)."""
        with WireClient(self.address(broker_id), timeout=15) as c:
            lo = c.request(
                LIST_OFFSETS,
                7,
                ListOffsetsRequest(
                    replica_id=DEBUGGING_REPLICA,
                    isolation_level=0,
                    topics=[
                        ListOffsetsRequest.ListOffsetsTopic(
                            name=topic,
                            partitions=[
                                ListOffsetsRequest.ListOffsetsPartition(
                                    partition_index=partition,
                                    current_leader_epoch=-1,
                                    timestamp=LATEST,
                                    max_num_offsets=1,
                                )
                            ],
                        )
                    ],
                ),
            )
            part = lo.topics[0].partitions[0]
            if part.error_code:
                raise StepFailed(
                    f"ListOffsets of {topic}-{partition} on {self.name(broker_id)}: error {part.error_code}"
                )
            log_end = part.offset
            out: list[tuple[int, int, bytes | None]] = []
            offset, hw = 0, -1
            while True:
                data = self._fetch(c, topic, partition, offset)
                if data.error_code:
                    raise StepFailed(
                        f"Fetch of {topic}-{partition} on {self.name(broker_id)}: error {data.error_code}"
                    )
                hw = data.high_watermark
                buf = bytes(data.records or b"")
                before = offset
                for pos, header in R.iter_batch_headers(buf):
                    for rec in R.decode_records(buf, pos):
                        if rec.offset >= offset:
                            out.append((rec.offset, header.partition_leader_epoch, rec.value))
                    offset = max(offset, header.base_offset + header.last_offset_delta + 1)
                if offset >= hw or offset == before:
                    break
        return ReplicaLog(log_end, hw, tuple(out))

    @staticmethod
    def _fetch(c: WireClient, topic: str, partition: int, offset: int) -> Any:
        req = FetchRequest(
            cluster_id=None,
            replica_id=-1,
            replica_state=None,
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=4 << 20,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=[
                FetchRequest.FetchTopic(
                    topic=topic,
                    partitions=[
                        FetchRequest.FetchPartition(
                            partition=partition,
                            current_leader_epoch=-1,
                            fetch_offset=offset,
                            last_fetched_epoch=-1,
                            log_start_offset=-1,
                            partition_max_bytes=4 << 20,
                        )
                    ],
                )
            ],
            forgotten_topics_data=[],
            rack_id="",
        )
        return c.request(FETCH, 12, req).responses[0].partitions[0]


def expect(what: str, check: Callable[[], bool], timeout: float) -> float:
    """Wait for `check`; print the step with how long it took, or raise StepFailed."""
    began = time.monotonic()
    deadline = began + timeout
    while time.monotonic() < deadline:
        if check():
            took = time.monotonic() - began
            log(f"{what}: ok ({took:.1f} s)")
            return took
        time.sleep(0.5)
    log(f"{what}: FAILED (not within {timeout:.0f} s)")
    raise StepFailed(what)

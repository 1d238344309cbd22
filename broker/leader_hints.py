"""KIP-951 leader discovery: a Produce (v10+) or Fetch (v16+) partition answered NOT_LEADER_OR_FOLLOWER (or, for
Fetch, FENCED_LEADER_EPOCH) names the leader this broker knows, with its epoch, and the response carries that
leader's endpoint on the request's listener, so the client sends its retry there without a Metadata round trip
(Kafka's KafkaApis.getCurrentLeader)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kbroker.broker.server import KafkaServer

PRODUCE_VERSION = 10
FETCH_VERSION = 16


def current_leader(server: KafkaServer, topic: str, partition: int) -> tuple[int, int]:
    """(leader id, leader epoch) in this broker's metadata; (-1, -1) when it knows none."""
    rec = server.metadata.topics.get(topic)
    if rec is None or not 0 <= partition < len(rec.partitions):
        return -1, -1
    ps = rec.partitions[partition]
    return (ps.leader, ps.leader_epoch) if ps.leader >= 0 else (-1, -1)


class LeaderHints:
    """Collects the leaders named in one response and builds its NodeEndpoints."""

    __slots__ = ("server", "listener", "leaders")

    def __init__(self, server: KafkaServer, listener: str | None) -> None:
        self.server = server
        self.listener = listener
        self.leaders: set[int] = set()

    def leader(self, topic: str, partition: int, cls: Any) -> Any:
        """The partition's CurrentLeader (a LeaderIdAndEpoch of the response's message class `cls`)."""
        leader_id, epoch = current_leader(self.server, topic, partition)
        if leader_id >= 0:
            self.leaders.add(leader_id)
        return cls(leader_id=leader_id, leader_epoch=epoch)

    def endpoints(self, cls: Any) -> list[Any]:
        """NodeEndpoints of the named leaders that are alive (as Kafka, only those it can give an address for)."""
        if not self.leaders:
            return []
        return [cls(node_id=b, host=h, port=p, rack=r) for b, h, p, r in self.server.brokers(self.listener)
                if b in self.leaders]

"""Kafka 4.2's KafkaShareConsumer on three kbroker brokers (ZooKeeper, replication factor 3): the leader of a
partition is killed with kill -9 mid-run. No record is lost, no record whose acceptance the broker confirmed is
delivered again, and a record whose acknowledgement was lost in the failover comes back with a higher delivery
count (the share-partition state moved to the new leader through __share_group_state).

The long run is a command: `python -m tests.java.test_java_share_cluster --records 100000 --consumers 5 --kills 6
--seed 1` (seeded kill -9 of brokers, each restarted before the next, and of one consumer, with a share of the
records released or rejected)."""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker_process import BrokerProcess, wait_all_registered
from tests.clients import wait_until
from tests.group_helpers import share_group_offsets
from tests.java import test_java_share_consumer as single
from tests.zookeeper import ZooKeeperServer, zookeeper_missing

N = 600
T = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, BrokerProcess]]:
    reason = zookeeper_missing()
    if reason is not None:
        pytest.skip(reason)
    yield from three_brokers(tmp_path_factory.mktemp("share-cluster"))


def three_brokers(base: Path) -> Iterator[dict[int, BrokerProcess]]:
    zk = ZooKeeperServer(base / "zk").start()
    common = {
        "zookeeper.connect": zk.connect,
        "offsets.topic.num.partitions": "1",
        "offsets.topic.replication.factor": "3",
        "share.coordinator.state.topic.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "3",
        "group.share.heartbeat.interval.ms": "500",
        "group.share.min.heartbeat.interval.ms": "100",
        "group.share.session.timeout.ms": "6000",
        "group.share.min.session.timeout.ms": "6000",
        "controlled.shutdown.retry.backoff.ms": "200",
        # a killed broker's leaderships move within seconds (ZooKeeper notices its session gone)
        "zookeeper.session.timeout.ms": "6000",
    }
    bs = {b: BrokerProcess(base / f"b{b}", {**common, "broker.id": str(b)}) for b in (1, 2, 3)}
    try:
        for b in (3, 2, 1):  # broker 3 is the controller: broker 1, killed, is not
            bs[b].start()
        wait_all_registered(list(bs.values()), timeout=T)
        yield bs
    finally:
        for b in bs.values():
            b.stop()
        zk.stop()


class Consumer:
    """One ShareConsumerCompat process whose lines are read as they come."""

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[list[str]] = []
        self.err = ""
        self._out = threading.Thread(target=self._read, daemon=True)
        self._out.start()
        self._err = threading.Thread(target=self._read_err, daemon=True)
        self._err.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.split())

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        self.err = self.proc.stderr.read()

    def wait(self, timeout: float) -> int:
        rc = self.proc.wait(timeout)
        self._out.join(10)
        self._err.join(10)
        return rc


share_classpath = single.share_classpath  # the fixture: kafka-clients 4.2 and ShareConsumerCompat compiled


def value(i: int) -> str:
    return f"v{i}" + ("-release" if i % 10 == 3 else "-reject" if i % 50 == 7 else "")


def run_scenario(
    classpath: str,
    cluster: dict[int, BrokerProcess],
    topic: str,
    n: int,
    consumers: int,
    kills: int,
    seed: int,
) -> dict[str, Any]:
    """n records on two partitions to `consumers` share consumers while `kills` brokers are killed with kill -9
    (the first is broker 1, partition 0's leader; each is restarted before the next kill but the last), and, with
    more than two consumers, one consumer is killed too. Asserts the guarantees; returns counts for a report."""
    rng = random.Random(seed)
    bootstrap = ",".join(b.bootstrap for b in cluster.values())
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics(
        [
            NewTopic(
                topic,
                num_partitions=2,
                replica_assignment=[[1, 2, 3], [2, 3, 1]],
                config={"min.insync.replicas": "2"},
            )
        ]
    )[topic].result(T)
    group = "share-" + topic
    single.set_group_config(bootstrap, group, "share.auto.offset.reset", "earliest")
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    values = [value(i) for i in range(n)]
    for i, v in enumerate(values):
        p.produce(topic, v.encode(), partition=i % 2)
        if i % 10_000 == 9_999:
            p.flush(T)
    assert p.flush(T) == 0
    want = [v for v in values if not v.endswith("-reject")]
    # count n: a consumer stops when it has been idle 20 s (a failover stalls fetches and acknowledgements while
    # the state writes wait for the new __share_group_state leader)
    cmd = [
        "java",
        "-cp",
        classpath,
        "ShareConsumerCompat",
        bootstrap,
        topic,
        group,
        str(n),
        "20000",
        "50",
        "10",
    ]
    procs = [Consumer(cmd) for _ in range(consumers)]

    def accepted_so_far() -> int:
        return sum(1 for c in procs for w in list(c.lines) if w and w[0] == "ACCEPT")

    killed_consumer = None
    victim = 0
    before_kill = [0] * consumers
    kill_ms: list[float] = []
    for k in range(kills):
        target = len(want) * (k + 1) // (kills + 2)
        deadline = time.monotonic() + 120
        while accepted_so_far() < target and time.monotonic() < deadline:
            time.sleep(0.05)
        if k:
            cluster[victim].start()  # the previous round's
            wait_all_registered(list(cluster.values()), timeout=T)
            time.sleep(2)  # its replicas catch up and rejoin the ISR before another broker goes
        victim = 1 if k == 0 else rng.choice(sorted(cluster))
        if k == 0:
            before_kill = [len(c.lines) for c in procs]
        kill_ms.append(time.time() * 1000)
        cluster[victim].kill()
        if consumers > 2 and killed_consumer is None and k == kills // 2:
            killed_consumer = rng.randrange(consumers)
            procs[killed_consumer].proc.kill()
    rcs = [c.wait(600) for c in procs]
    lines = [w for c in procs for w in c.lines]
    alive = [b for b in cluster.values() if b.proc is not None]
    detail = [c.err[-3000:] for c in procs] + [b.read_log()[-3000:] for b in alive]
    for i, (rc, c) in enumerate(zip(rcs, procs, strict=True)):
        if i != killed_consumer:
            assert rc == 0 and any(w and w[0] == "DONE" for w in c.lines), detail
    accepted = [w for w in lines if w[0] == "ACCEPT"]
    ackfails = [w for w in lines if w[0] == "ACKFAIL"]
    # no record whose acceptance the broker confirmed is delivered again; a record never accepted had an
    # acknowledgement the broker did not confirm (its answer lost with the leader: applied or not, as in Kafka)
    seen: dict[str, int] = {}
    for w in accepted:
        seen[w[3]] = seen.get(w[3], 0) + 1
    twice = sorted(v for v, c in seen.items() if c > 1)
    unconfirmed = sorted(set(want) - set(seen) - {w[3] for w in ackfails})
    assert not twice and not unconfirmed and set(seen) <= set(want), (
        f"accepted {len(accepted)} of {len(want)}; twice {twice[:20]}; never acknowledged {unconfirmed[:20]}; "
        f"{detail}"
    )
    # none lost: every record is acknowledged or archived in the share-partitions' state
    survivor = next(b for b in cluster.values() if b.alive())
    wait_until(lambda: lags(survivor.bootstrap, group, topic) == [0, 0], timeout=T, what="no lag")
    assert {w[3] for w in lines if w[0] == "REJECT"} == {v for v in values if v.endswith("-reject")}
    # an acknowledgement lost with a leader and not applied: the record came back counting that delivery
    final = {w[3]: int(w[4]) for w in accepted}
    for w in ackfails:
        assert w[3] not in final or final[w[3]] > int(w[4]), (w, final[w[3]])
    assert all(final[v] >= 2 for v in want if v.endswith("-release") and v in final)
    # An acknowledgement applied but never confirmed is one whose answer the killed leader took with it: its
    # commitSync was under way at a kill (sent before it, answered after). Any other is a broker confirming less
    # than it applied. One commit may carry a whole fetched batch (hundreds of records), so this is the bound,
    # not a count.
    applied = set(want) - set(seen)
    outside = [
        (w, span)
        for c in procs
        for w, span in _commit_spans(c.lines)
        if w[0] == "ACKFAIL" and w[3] in applied and not any(span[0] <= k <= span[1] for k in kill_ms)
    ]
    return {
        "accepted": len(accepted),
        "ackfail": len(ackfails),
        "applied_unconfirmed": len(applied),
        "applied_unconfirmed_outside_a_kill": len(outside),
        # what the client said of its unconfirmed acknowledgements, per consumer and partition: the clue when the
        # count above is too high
        "ackfail_why": dict(
            Counter(
                f"consumer {i} p{w[1]}: {w[5] if len(w) > 5 else '?'}"
                for i, c in enumerate(procs)
                for w in c.lines
                if w and w[0] == "ACKFAIL"
            )
        ),
        "ackfail_before_first_kill": sum(
            1 for c, n in zip(procs, before_kill, strict=True) for w in c.lines[:n] if w and w[0] == "ACKFAIL"
        ),
    }


def _commit_spans(lines: list[list[str]]) -> Iterator[tuple[list[str], tuple[float, float]]]:
    """Each ACCEPT and ACKFAIL line of one consumer with its commitSync's (start, end) wall-clock milliseconds
    (ShareConsumerCompat prints COMMIT start end before them; the slack covers the two processes' clock reads)."""
    span = (float("-inf"), float("inf"))
    for w in lines:
        if w and w[0] == "COMMIT":
            span = (int(w[1]) - 50, int(w[2]) + 50)
        elif w and w[0] in ("ACCEPT", "ACKFAIL"):
            yield w, span


def lags(bootstrap: str, group: str, topic: str) -> list[int]:
    """The group's lag on each partition of topic (DescribeShareGroupOffsets): 0 once every record is done."""
    return [
        lag if not error else -1 for error, _, lag in share_group_offsets(bootstrap, group, topic, [0, 1])
    ]


def test_a_leader_killed_mid_run(
    share_classpath: str, cluster: dict[int, BrokerProcess], topic_name: str
) -> None:
    counts = run_scenario(share_classpath, cluster, topic_name, 600, 2, 1, seed=1)
    assert counts["applied_unconfirmed_outside_a_kill"] == 0, str(counts)  # whole: pytest shortens a dict


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--consumers", type=int, default=5)
    ap.add_argument("--kills", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    reason = zookeeper_missing()
    if reason is not None:
        print(f"skipped: {reason}")
        return 0
    jars = single.classpath("kafka-clients-4.2", single.CLIENTS)
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        cp = single.compile_compat(work / "classes", jars)
        brokers = three_brokers(work / "cluster")
        cluster = next(brokers)
        started = time.monotonic()
        try:
            counts = run_scenario(
                cp, cluster, "share-long", args.records, args.consumers, args.kills, args.seed
            )
            assert counts["applied_unconfirmed_outside_a_kill"] == 0, counts
        finally:
            brokers.close()
    print(
        f"{counts['accepted']} records accepted exactly once through {args.kills} broker kills "
        f"({counts['ackfail']} acknowledgements unconfirmed, {counts['applied_unconfirmed']} of them applied "
        f"all the same) in {time.monotonic() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

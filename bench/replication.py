"""Workload: replication. Three kbroker processes on one ZooKeeper (started for the run) on this machine. The same
confluent-kafka produce (100 B, acks=all, 4 topics x 4 partitions) goes to replication factor 3 topics with
min.insync.replicas=2 and to replication factor 1 topics of the same cluster, alternating which goes first; then
end-to-end latency (bench.latency's producer and consumer, one run per repetition and rate) at 10,000 and 5,000 msg/s,
each rate on a replication factor 3 topic of its own.
Targets (issue 13): replication factor 3 at least 0.5x the replication factor 1 throughput, p99 under 10 ms at
10,000 msg/s (the 5,000 msg/s rows are for reference).

With --peers kafka3.9, three Apache Kafka 3.9 brokers join the same ZooKeeper (under the chroot /kafka, so the two
clusters do not meet), started beside the kbrokers, and every row runs on both clusters in turn (kbroker first in odd
repetitions, Kafka first in even ones). Broker CPU per message is the sum over each cluster's three processes. Kafka
4.x has no ZooKeeper mode and Tansu no replication: neither has a cluster here."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench import clients, latency
from bench.harness import Ctx, KafkaTarget, KBroker, Row, Target, kb_le, med, payloads, workdir
from bench.peers.zookeeper import ZooKeeperServer, zookeeper_missing

NTOPICS = 4
LATENCY_RATES = (latency.RATE, latency.RATE // 2)


def _cluster(ctx: Ctx, overrides: dict[str, str] | None = None) -> tuple[ZooKeeperServer, list[KBroker]]:
    """ZooKeeper and three kbrokers (broker.id 1, 2, 3) on it, `overrides` in each broker's configuration."""
    reason = zookeeper_missing()
    if reason is not None:
        raise RuntimeError(f"replication workload needs ZooKeeper: {reason}")
    zk = ZooKeeperServer(workdir(ctx.base, "zookeeper")).start()
    brokers = [KBroker(ctx.base, {"zookeeper.connect": zk.connect, "broker.id": str(i), **(overrides or {})})
               for i in (1, 2, 3)]
    for kb in brokers:
        kb.start()
    return zk, brokers


class Cluster(Target):
    """Three brokers measured as one: CPU summed over the processes, peak RSS the largest of them."""

    def __init__(self, name: str, brokers: list[Any]) -> None:
        self.name, self.brokers = name, brokers
        self.bootstrap = ",".join(b.bootstrap for b in brokers)

    def cpu(self) -> float:
        return sum(b.cpu() for b in self.brokers)

    def hwm_mb(self) -> float:
        return max(b.hwm_mb() for b in self.brokers)

    def stop(self) -> None:
        for b in self.brokers:
            b.stop()


def _kafka_cluster(ctx: Ctx, zk: ZooKeeperServer, overrides: dict[str, str] | None = None) -> Cluster | None:
    """Three Kafka 3.9 brokers (broker.id 1, 2, 3) on `zk` under /kafka, `overrides` in each server.properties, or
    None (noted in ctx.extra["unavailable"]) if they cannot run."""
    peers = ctx.extra.get("peers", [])
    for key, why in (("kafka4", "Kafka 4.x has no ZooKeeper mode"), ("tansu", "Tansu has no replication")):
        if key in peers:
            ctx.extra.setdefault("unavailable", {})[f"{key} (replication)"] = why
    if "kafka3.9" not in peers:
        return None
    heap = ctx.extra.get("kafka_heap", "1g")
    overrides = {"offsets.topic.replication.factor": "3", "transaction.state.log.replication.factor": "3",
                 "transaction.state.log.min.isr": "2", **(overrides or {})}
    nodes = [KafkaTarget(ctx.base, "3.9", heap, zookeeper=f"{zk.connect}/kafka", broker_id=i, overrides=overrides)
             for i in (1, 2, 3)]
    try:
        for t in nodes:
            t.start()
    except Exception as e:  # noqa: BLE001 - ArtifactUnavailable, or a broker would not start
        for t in nodes:
            t.stop()
        reason = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        ctx.extra.setdefault("unavailable", {})["Kafka 3.9 three-broker cluster"] = reason
        ctx.log(f"  [Kafka 3.9 cluster unavailable: {reason}]")
        return None
    ctx.log(f"  [three Kafka {nodes[0].peer.version} brokers up on {zk.connect}/kafka]")
    return Cluster(nodes[0].name, nodes)


def _at_least(baseline: Row, factor: float) -> Callable[[Row], bool | None]:
    def chk(r: Row) -> bool | None:
        a, b = med(r.kb), med(baseline.kb)
        return None if a is None or not b else a >= factor * b

    return chk


def _create(bootstrap: str, names: list[str], partitions: int, rf: int, configs: dict[str, str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    deadline = time.monotonic() + 60
    while True:
        fs = admin.create_topics([NewTopic(n, partitions, rf, config=configs) for n in names], request_timeout=30)
        try:
            for f in fs.values():
                f.result(60)
            break
        except Exception as e:  # noqa: BLE001 - brokers still registering: replication factor not yet possible
            if "TOPIC_ALREADY_EXISTS" in str(e):
                break
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    md_deadline = time.monotonic() + 60
    while time.monotonic() < md_deadline:
        md = admin.list_topics(timeout=10)
        if all(n in md.topics and len(md.topics[n].partitions) == partitions
               and all(p.leader >= 0 and len(p.isrs) == rf for p in md.topics[n].partitions.values())
               for n in names):
            return
        time.sleep(0.2)
    raise RuntimeError(f"topics {names} without full ISRs after 60 s")


def run(ctx: Ctx) -> list[Row]:
    n = ctx.n(500_000, 50_000)
    values = payloads(100)
    rf1 = Row("produce 100 B acks=all, 3-broker cluster, replication factor 1 (baseline)", "msg/s",
              target="(baseline)")
    rf3 = Row("produce 100 B acks=all, 3-broker cluster, replication factor 3, min.insync.replicas=2", "msg/s",
              target=">= 0.5x replication factor 1", check=_at_least(rf1, 0.5))
    # The rate (its target), and half of it for reference: on two cores the three brokers and both clients
    # saturate the machine from a few thousand messages a second, so how the latency moves with the rate is part
    # of reading the target's row.
    lat_rows = {
        (rate, q): Row(f"e2e latency at {rate:,} msg/s, replication factor 3, p{q}", "ms",
                       target="< 10 ms" if (rate, q) == (latency.RATE, "99") else "",
                       check=kb_le(10.0) if (rate, q) == (latency.RATE, "99") else None, higher_is_better=False)
        for rate in LATENCY_RATES for q in ("50", "99")
    }
    zk, brokers = _cluster(ctx)
    clusters = [Cluster("kbroker", brokers)]
    try:
        kafka = _kafka_cluster(ctx, zk)
        if kafka is not None:
            clusters.append(kafka)
        for rep in range(ctx.reps):
            if ctx.out_of_time(f"replication rep {rep + 1}"):
                break
            for c in clusters if rep % 2 == 0 else clusters[::-1]:
                runs = [(1, rf1), (3, rf3)]
                for factor, row in runs if rep % 2 == 0 else runs[::-1]:
                    topics = [f"repl_r{rep}_rf{factor}_{k}" for k in range(NTOPICS)]
                    _create(c.bootstrap, topics, 4, factor, {"min.insync.replicas": "2"} if factor == 3 else {})
                    # Warm-up outside the timed run: followers start fetching new partitions within a fetch round.
                    clients.produce(c.bootstrap, clients.partitions_of(topics), max(n // 20, 1000), values,
                                    {"acks": "all"}, timeout=60)
                    cpu0 = c.cpu()
                    secs, left = clients.produce(c.bootstrap, clients.partitions_of(topics), n, values,
                                                 {"acks": "all"}, timeout=180)
                    cpu = c.cpu() - cpu0
                    if left:
                        row.note += f" {c.name} rep{rep + 1}: {left} undelivered;"
                    row.add(c, n / secs if not left else float("nan"), cpu * 1e6 / n)
                    ctx.log(f"  replication rep {rep + 1} {c.name} rf{factor}: {n / secs:,.0f} msg/s "
                            f"({cpu * 1e6 / n:.2f} us CPU/msg over the three brokers)")
        if not ctx.out_of_time("replication latency"):
            topics = {rate: f"{latency.TOPIC}_{rate}" for rate in LATENCY_RATES}
            for c in clusters:
                _create(c.bootstrap, list(topics.values()), latency.PARTITIONS, 3, {"min.insync.replicas": "2"})
            time.sleep(1.0)
            for rep in range(ctx.reps):
                if rep and ctx.out_of_time(f"replication latency rep {rep + 1}"):
                    break
                for c in clusters if rep % 2 == 0 else clusters[::-1]:
                    for rate in LATENCY_RATES if rep % 2 == 0 else LATENCY_RATES[::-1]:
                        # Each run's consumer starts at offset 0: earlier runs' records fall in the first second it
                        # excludes.
                        cpu0 = c.cpu()
                        lat, sent, got = latency.one_run(c.bootstrap, ctx.extra.get("latency_seconds", 5.0), rate,
                                                         topics[rate])
                        cpu = c.cpu() - cpu0
                        for q in ("50", "99"):
                            lat_rows[rate, q].add(c, latency.pct(lat, float(q) / 100),
                                                  cpu * 1e6 / max(sent, 1) if q == "50" else None)
                        if got < sent:
                            lat_rows[rate, "50"].note += f" {c.name} rep{rep + 1}: received {got} of {sent};"
                        ctx.log(f"  replication latency rep {rep + 1} {c.name} at {rate:,} msg/s: p50 "
                                f"{latency.pct(lat, .5):.2f} p99 {latency.pct(lat, .99):.2f} ms")
        for r in (rf1, rf3, *lat_rows.values()):
            for c in clusters:
                r.add_rss(c)
    finally:
        for c in clusters:
            c.stop()
        zk.stop()
    a, b = med(rf3.kb), med(rf1.kb)
    if a is not None and b:
        rf3.note += f" {a / b:.2f}x replication factor 1 in the same run"
    for name, xs in rf3.others.items():
        oa, ob = med(xs), med(rf1.others.get(name, []))
        if oa is not None and ob:
            rf3.note += f", {name} {oa / ob:.2f}x"
    rf3.note += ";"
    return [rf1, rf3, *lat_rows.values()]

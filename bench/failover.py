"""Workload: leader failover after kill -9, as the producing client sees it. Three kbrokers on one ZooKeeper (and,
with --peers kafka3.9, three Apache Kafka 3.9 brokers on the same ZooKeeper under /kafka: bench.replication's
clusters), every broker with zookeeper.session.timeout.ms=6000 (ZooKeeper here grants 1 to 10 s; kbroker's and
Kafka's default is 18000).

Each repetition creates a topic of one partition, replication factor 3, min.insync.replicas=2, whose leader (first
replica) is a broker that is NOT the controller: a controller's kill is another case (a new controller election
first). An idempotent acks=all confluent-kafka producer sends 100 B records at RATE msg/s; once acknowledgements have
flowed for two seconds the leader is killed with SIGKILL; the producer goes on until two seconds after the first
acknowledgement of a record sent after the kill, then flushes.
Rows: the longest gap between successive delivery acknowledgements (the produce pause), and the time from the kill to
the first acknowledgement after that gap. Every acknowledged record is then read back from the new leader (lost or
duplicated ones go to the note), and the killed broker is started again (Kafka 3.9 exits with NodeExists until its
killed predecessor's ZooKeeper session expires: started again at once, as bench.restart does). The clusters
alternate which goes first."""

from __future__ import annotations

import time
from typing import Any

from bench.harness import Ctx, KafkaTarget, KBroker, Row, med
from bench.replication import Cluster, _cluster, _kafka_cluster
from bench.restart import start_supervised

SESSION_TIMEOUT_MS = 6000
RATE = 2000  # msg/s
BEFORE_KILL = 2.0  # seconds of steady producing before the kill
AFTER_RECOVERY = 2.0  # seconds of producing once acknowledgements flow again
SIZE = 100


def _create(bootstrap: str, topic: str, replicas: list[int]) -> None:
    """One partition on `replicas` (the first the preferred leader), min.insync.replicas=2, with a full ISR led by
    replicas[0]; retried while a restarted broker is still registering."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    deadline = time.monotonic() + 90
    while True:
        fs = admin.create_topics(
            [NewTopic(topic, 1, -1, replica_assignment=[replicas], config={"min.insync.replicas": "2"})],
            request_timeout=30,
        )
        try:
            fs[topic].result(60)
            break
        except Exception as e:  # noqa: BLE001 - a broker not yet registered: the assignment is not yet valid
            if "TOPIC_ALREADY_EXISTS" in str(e):
                break
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    while time.monotonic() < deadline:
        p = admin.list_topics(topic, timeout=10).topics[topic].partitions.get(0)
        if p is not None and p.leader == replicas[0] and len(p.isrs) == len(replicas):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{topic}: no full ISR led by broker {replicas[0]} after 90 s")


def _controller(bootstrap: str) -> int:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 3}).list_topics(timeout=10).controller_id


def _value(i: int) -> bytes:
    head = b"%012d" % i
    return head + b"x" * (SIZE - len(head))


def _produce_through_kill(
    bootstrap: str, topic: str, kill: Any
) -> tuple[float, list[float], dict[int, float]]:
    """Produce at RATE, call kill() once acknowledgements have flowed for BEFORE_KILL s; returns the kill's time,
    every acknowledgement's time and the acknowledged sequence numbers (-> time)."""
    from confluent_kafka import Producer

    acks: list[float] = []
    acked: dict[int, float] = {}
    errors: list[str] = []
    state = {"t_kill": float("inf"), "recovered": float("inf"), "sent_at_kill": float("inf")}

    def on_delivery(err: Any, msg: Any) -> None:
        now = time.monotonic()
        if err is not None:
            errors.append(str(err))
            return
        seq = int(msg.value()[:12])
        # Sent after the kill: only the new leader can have acknowledged it (acknowledgements of records sent before
        # may still arrive just after the kill).
        if seq >= state["sent_at_kill"] and state["recovered"] == float("inf"):
            state["recovered"] = now
        acks.append(now)
        acked[seq] = now

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 120_000,
            "log_level": 2,
        }
    )
    t0 = time.monotonic()
    i = 0
    deadline = t0 + 90
    while True:
        now = time.monotonic()
        # Kill once acknowledgements have flowed for BEFORE_KILL s: a fresh producer's first batches (producer id,
        # metadata, a new partition's followers) must not be mistaken for, or hide, the failover.
        if acks and now >= acks[0] + BEFORE_KILL and state["t_kill"] == float("inf"):
            state["t_kill"], state["sent_at_kill"] = time.monotonic(), i
            kill()
            now = time.monotonic()
        if now > state["recovered"] + AFTER_RECOVERY or now > deadline:
            break
        due = t0 + i / RATE
        if now >= due:
            p.produce(topic, _value(i), partition=0, on_delivery=on_delivery)
            i += 1
            p.poll(0)
        else:
            p.poll(due - now)
    left = p.flush(120)
    if left or errors:
        raise RuntimeError(f"{topic}: {left} undelivered, {len(errors)} failed ({errors[:1]})")
    return state["t_kill"], acks, acked


def _read_back(bootstrap: str, topic: str, acked: dict[int, float]) -> tuple[int, int]:
    """(acknowledged records missing from the log, duplicated sequence numbers), reading the whole partition."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"failover-check-{topic}",
            "enable.auto.commit": False,
            "log_level": 2,
        }
    )
    try:
        _, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        seen: dict[int, int] = {}
        offset, deadline = -1, time.monotonic() + 60
        while offset < high - 1 and time.monotonic() < deadline:
            for m in c.consume(1000, 1.0):
                if m.error() is None:
                    k = int(m.value()[:12])
                    seen[k] = seen.get(k, 0) + 1
                    offset = m.offset()
    finally:
        c.close()
    return sum(1 for k in acked if k not in seen), sum(1 for n in seen.values() if n > 1)


def _restart(broker: Any) -> None:
    if isinstance(broker, KafkaTarget):
        start_supervised(broker, time.monotonic() + 120)
    else:
        broker.start()


def _kill(broker: Any) -> None:
    if isinstance(broker, KafkaTarget):
        broker.peer.kill()
        broker.proc = None
    else:
        assert isinstance(broker, KBroker)
        broker.kill9()


def _one(ctx: Ctx, c: Cluster, rep: int, pause: Row, first: Row) -> None:
    controller = _controller(c.bootstrap)
    others = [i for i in (1, 2, 3) if i != controller]
    victim = others[rep % len(others)]
    topic = f"failover_r{rep}"
    _create(c.bootstrap, topic, [victim, *[i for i in (1, 2, 3) if i != victim]])
    broker = c.brokers[victim - 1]
    t_kill, acks, acked = _produce_through_kill(c.bootstrap, topic, lambda: _kill(broker))
    gaps = [(b - a, b) for a, b in zip(acks, acks[1:], strict=False) if b > t_kill]
    gap, end = max(gaps) if gaps else (float("nan"), float("nan"))
    pause.add(c, gap * 1000)
    first.add(c, (end - t_kill) * 1000)
    lost, dups = _read_back(c.bootstrap, topic, acked)
    if lost or dups:
        pause.note += f" {c.name} rep{rep + 1}: {lost} acknowledged records lost, {dups} duplicated;"
    ctx.log(
        f"  failover rep {rep + 1} {c.name}: killed broker {victim} (controller {controller}), pause "
        f"{gap * 1000:.0f} ms, kill -> first ack {(end - t_kill) * 1000:.0f} ms, {len(acked)} acknowledged, "
        f"{lost} lost, {dups} duplicated"
    )
    _restart(broker)


def run(ctx: Ctx) -> list[Row]:
    overrides = {"zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS)}
    pause = Row(
        f"leader failover after kill -9, produce pause (client; non-controller leader, "
        f"zookeeper.session.timeout.ms={SESSION_TIMEOUT_MS}, {RATE:,} msg/s acks=all idempotent)",
        "ms",
        target="<= Kafka 3.9",
        higher_is_better=False,
    )
    first = Row(
        "leader failover after kill -9: kill -> first acknowledgement from the new leader",
        "ms",
        target="",
        higher_is_better=False,
    )

    def no_slower(r: Row) -> bool | None:
        a = med(r.kb)
        b = next((med(v) for k, v in r.others.items() if k.startswith("Kafka 3.9")), None)
        return None if a is None or b is None else a <= b

    pause.check = no_slower
    zk, brokers = _cluster(ctx, overrides)
    clusters = [Cluster("kbroker", brokers)]
    try:
        kafka = _kafka_cluster(ctx, zk, overrides)
        if kafka is not None:
            clusters.append(kafka)
        for rep in range(ctx.reps):
            if ctx.out_of_time(f"failover rep {rep + 1}"):
                break
            for c in clusters if rep % 2 == 0 else clusters[::-1]:
                try:
                    _one(ctx, c, rep, pause, first)
                except Exception as e:  # noqa: BLE001 - one cluster's failed repetition must not lose the other's
                    why = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
                    pause.note += f" {c.name} rep{rep + 1}: failed: {type(e).__name__}: {why};"
                    ctx.log(f"  [failover rep {rep + 1} {c.name} failed: {type(e).__name__}: {why}]")
                    for b in c.brokers:
                        if not b.alive():
                            _restart(b)
    finally:
        for c in clusters:
            c.stop()
        zk.stop()
    return [pause, first]

"""`python -m tests.differential.mixed_failures [--scenario NAME ...]`: failures in a mixed ZooKeeper cluster of Apache
Kafka 3.9 brokers and kbrokers, each scenario under an idempotent acks=all load (confluent-kafka).

- controller-failover: Kafka 1 (controller) and kbroker 0. Kafka 1 is killed (kill -9): kbroker 0 becomes controller
  and leads both partitions; Kafka 1 restarts and kbroker 0's LeaderAndIsr makes it a follower, then its preferred
  leader again (auto leader rebalance). Then kbroker 0, now controller, is killed: Kafka 1 takes over and drives
  kbroker 0 back the same way.
- controller-failover-survivors: Kafka 1 (controller), Kafka 2, kbrokers 0 and 3, three replicas a partition. The
  same both ways, with live brokers of the other kind at the failover (paused while the election is held, so the
  kind that must win wins): kbroker 0's failover makes Kafka 2 leader of Kafka 1's partition, a Kafka controller's
  makes kbroker 3 leader of kbroker 0's.
- truncation: the same two brokers under an acks=1 load as well. The follower of one kind is paused for 1.5 s (still
  in the ISR) so its leader takes records it lacks, the leader is killed and the follower resumed: it becomes
  leader, the old leader restarts and truncates to the new leader's epochs (OffsetForLeaderEpoch); both ways. Both
  replicas' logs must end equal (offsets, batch leader epochs and values).
- isr: kbroker 2 (controller), kbroker 0 and Kafka 1 with replica.lag.time.max.ms 3000. A follower is paused
  (SIGSTOP): its leader of the other kind shrinks the ISR; resumed (SIGCONT): the ISR expands again; both ways.
  isr-kafka-controller: the same with Kafka 2 as the controller.
- preferred: Kafka 1 (controller) and kbroker 0 without auto leader rebalance. A broker's controlled shutdown moves
  its leadership to the other kind; once it is back, AdminClient ElectLeaders (preferred) moves it back, once through
  a kbroker controller and once through a Kafka one.

Every scenario ends with every acknowledged acks=all record read back. Prints a line per step and PASS or FAIL per
scenario; exit status 0 when all passed, 1 otherwise, 2 when Kafka 3.9 or ZooKeeper cannot be had."""

from __future__ import annotations

import argparse
import functools
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.differential.mixed_cluster import MixedCluster, ReplicaLog, StepFailed, expect
from tests.differential.rolling import Load, _guard, _producer, _read_all, log

PARTITIONS = 2
# Partition 0 prefers Kafka 1 (kbroker 0 follows), partition 1 prefers kbroker 0 (Kafka 1 follows).
ASSIGNMENT = [[1, 0], [0, 1]]
SETTINGS = {
    "zookeeper.session.timeout.ms": "6000",
    "offsets.topic.replication.factor": "2",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "2",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "default.replication.factor": "2",
    "min.insync.replicas": "1",
    "num.partitions": str(PARTITIONS),
    "auto.create.topics.enable": "false",
    "unclean.leader.election.enable": "false",
    "leader.imbalance.check.interval.seconds": "2",
}


class Unavailable(Exception):
    """Kafka 3.9 or ZooKeeper cannot be had here."""


@contextmanager
def cluster(settings: dict[str, str]) -> Iterator[MixedCluster]:
    from bench.peers.zookeeper import ZooKeeperServer, zookeeper_missing

    why = zookeeper_missing()
    if why:
        raise Unavailable(why)
    with tempfile.TemporaryDirectory(prefix="mixed-failures-") as tmp:
        root = Path(tmp)
        zk = ZooKeeperServer(root / "zk").start()
        mixed = MixedCluster(root, zk.connect, settings)
        try:
            yield mixed
        finally:
            mixed.close()
            zk.stop()


def start(mixed: MixedCluster, broker_id: int) -> None:
    from bench.peers.maven import ArtifactUnavailable

    try:
        mixed.start(broker_id)
    except ArtifactUnavailable as e:
        raise Unavailable(f"Kafka 3.9 is unavailable here: {e}") from e
    log(f"{mixed.name(broker_id)} started")


def controller_is(mixed: MixedCluster, topic: str, broker_id: int) -> None:
    expect(
        f"every live broker names {mixed.name(broker_id)} controller",
        lambda: mixed.views_agree(topic, lambda v: v.controller == broker_id),
        60,
    )


def leads(mixed: MixedCluster, topic: str, broker_id: int, partitions: list[int], why: str) -> None:
    expect(
        f"{mixed.name(broker_id)} leads {topic} {partitions} ({why})",
        lambda: mixed.views_agree(topic, lambda v: all(v.leader(p) == broker_id for p in partitions)),
        90,
    )


def full_isr(mixed: MixedCluster, topic: str, replicas: list[list[int]] = ASSIGNMENT) -> None:
    expect(
        f"ISR of every {topic} partition is full ({replicas})",
        lambda: mixed.views_agree(topic, lambda v: all(v.isr(p) == set(r) for p, r in enumerate(replicas))),
        120,
    )


def goes_on(load: Load, what: str, timeout: float = 60) -> None:
    with load.lock:
        before = len(load.acked)
    expect(
        f"{what}: acks=all records still acknowledged (>{before})",
        lambda: _acked(load) > before + 20,
        timeout,
    )


def followers_caught_on(mixed: MixedCluster, topic: str, replicas: list[list[int]] = ASSIGNMENT) -> None:
    """Every follower holds records of its partition. A follower told of a new partition before its leader was
    (the leader's own LeaderAndIsr still on its way) waits replica.fetch.backoff.ms after each
    UNKNOWN_TOPIC_OR_PARTITION, Kafka's and kbroker's alike: a kill before this would test an empty follower."""

    def caught_on() -> bool:
        try:
            return all(mixed.replica_log(r[1], topic, p).log_end > 0 for p, r in enumerate(replicas))
        except (StepFailed, OSError, ConnectionError):
            return False

    expect(f"every follower of {topic} holds records", caught_on, 60)


def _acked(load: Load) -> int:
    with load.lock:
        return len(load.acked)


def run_load(mixed: MixedCluster, topic: str, acks: str = "all") -> tuple[Load, threading.Thread]:
    load = Load()
    thread = _guard(
        functools.partial(_producer, topic=topic, acks=acks), mixed.bootstrap, load, f"producer-{topic}"
    )
    return load, thread


def finish_load(
    mixed: MixedCluster,
    topic: str,
    load: Load,
    thread: threading.Thread,
    lossless: bool,
    partitions: int = PARTITIONS,
) -> int:
    """Stop the producer and read `topic` back: every acknowledged record there when `lossless` (acks=all); for
    acks=1 the records lost with a killed leader are only counted. Returns how many acknowledged were lost."""
    load.stop.set()
    thread.join(180)
    values = set(_read_all(mixed.bootstrap, topic, partitions))
    lost = load.acked - values
    log(
        f"{topic}: {len(load.acked)} records acknowledged, {len(values)} read back, {len(lost)} lost "
        f"{sorted(lost)[:5]}; producer errors {len(load.produce_errors)} {sorted(set(load.produce_errors))[:3]}"
    )
    if lossless and (lost or not load.acked):
        raise StepFailed(f"{topic}: acknowledged acks=all records lost")
    return len(lost)


def logs_equal(mixed: MixedCluster, topic: str, replicas: list[list[int]] = ASSIGNMENT) -> None:
    """Each partition's replicas hold the same records (offsets, batch leader epochs, values) up to the same log
    end, once the followers caught up (high watermark at the log end on every replica)."""
    for partition, brokers in enumerate(replicas):
        logs: dict[int, ReplicaLog] = {}
        seen: list[str] = [""]

        def settled(
            p: int = partition,
            bs: list[int] = brokers,
            logs: dict[int, ReplicaLog] = logs,
            seen: list[str] = seen,
        ) -> bool:
            try:
                logs.update({b: mixed.replica_log(b, topic, p) for b in bs})
            except (StepFailed, OSError, ConnectionError) as e:
                seen[0] = str(e)
                return False
            ends = {(lg.log_end, lg.high_watermark) for lg in logs.values()}
            seen[0] = ", ".join(
                f"{mixed.name(b)}: end {lg.log_end} hw {lg.high_watermark}" for b, lg in logs.items()
            )
            return len(ends) == 1 and next(iter(ends))[0] == next(iter(ends))[1]

        try:
            expect(
                f"{topic}-{partition}: replicas {brokers} at the same log end and high watermark", settled, 60
            )
        except StepFailed:
            log(f"last seen: {seen[0]}")
            raise
        first, *others = (logs[b] for b in brokers)
        for b, other in zip(brokers[1:], others, strict=True):
            if other.records != first.records:
                diff = next(
                    (i for i, (x, y) in enumerate(zip(first.records, other.records, strict=False)) if x != y),
                    min(len(first.records), len(other.records)),
                )
                log(
                    f"{topic}-{partition}: {mixed.name(brokers[0])} and {mixed.name(b)} differ from record {diff}"
                )
                raise StepFailed(f"{topic}-{partition} replicas differ")
        epochs = sorted({ep for _, ep, _ in first.records})
        log(
            f"{topic}-{partition}: {' and '.join(mixed.name(b) for b in brokers)} hold the same "
            f"{len(first.records)} records up to offset {first.log_end} (leader epochs {epochs})"
        )


def two_brokers(mixed: MixedCluster, topic: str, extra: dict[str, str] | None = None) -> None:
    """Kafka 1 first (so it is controller), then kbroker 0, and `topic` on both (ASSIGNMENT)."""
    mixed.add_kafka(1)
    mixed.add_kbroker(0)
    start(mixed, 1)
    start(mixed, 0)
    expect("both brokers registered, Kafka 1 controller", lambda: _registered(mixed, 2, 1), 60)
    mixed.create_topic(topic, ASSIGNMENT, extra)
    log(f"topic {topic} created, replicas {ASSIGNMENT}")
    full_isr(mixed, topic)


def controller_failover(mixed: MixedCluster) -> None:
    topic = "failover"
    two_brokers(mixed, topic)
    load, thread = run_load(mixed, topic)
    goes_on(load, "before any failure")
    followers_caught_on(mixed, topic)

    # Kafka 1 (controller, leader of partition 0) dies, then kbroker 0 (controller, leader of partition 1): each
    # time the other kind's controller elects, and its preferred-leader rebalance gives the partition back.
    for victim, survivor, partition in ((1, 0, 0), (0, 1, 1)):
        kind = {0: "kbroker", 1: "Kafka"}
        dead, alive = f"{kind[victim]} {victim}", f"{kind[survivor]} {survivor}"
        mixed.kill(victim)
        log(f"kill -9 {dead} (controller, leader of partition {partition})")
        controller_is(mixed, topic, survivor)
        leads(mixed, topic, survivor, [0, 1], f"elected by {kind[survivor]} controller {survivor}")
        goes_on(load, f"{alive} alone")
        start(mixed, victim)
        full_isr(mixed, topic)
        leads(
            mixed,
            topic,
            victim,
            [partition],
            f"{kind[survivor]} controller {survivor}'s preferred-leader rebalance made {dead} leader",
        )
        goes_on(load, f"{dead} leads partition {partition} again")
    finish_load(mixed, topic, load, thread, lossless=True)
    logs_equal(mixed, topic)


# Four brokers, three replicas a partition: partition 0 falls to Kafka 2 when Kafka 1 goes, partition 1 to kbroker 3
# when kbroker 0 goes.
SURVIVORS_ASSIGNMENT = [[1, 2, 0], [0, 3, 1], [3, 0, 2], [2, 1, 3]]
# The killed brokers' ZooKeeper sessions end after 6 s; the paused ones' outlast their pause (ZooKeeper's most, 10 s).
LONG_SESSION = {"zookeeper.session.timeout.ms": "10000"}


def controller_failover_survivors(mixed: MixedCluster) -> None:
    """A new controller of one kind drives live brokers of the other kind at once (onControllerFailover), not only
    restarted ones: the survivors that must not win the election are paused while it is held."""
    topic = "survivors"
    mixed.add_kafka(1)
    mixed.add_kafka(2, LONG_SESSION)
    mixed.add_kbroker(0)
    mixed.add_kbroker(3, LONG_SESSION)
    for b in (1, 2, 0, 3):
        start(mixed, b)
    expect("four brokers registered, Kafka 1 controller", lambda: _registered(mixed, 4, 1), 60)
    mixed.create_topic(topic, SURVIVORS_ASSIGNMENT)
    log(f"topic {topic} created, replicas {SURVIVORS_ASSIGNMENT}")
    full_isr(mixed, topic, SURVIVORS_ASSIGNMENT)
    load, thread = run_load(mixed, topic)
    goes_on(load, "before any failure")
    followers_caught_on(mixed, topic, SURVIVORS_ASSIGNMENT)

    for paused in (2, 3):
        mixed.pause(paused)
    mixed.kill(1)
    log("SIGSTOP Kafka 2 and kbroker 3, kill -9 Kafka 1 (controller, leader of partition 0)")
    expect(
        "kbroker 0 is controller",
        lambda: mixed.views_agree(topic, lambda v: v.controller == 0, [0]),
        60,
    )
    for paused in (2, 3):
        mixed.resume(paused)
    log("SIGCONT Kafka 2 and kbroker 3")
    controller_is(mixed, topic, 0)
    leads(mixed, topic, 2, [0], "elected by kbroker controller 0 while Kafka 2 lived on")
    goes_on(load, "without Kafka 1")
    start(mixed, 1)
    full_isr(mixed, topic, SURVIVORS_ASSIGNMENT)
    leads(mixed, topic, 1, [0], "kbroker controller 0's preferred-leader rebalance")

    mixed.pause(3)
    mixed.kill(0)
    log("SIGSTOP kbroker 3, kill -9 kbroker 0 (controller, leader of partition 1)")
    expect(
        "a Kafka broker is controller",
        lambda: mixed.views_agree(topic, lambda v: v.controller in (1, 2), [1, 2]),
        60,
    )
    mixed.resume(3)
    log("SIGCONT kbroker 3")
    kafka_controller = mixed.view(1, topic)
    controller = kafka_controller.controller if kafka_controller is not None else 1
    controller_is(mixed, topic, controller)
    leads(mixed, topic, 3, [1], f"elected by Kafka controller {controller} while kbroker 3 lived on")
    goes_on(load, "without kbroker 0")
    start(mixed, 0)
    full_isr(mixed, topic, SURVIVORS_ASSIGNMENT)
    leads(mixed, topic, 0, [1], f"Kafka controller {controller}'s preferred-leader rebalance")
    goes_on(load, "every broker back")
    finish_load(mixed, topic, load, thread, lossless=True, partitions=len(SURVIVORS_ASSIGNMENT))
    logs_equal(mixed, topic, SURVIVORS_ASSIGNMENT)


# What each kind logs when a replica's log is cut back (not when the cut would change nothing).
TRUNCATION_LINE = {
    True: re.compile(r"Truncating to offset \d+"),  # Kafka's UnifiedLog.truncateTo
    False: re.compile(r": truncating \S+ from \d+ to \d+"),  # kbroker's replica fetcher
}
# How long the follower is paused before its leader is killed: the leader takes acks=1 records the follower never
# sees, which the old leader must drop once the follower leads (acks=all records wait for the follower meanwhile).
FOLLOWER_PAUSE_S = 1.5


def truncation(mixed: MixedCluster) -> None:
    topic, topic_all = "truncation", "truncation-all"
    two_brokers(mixed, topic)
    mixed.create_topic(topic_all, ASSIGNMENT)
    full_isr(mixed, topic_all)
    one, one_thread = run_load(mixed, topic, acks="1")
    every, every_thread = run_load(mixed, topic_all)
    goes_on(every, "before any failure")
    followers_caught_on(mixed, topic)
    followers_caught_on(mixed, topic_all)
    for victim, other, partition in ((1, 0, 0), (0, 1, 1)):
        # The victim leads `partition`; wait for that (the previous round's rebalance) before killing it.
        leads(mixed, topic, victim, [partition], "preferred leader")
        leads(mixed, topic_all, victim, [partition], "preferred leader")
        before = mixed.log_text(victim)
        mixed.pause(other)
        log(f"SIGSTOP {mixed.name(other)} (follower, still in the ISR) for {FOLLOWER_PAUSE_S} s")
        time.sleep(FOLLOWER_PAUSE_S)
        mixed.kill(victim)
        mixed.resume(other)
        log(
            f"kill -9 {mixed.name(victim)} (leader of partition {partition}) under acks=1 and acks=all load; SIGCONT"
        )
        leads(mixed, topic, other, [0, 1], f"{mixed.name(other)} is leader of both")
        goes_on(every, f"{mixed.name(other)} alone")
        start(mixed, victim)
        full_isr(mixed, topic)
        full_isr(mixed, topic_all)
        after = mixed.log_text(victim)
        # Kafka's log file starts again with the process; kbroker's is appended to.
        since = after[len(before) :] if after.startswith(before) else after
        lines = [line for line in since.splitlines() if TRUNCATION_LINE[mixed.is_kafka(victim)].search(line)]
        log(f"{mixed.name(victim)} logged {len(lines)} truncation line(s) after its restart: {lines[:2]}")
        if not lines:
            raise StepFailed(f"{mixed.name(victim)} did not truncate its log after its restart")
        goes_on(every, f"{mixed.name(victim)} back")
    lost = finish_load(mixed, topic, one, one_thread, lossless=False)
    log(f"acks=1: {lost} acknowledged record(s) lost with the killed leaders (allowed for acks=1)")
    if not lost:
        raise StepFailed("no acks=1 record was lost: the old leaders had nothing to truncate")
    finish_load(mixed, topic_all, every, every_thread, lossless=True)
    logs_equal(mixed, topic)
    logs_equal(mixed, topic_all)


def isr(mixed: MixedCluster, kafka_controller: bool = False) -> None:
    topic = "isr"
    # Broker 2 is the controller and replicates nothing of `topic`: pausing a replica never stops the controller.
    if kafka_controller:
        mixed.add_kafka(2)
    else:
        mixed.add_kbroker(2)
    mixed.add_kbroker(0)
    mixed.add_kafka(1)
    for b in (2, 0, 1):
        start(mixed, b)
    expect(f"three brokers registered, {mixed.name(2)} controller", lambda: _registered(mixed, 3, 2), 60)
    mixed.create_topic(topic, ASSIGNMENT)
    log(f"topic {topic} created, replicas {ASSIGNMENT}")
    full_isr(mixed, topic)
    load, thread = run_load(mixed, topic)
    goes_on(load, "before any pause")
    for follower, leader, partition in ((0, 1, 0), (1, 0, 1)):
        mixed.pause(follower)
        log(
            f"SIGSTOP {mixed.name(follower)} (follower of partition {partition}, led by {mixed.name(leader)})"
        )
        others = [b for b in mixed.alive() if b != follower]
        expect(
            f"{mixed.name(leader)} shrank the ISR of partition {partition} to [{leader}]",
            lambda p=partition, ld=leader, o=others: mixed.views_agree(topic, lambda v: v.isr(p) == {ld}, o),
            30,
        )
        mixed.resume(follower)
        log(f"SIGCONT {mixed.name(follower)}")
        full_isr(mixed, topic)
        goes_on(load, f"{mixed.name(follower)} back in the ISR")
    finish_load(mixed, topic, load, thread, lossless=True)
    logs_equal(mixed, topic)


def _registered(mixed: MixedCluster, n: int, controller: int) -> bool:
    from kbroker_tools.wire import WireClient

    for b in mixed.alive():
        try:
            with WireClient(mixed.address(b), timeout=5) as c:
                md = c.metadata([])
        except Exception:  # noqa: BLE001 - still starting
            return False
        if len(md.brokers) != n or md.controller_id != controller:
            return False
    return True


def preferred(mixed: MixedCluster) -> None:
    topic = "preferred"
    mixed.settings = {**mixed.settings, "auto.leader.rebalance.enable": "false"}
    two_brokers(mixed, topic)
    load, thread = run_load(mixed, topic)
    goes_on(load, "before any shutdown")
    for leaving, staying, partition in ((1, 0, 0), (0, 1, 1)):
        mixed.stop(leaving)
        log(
            f"controlled shutdown of {mixed.name(leaving)} (controller, preferred leader of partition {partition})"
        )
        controller_is(mixed, topic, staying)
        leads(mixed, topic, staying, [0, 1], "after the controlled shutdown")
        start(mixed, leaving)
        full_isr(mixed, topic)
        time.sleep(5)  # past two leader.imbalance.check.interval.seconds: no automatic rebalance is on
        view = mixed.view(staying, topic)
        if view is None or view.leader(partition) != staying:
            log(f"partition {partition} moved without ElectLeaders: {view}")
            raise StepFailed("leadership moved with auto.leader.rebalance.enable=false")
        log(f"{mixed.name(staying)} still leads partition {partition} (no automatic rebalance)")
        elect_preferred(mixed, topic, partition)
        log(
            f"ElectLeaders (preferred) for partition {partition} answered by controller {mixed.name(staying)}"
        )
        leads(mixed, topic, leaving, [partition], f"ElectLeaders through controller {mixed.name(staying)}")
        goes_on(load, f"{mixed.name(leaving)} leads partition {partition}")
    finish_load(mixed, topic, load, thread, lossless=True)
    logs_equal(mixed, topic)


def elect_preferred(mixed: MixedCluster, topic: str, partition: int) -> None:
    from confluent_kafka import ElectionType, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": mixed.bootstrap})
    result = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, partition)]).result(60)
    for tp, err in result.items():
        if err is not None:
            raise StepFailed(f"ElectLeaders {tp.topic}-{tp.partition}: {err}")


# A follower paused past replica.lag.time.max.ms leaves the ISR; its ZooKeeper session outlives the pause.
ISR_SETTINGS = {"replica.lag.time.max.ms": "3000", "zookeeper.session.timeout.ms": "10000"}
SCENARIOS: dict[str, tuple[Callable[[MixedCluster], None], dict[str, str]]] = {
    "controller-failover": (controller_failover, {}),
    "controller-failover-survivors": (controller_failover_survivors, {"min.insync.replicas": "2"}),
    "truncation": (truncation, {}),
    "isr": (isr, ISR_SETTINGS),
    "isr-kafka-controller": (functools.partial(isr, kafka_controller=True), ISR_SETTINGS),
    "preferred": (preferred, {}),
}


def run(names: list[str]) -> int:
    results: dict[str, bool] = {}
    for name in names:
        fn, extra = SCENARIOS[name]
        log(f"scenario {name}")
        began = time.monotonic()
        try:
            with cluster({**SETTINGS, **extra}) as mixed:
                try:
                    fn(mixed)
                    results[name] = True
                except StepFailed as e:
                    log(f"step failed: {e}")
                    for b in mixed.brokers:
                        if not mixed.is_kafka(b):
                            print(f"--- {mixed.name(b)} log tail:\n{mixed.log_text(b)[-3000:]}")
                    results[name] = False
        except Unavailable as e:
            print(str(e), file=sys.stderr)
            return 2
        log(f"scenario {name}: {'PASS' if results[name] else 'FAIL'} ({time.monotonic() - began:.0f} s)")
    return 0 if all(results.values()) else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.differential.mixed_failures", description=__doc__)
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), help="default: all of them")
    args = parser.parse_args(argv)
    return run(args.scenario or list(SCENARIOS))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`python -m tests.differential.rolling [--seconds-between S]`: a rolling replacement of a three-broker Apache Kafka 3.9
cluster (ZooKeeper mode) by three kbrokers, one broker at a time, under load.

Kafka brokers 1, 2 and 3 start on one ZooKeeper (inter.broker.protocol.version 3.9); topics `rolling` (idempotent
acks=all records) and `rolling-txn` (transactions of five records) and the internal topics have replication factor 3
and min.insync.replicas 2. While an idempotent producer, a consumer group committing its offsets and a transactional
producer run (confluent-kafka), each Kafka broker in turn is stopped (controlled shutdown) and a kbroker with the same
broker id and an empty log directory takes its place; the next one goes once the kbroker is back in the ISR of every
partition. At the end a read_committed reader checks that every acknowledged record and every committed transaction
is there and no aborted one is, and that the group and the transactions went on after the last replacement.

Prints one line per step and a summary; exit status 0 when nothing acknowledged was lost and load went on, 1
otherwise, 2 when Kafka 3.9 or ZooKeeper cannot be had."""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kbroker_tools.wire import WireClient
from tests.broker_process import BrokerProcess

TOPIC, TXN_TOPIC, GROUP, TXN_ID = "rolling", "rolling-txn", "rolling-group", "rolling-tx"
PARTITIONS = 3
BROKER_IDS = (1, 2, 3)
TXN_RECORDS = 5
INTERNAL = ("__consumer_offsets", "__transaction_state")
# The same cluster settings for both kinds: three replicas everywhere, two in sync for acks=all, few internal
# partitions (each is loaded by the new coordinator), leadership moved back to preferred replicas within seconds
# so kbrokers lead partitions before the next broker goes.
CLUSTER = {
    "offsets.topic.replication.factor": "3",
    "offsets.topic.num.partitions": "6",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "transaction.state.log.num.partitions": "6",
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "num.partitions": str(PARTITIONS),
    "auto.create.topics.enable": "false",
    "group.initial.rebalance.delay.ms": "0",
    "leader.imbalance.check.interval.seconds": "5",
    "unclean.leader.election.enable": "false",
}


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


@dataclass
class Load:
    """What the clients did: acknowledged records, consumed records per phase, committed and aborted transactions."""

    acked: set[str] = field(default_factory=set)
    produce_errors: list[str] = field(default_factory=list)
    consumed: int = 0
    commits: int = 0
    commit_errors: list[str] = field(default_factory=list)
    txn_committed: list[int] = field(default_factory=list)
    txn_aborted: list[int] = field(default_factory=list)
    txn_errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _producer(bootstrap: str, load: Load, topic: str = TOPIC, acks: str = "all") -> None:
    """Records r0, r1, ... to `topic`; idempotent when acks is all (acks=1 producers cannot be)."""
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": acks == "all",
            "acks": acks,
            "linger.ms": 5,
            "message.timeout.ms": 300000,
        }
    )

    def delivered(err: Any, msg: Any) -> None:
        with load.lock:
            if err is None:
                load.acked.add(msg.value().decode())
            else:
                load.produce_errors.append(str(err))

    i = 0
    while not load.stop.is_set():
        value = f"r{i}"
        try:
            p.produce(topic, key=str(i % 97).encode(), value=value.encode(), on_delivery=delivered)
            i += 1
        except BufferError:
            p.poll(0.1)
        p.poll(0)
        time.sleep(0.005)
    p.flush(120)


def _consumer(bootstrap: str, load: Load) -> None:
    from confluent_kafka import Consumer, KafkaException

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": GROUP,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "session.timeout.ms": 10000,
        }
    )
    c.subscribe([TOPIC])
    last_commit = time.monotonic()
    while not load.stop.is_set():
        msg = c.poll(0.5)
        if msg is not None and msg.error() is None:
            with load.lock:
                load.consumed += 1
        if time.monotonic() - last_commit >= 1.0:
            last_commit = time.monotonic()
            try:
                c.commit(asynchronous=False)
                with load.lock:
                    load.commits += 1
            except KafkaException as e:
                with load.lock:
                    load.commit_errors.append(str(e.args[0]))
    c.close()


def _transactions(bootstrap: str, load: Load) -> None:
    from confluent_kafka import KafkaException, Producer

    p = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": TXN_ID, "transaction.timeout.ms": 60000}
    )
    p.init_transactions(120)
    n = 0
    while not load.stop.is_set():
        try:
            p.begin_transaction()
            for j in range(TXN_RECORDS):
                p.produce(TXN_TOPIC, value=f"t{n}-{j}".encode())
            _retrying(lambda: p.commit_transaction(60))
            with load.lock:
                load.txn_committed.append(n)
        except KafkaException as e:
            err = e.args[0]
            with load.lock:
                load.txn_errors.append(str(err))
            if not err.txn_requires_abort():
                raise
            _retrying(lambda: p.abort_transaction(60))
            with load.lock:
                load.txn_aborted.append(n)
        n += 1
        time.sleep(0.2)


def _retrying(call: Callable[[], None], attempts: int = 10) -> None:
    """librdkafka's rule for commit_transaction and abort_transaction: a retriable error means call it again."""
    from confluent_kafka import KafkaException

    for attempt in range(attempts):
        try:
            call()
            return
        except KafkaException as e:
            if not e.args[0].retriable() or attempt == attempts - 1:
                raise
            time.sleep(1)


def _guard(fn: Callable[[str, Load], None], bootstrap: str, load: Load, name: str) -> threading.Thread:
    def run() -> None:
        try:
            fn(bootstrap, load)
        except Exception as e:  # noqa: BLE001 - reported in the summary, the run goes on
            with load.lock:
                load.txn_errors.append(f"{name} thread died: {type(e).__name__}: {e}")

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    return t


def _isr_complete(bootstrap: str, broker_id: int) -> bool:
    """Whether broker_id is in the ISR of every partition of the load's and the internal topics, as the broker at
    `bootstrap` sees it."""
    try:
        with WireClient(bootstrap, timeout=5) as c:
            md = c.metadata([TOPIC, TXN_TOPIC, *INTERNAL])
    except Exception:  # noqa: BLE001 - a broker still starting: ask again
        return False
    seen = 0
    for t in md.topics:
        if t.error_code:
            return False
        for p in t.partitions:
            seen += 1
            if p.error_code or broker_id not in p.isr_nodes:
                return False
    return seen > 0


def _leaders(bootstrap: str) -> dict[int, int]:
    """How many partitions each broker leads (the load's and the internal topics)."""
    out: dict[int, int] = {}
    try:
        with WireClient(bootstrap, timeout=5) as c:
            for t in c.metadata([TOPIC, TXN_TOPIC, *INTERNAL]).topics:
                for p in t.partitions:
                    out[p.leader_id] = out.get(p.leader_id, 0) + 1
    except Exception:  # noqa: BLE001 - only printed
        pass
    return out


def _wait(what: str, check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(1)
    log(f"timed out after {timeout:.0f} s waiting for {what}")
    return False


def _high_watermark(consumer: Any, tp: Any, attempts: int = 10) -> int:
    """The partition's high watermark, asked again while its leadership moves (a leader rebalance just before the
    read answers NOT_LEADER_FOR_PARTITION until librdkafka's metadata catches up)."""
    from confluent_kafka import KafkaException

    for attempt in range(attempts):
        try:
            return int(consumer.get_watermark_offsets(tp, timeout=30)[1])
        except KafkaException:
            if attempt == attempts - 1:
                raise
            time.sleep(1)
    raise AssertionError("unreachable")


def _read_all(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> list[str]:
    """Every committed record of `topic`, read from the start of each partition until the position passes its
    end (control records, the transactions' markers, take offsets too)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"rolling-check-{topic}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    ends = {tp.partition: _high_watermark(c, tp) for tp in tps}
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        msg = c.poll(1.0)
        if msg is not None and msg.error() is None:
            values.append(msg.value().decode())
            continue
        if all(tp.offset >= ends[tp.partition] for tp in c.position(tps)):
            break
    c.close()
    return values


def run(seconds_between: float, reverse: bool = False) -> int:
    """Kafka 3.9 brokers replaced by kbrokers, or (reverse) kbrokers by Kafka 3.9 brokers, one at a time."""
    from bench.peers.kafka import KafkaPeer, fetch
    from bench.peers.maven import ArtifactUnavailable
    from bench.peers.zookeeper import ZooKeeperServer, zookeeper_missing

    why = zookeeper_missing()
    if why:
        print(why, file=sys.stderr)
        return 2
    old_kind, new_kind = ("kbroker", "Kafka") if reverse else ("Kafka", "kbroker")
    with tempfile.TemporaryDirectory(prefix="rolling-") as tmp:
        root = Path(tmp)
        zk = ZooKeeperServer(root / "zk").start()
        old: dict[int, Any] = {}
        new: dict[int, Any] = {}
        load = Load()
        threads: list[threading.Thread] = []

        def broker(kind: str, broker_id: int) -> Any:
            """A started broker of `kind` with an empty log directory."""
            if kind == "Kafka":
                return KafkaPeer(
                    "3.9",
                    mode="zk",
                    zookeeper=zk.connect,
                    broker_id=broker_id,
                    base=root / f"kafka-{broker_id}",
                    overrides={**CLUSTER, "inter.broker.protocol.version": "3.9"},
                ).start()
            return BrokerProcess(
                root / f"kbroker-{broker_id}",
                overrides={**CLUSTER, "zookeeper.connect": zk.connect, "broker.id": str(broker_id)},
            ).start(timeout=60)

        try:
            try:
                fetch("3.9")  # the jars before any broker starts, whichever kind comes first
                for broker_id in BROKER_IDS:
                    old[broker_id] = broker(old_kind, broker_id)
            except ArtifactUnavailable as e:
                print(f"Kafka 3.9 is unavailable here: {e}", file=sys.stderr)
                return 2
            log(f"{old_kind} {list(BROKER_IDS)} up")
            first = old[1].bootstrap
            _wait("three brokers registered", lambda: _registered(first) == 3, 60)
            with WireClient(first) as c:
                controller = c.metadata([]).controller_id
            with WireClient(old[controller].bootstrap) as c:
                for name in (TOPIC, TXN_TOPIC):
                    c.create_topic(name, partitions=PARTITIONS, replication_factor=3)
            log(f"topics {TOPIC}, {TXN_TOPIC} created (RF 3) through controller {controller}")
            bootstrap = ",".join(b.bootstrap for b in old.values())
            threads = [
                _guard(_producer, bootstrap, load, "producer"),
                _guard(_consumer, bootstrap, load, "consumer"),
                _guard(_transactions, bootstrap, load, "transactions"),
            ]
            time.sleep(seconds_between)
            progress = [_snapshot(load)]
            log(f"load running: {_describe(progress[-1])}")
            ok = True
            for broker_id in BROKER_IDS:
                old[broker_id].stop()
                log(f"{old_kind} {broker_id} stopped (controlled shutdown)")
                try:
                    new[broker_id] = broker(new_kind, broker_id)
                except ArtifactUnavailable as e:
                    print(f"Kafka 3.9 is unavailable here: {e}", file=sys.stderr)
                    return 2
                address = new[broker_id].bootstrap
                log(f"{new_kind} {broker_id} started on {address}")
                if _wait(
                    f"{new_kind} {broker_id} in every ISR",
                    lambda a=address, b=broker_id: _isr_complete(a, b),
                    300,
                ):
                    log(f"{new_kind} {broker_id} is in the ISR of every partition")
                else:
                    ok = False
                    break
                time.sleep(seconds_between)
                progress.append(_snapshot(load))
                log(f"leaders {_leaders(address)}; load {_describe(progress[-1])}")
            time.sleep(seconds_between)
            progress.append(_snapshot(load))
            load.stop.set()
            for t in threads:
                t.join(180)
            final = new[BROKER_IDS[-1]].bootstrap if ok else bootstrap
            kbrokers = old if reverse else new
            return _verdict(ok and len(new) == len(BROKER_IDS), load, progress, final, kbrokers)
        finally:
            load.stop.set()
            for b in [*new.values(), *old.values()]:
                b.stop()
            zk.stop()


def _registered(bootstrap: str) -> int:
    try:
        with WireClient(bootstrap, timeout=5) as c:
            return len(c.metadata([]).brokers)
    except Exception:  # noqa: BLE001 - still starting
        return 0


def _snapshot(load: Load) -> tuple[int, int, int, int]:
    with load.lock:
        return len(load.acked), load.consumed, load.commits, len(load.txn_committed)


def _describe(s: tuple[int, int, int, int]) -> str:
    return (
        f"{s[0]} records acknowledged, {s[1]} consumed, {s[2]} group commits, {s[3]} transactions committed"
    )


def _verdict(
    ok: bool,
    load: Load,
    progress: list[tuple[int, int, int, int]],
    bootstrap: str,
    kbrokers: dict[int, BrokerProcess],
) -> int:
    records = set(_read_all(bootstrap, TOPIC))
    lost = load.acked - records
    txn_values = _read_all(bootstrap, TXN_TOPIC)
    committed = {f"t{n}-{j}" for n in load.txn_committed for j in range(TXN_RECORDS)}
    aborted = {f"t{n}-{j}" for n in load.txn_aborted for j in range(TXN_RECORDS)}
    txn_lost = committed - set(txn_values)
    aborted_seen = aborted & set(txn_values)
    log(f"acknowledged {len(load.acked)}, read back {len(records)}, lost {len(lost)} {sorted(lost)[:10]}")
    log(
        f"transactions committed {len(load.txn_committed)}, aborted {len(load.txn_aborted)}; committed records "
        f"missing {len(txn_lost)}, aborted records visible {len(aborted_seen)}"
    )
    last = progress[-1]
    before_last = progress[-2] if len(progress) > 1 else (0, 0, 0, 0)
    went_on = all(last[i] > before_last[i] for i in range(4))
    log(
        f"after the last replacement: {_describe(tuple(a - b for a, b in zip(last, before_last, strict=True)))}"
    )
    for name, errors in (
        ("produce errors", load.produce_errors),
        ("commit errors", load.commit_errors),
        ("transaction errors", load.txn_errors),
    ):
        if errors:
            log(f"{name} ({len(errors)}): {sorted(set(errors))[:8]}")
    passed = ok and not lost and not txn_lost and not aborted_seen and went_on
    if not passed:
        for broker_id, b in kbrokers.items():
            print(f"--- kbroker {broker_id} log tail:\n{b.read_log()[-3000:]}")
    log("PASS" if passed else "FAIL")
    return 0 if passed else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.differential.rolling", description=__doc__)
    parser.add_argument("--seconds-between", type=float, default=15.0, help="load time between replacements")
    parser.add_argument(
        "--reverse", action="store_true", help="three kbrokers become three Kafka 3.9 brokers instead"
    )
    args = parser.parse_args(argv)
    return run(args.seconds_between, args.reverse)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

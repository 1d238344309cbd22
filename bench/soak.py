"""Soak test, run by hand: `python -m bench.soak --minutes N` (bounded: N minutes of load, then checks).

For N minutes, all at once against one kbroker process on loopback:
- idempotent producers with sequence-numbered payloads: confluent-kafka (two, on soak-ck) and
  kafka-python (one, on soak-kp), acks=all, every acknowledgement recorded as (partition, offset, seq);
- consumers in groups committing offsets: confluent-kafka (group soak-ck-group on soak-ck) and
  aiokafka (group soak-aio-group on soak-kp);
- topic churn: create a topic, produce a few records to it, delete it, on separate soak-churn-* topics;
- broker kill -9 and restart every 30-60 s (log.flush.interval.messages=1, so acknowledged = durable).

Then, with the broker up, every soak topic is read from the beginning and checked: every acknowledged
message is there at its acknowledged offset (else a loss), no sequence number of an idempotent producer
appears twice (else a duplicate), offsets are contiguous per partition, and each producer's sequence
numbers are in order per partition. Client errors are collected and classified as retriable (expected
while the broker is down) or not. Prints one summary line; exits 1 on a loss, duplicate, gap, disorder
or non-retriable error.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.broker_process import BrokerProcess

PARTITIONS = 3
CK_TOPIC = "soak-ck"
KP_TOPIC = "soak-kp"
RETRIABLE_NAMES = (
    "_TRANSPORT", "_ALL_BROKERS_DOWN", "_RESOLVE", "_TIMED_OUT", "_MSG_TIMED_OUT", "NOT_COORDINATOR",
    "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS", "REBALANCE_IN_PROGRESS", "NOT_LEADER",
    "LEADER_NOT_AVAILABLE", "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION", "UNKNOWN_TOPIC_OR_PART",
    "KafkaConnectionError", "NodeNotReadyError", "KafkaTimeoutError", "RequestTimedOutError",
    "NoBrokersAvailable", "ConnectionError", "ConnectionRefused", "ConnectionReset", "BrokenPipe",
    "CommitFailedError", "IllegalGeneration", "ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID", "UnknownMemberId",
    "_DESTROY", "_NO_OFFSET", "TOPIC_ALREADY_EXISTS", "_PARTITION_EOF", "Timed out", "timed out",
    "TimeoutError", "CancelledError", "StaleMetadata", "NotCoordinator", "CoordinatorNotAvailable",
    "RebalanceInProgress", "UnknownTopicOrPartition", "TopicAlreadyExists", "GroupLoadInProgress", "Disconnected",
    "Connection refused",
)


@dataclass
class Stats:
    acked: dict[str, list[tuple[int, int, int]]] = field(default_factory=lambda: defaultdict(list))
    sent: Counter[str] = field(default_factory=Counter)
    failed_deliveries: Counter[str] = field(default_factory=Counter)
    consumed: Counter[str] = field(default_factory=Counter)
    commits: Counter[str] = field(default_factory=Counter)
    churn_cycles: int = 0
    restarts: int = 0
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)  # (retriable|fatal, description)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def error(self, who: str, err: Any, retriable: bool | None = None) -> None:
        text = f"{who}: {type(err).__name__} {str(err)[:120]}"
        if retriable is None:
            retriable = any(n in text for n in RETRIABLE_NAMES)
        with self.lock:
            self.errors[("retriable" if retriable else "fatal", text)] += 1


def _value(producer: str, seq: int) -> bytes:
    return f"{producer}:{seq:09d}:".encode() + b"x" * 80


def _parse(value: bytes) -> tuple[str, int]:
    producer, seq, _ = value.split(b":", 2)
    return producer.decode(), int(seq)


# ---------------------------------------------------------------- producers


def ck_producer(name: str, bootstrap: str, stop: threading.Event, stats: Stats, rate: float) -> None:
    from confluent_kafka import KafkaError, Producer

    def on_error(err: Any) -> None:
        stats.error(name, err, retriable=not err.fatal())

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                  "message.timeout.ms": 120000, "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500,
                  "error_cb": on_error})

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            stats.error(name + " delivery", err, retriable=err.code() != KafkaError._FATAL and not err.fatal())
            with stats.lock:
                stats.failed_deliveries[name] += 1
            return
        _, seq = _parse(msg.value())
        with stats.lock:
            stats.acked[name].append((msg.partition(), msg.offset(), seq))

    seq = 0
    t0 = time.monotonic()
    while not stop.is_set():
        try:
            p.produce(CK_TOPIC, key=str(seq % 97).encode(), value=_value(name, seq), on_delivery=on_delivery)
            seq += 1
            with stats.lock:
                stats.sent[name] += 1
        except BufferError:
            p.poll(0.05)
            continue
        p.poll(0)
        lag = seq / rate - (time.monotonic() - t0)
        if lag > 0:
            time.sleep(lag)
    left = p.flush(150)
    if left:
        stats.error(name, RuntimeError(f"{left} messages undelivered at the end"), retriable=False)


def kp_producer(name: str, bootstrap: str, stop: threading.Event, stats: Stats, rate: float) -> None:
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", linger_ms=5,
                      max_in_flight_requests_per_connection=5, reconnect_backoff_ms=50,
                      reconnect_backoff_max_ms=500, retry_backoff_ms=50, request_timeout_ms=10000,
                      delivery_timeout_ms=120000)

    def ok(md: Any, seq: int) -> None:
        with stats.lock:
            stats.acked[name].append((md.partition, md.offset, seq))

    def failed(exc: BaseException) -> None:
        stats.error(name + " delivery", exc, retriable=bool(getattr(exc, "retriable", False)))
        with stats.lock:
            stats.failed_deliveries[name] += 1

    seq = 0
    t0 = time.monotonic()
    try:
        while not stop.is_set():
            try:
                fut = p.send(KP_TOPIC, key=str(seq % 97).encode(), value=_value(name, seq))
            except Exception as e:  # noqa: BLE001 - buffer full / metadata timeout while the broker is down
                stats.error(name, e)
                time.sleep(0.2)
                continue
            s = seq
            fut.add_callback(lambda md, s=s: ok(md, s))
            fut.add_errback(failed)
            seq += 1
            with stats.lock:
                stats.sent[name] += 1
            lag = seq / rate - (time.monotonic() - t0)
            if lag > 0:
                time.sleep(lag)
        p.flush(150)
    finally:
        p.close(timeout=10)


# ---------------------------------------------------------------- consumers


def ck_consumer(bootstrap: str, stop: threading.Event, stats: Stats) -> None:
    from confluent_kafka import Consumer, KafkaError

    def on_error(err: Any) -> None:
        stats.error("ck-consumer", err, retriable=not err.fatal())

    def on_commit(err: Any, _parts: Any) -> None:
        if err is not None:
            stats.error("ck-consumer commit", err)
        else:
            with stats.lock:
                stats.commits["ck-consumer"] += 1

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "soak-ck-group", "auto.offset.reset": "earliest",
                  "enable.auto.commit": True, "auto.commit.interval.ms": 1000, "error_cb": on_error,
                  "on_commit": on_commit, "session.timeout.ms": 10000, "heartbeat.interval.ms": 1000,
                  "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500})
    c.subscribe([CK_TOPIC])
    try:
        while not stop.is_set():
            for m in c.consume(500, 0.5):
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        stats.error("ck-consumer", err, retriable=err.retriable() or not err.fatal())
                    continue
                with stats.lock:
                    stats.consumed["ck-consumer"] += 1
    finally:
        c.close()


def aio_consumer(bootstrap: str, stop: threading.Event, stats: Stats) -> None:
    from aiokafka import AIOKafkaConsumer

    async def run() -> None:
        while not stop.is_set():
            c = AIOKafkaConsumer(KP_TOPIC, bootstrap_servers=bootstrap, group_id="soak-aio-group",
                                 auto_offset_reset="earliest", enable_auto_commit=False,
                                 session_timeout_ms=10000, heartbeat_interval_ms=1000, request_timeout_ms=15000,
                                 retry_backoff_ms=100)
            try:
                await c.start()
                while not stop.is_set():
                    batches = await c.getmany(timeout_ms=500, max_records=500)
                    n = sum(len(v) for v in batches.values())
                    if n:
                        with stats.lock:
                            stats.consumed["aio-consumer"] += n
                        try:
                            await c.commit()
                            with stats.lock:
                                stats.commits["aio-consumer"] += 1
                        except Exception as e:  # noqa: BLE001 - commit failures during restarts/rebalances
                            stats.error("aio-consumer commit", e)
            except Exception as e:  # noqa: BLE001 - reconnect with a fresh consumer
                stats.error("aio-consumer", e)
                await asyncio.sleep(0.5)
            finally:
                try:
                    await c.stop()
                except Exception as e:  # noqa: BLE001
                    stats.error("aio-consumer stop", e)

    asyncio.run(run())


# ---------------------------------------------------------------- churn and chaos


def churn(bootstrap: str, stop: threading.Event, stats: Stats) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    i = 0
    while not stop.is_set():
        name = f"soak-churn-{i}"
        i += 1
        try:
            admin.create_topics([NewTopic(name, 2, 1)])[name].result(15)
            p = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 10000})
            for k in range(20):
                p.produce(name, value=b"churn-%d" % k)
            p.flush(15)
            admin.delete_topics([name])[name].result(15)
            with stats.lock:
                stats.churn_cycles += 1
        except Exception as e:  # noqa: BLE001
            stats.error("churn", e)
        stop.wait(1.0)


def chaos(broker: BrokerProcess, stop: threading.Event, stats: Stats, lo: float, hi: float,
          rng: random.Random) -> None:
    while not stop.wait(rng.uniform(lo, hi)):
        broker.kill()
        time.sleep(0.3)
        for attempt in range(5):
            try:
                broker.start(timeout=60)
                break
            except RuntimeError as e:
                stats.error("broker restart", e, retriable=attempt < 4)
                time.sleep(1)
        with stats.lock:
            stats.restarts += 1


# ---------------------------------------------------------------- verification


def read_all(bootstrap: str, topic: str) -> dict[int, list[tuple[int, bytes]]]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "soak-verify", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}
    try:
        highs = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(PARTITIONS)}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        done = {p for p, h in highs.items() if h == 0}
        deadline = time.monotonic() + 300
        while len(done) < PARTITIONS and time.monotonic() < deadline:
            for m in c.consume(5000, 1.0):
                p, off, value = m.partition(), m.offset(), m.value()
                if m.error() or p is None or off is None or value is None:
                    continue
                out[p].append((off, value))
                if off + 1 >= highs[p]:
                    done.add(p)
    finally:
        c.close()
    return out


@dataclass
class Verdict:
    acknowledged: int = 0
    losses: int = 0
    duplicates: int = 0
    gaps: int = 0
    disorder: int = 0
    details: list[str] = field(default_factory=list)


def verify(bootstrap: str, stats: Stats) -> Verdict:
    v = Verdict()
    for topic in (CK_TOPIC, KP_TOPIC):
        parts = read_all(bootstrap, topic)
        at: dict[tuple[int, int], tuple[str, int]] = {}
        seen: Counter[tuple[str, int]] = Counter()
        for p, recs in parts.items():
            last_seq: dict[str, int] = {}
            prev = None
            for off, value in recs:
                if prev is not None and off != prev + 1:
                    v.gaps += 1
                    v.details.append(f"gap in {topic}-{p}: {prev} -> {off}")
                prev = off
                who, seq = _parse(value)
                at[(p, off)] = (who, seq)
                seen[(who, seq)] += 1
                if seq <= last_seq.get(who, -1):
                    v.disorder += 1
                    v.details.append(f"{topic}-{p} offset {off}: {who} seq {seq} after {last_seq[who]}")
                last_seq[who] = seq
        for (who, seq), n in seen.items():
            if n > 1:
                v.duplicates += n - 1
                v.details.append(f"{topic}: {who} seq {seq} appears {n} times")
        for who, acks in stats.acked.items():
            if (topic == CK_TOPIC) != who.startswith("ck"):
                continue
            for p, off, seq in acks:
                v.acknowledged += 1
                if at.get((p, off)) != (who, seq):
                    v.losses += 1
                    if len(v.details) < 50:
                        v.details.append(f"lost: {who} seq {seq} acknowledged at {topic}-{p}@{off}, "
                                         f"log has {at.get((p, off))}")
    return v


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--rate", type=float, default=300.0, help="messages/s per producer")
    ap.add_argument("--restart-min", type=float, default=30.0)
    ap.add_argument("--restart-max", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data-dir", type=Path, default=None, help="kept afterwards (default: a temp dir)")
    args = ap.parse_args(argv)

    from confluent_kafka.admin import AdminClient, NewTopic

    tmp = None if args.data_dir else tempfile.TemporaryDirectory(prefix="kbroker-soak-")
    data_dir = args.data_dir or Path(tmp.name)  # type: ignore[union-attr]
    broker = BrokerProcess(data_dir, {"log.flush.interval.messages": "1", "num.partitions": str(PARTITIONS)})
    broker.start()
    stats = Stats()
    stop = threading.Event()
    chaos_stop = threading.Event()
    t_start = time.monotonic()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for f in admin.create_topics([NewTopic(CK_TOPIC, PARTITIONS, 1), NewTopic(KP_TOPIC, PARTITIONS, 1)]).values():
            f.result(30)
        bs = broker.bootstrap
        threads = [
            threading.Thread(target=ck_producer, args=("ck1", bs, stop, stats, args.rate), name="ck1"),
            threading.Thread(target=ck_producer, args=("ck2", bs, stop, stats, args.rate), name="ck2"),
            threading.Thread(target=kp_producer, args=("kp1", bs, stop, stats, args.rate), name="kp1"),
            threading.Thread(target=ck_consumer, args=(bs, stop, stats), name="ck-consumer"),
            threading.Thread(target=aio_consumer, args=(bs, stop, stats), name="aio-consumer"),
            threading.Thread(target=churn, args=(bs, stop, stats), name="churn"),
        ]
        chaos_thread = threading.Thread(target=chaos, name="chaos", args=(
            broker, chaos_stop, stats, args.restart_min, args.restart_max, random.Random(args.seed)))
        for t in threads:
            t.daemon = True
            t.start()
        chaos_thread.start()
        end = t_start + args.minutes * 60
        while time.monotonic() < end:
            time.sleep(min(10.0, max(0.0, end - time.monotonic())))
            with stats.lock:
                acked = sum(len(a) for a in stats.acked.values())
                print(f"  {(time.monotonic() - t_start) / 60:5.1f} min: acknowledged {acked}, "
                      f"restarts {stats.restarts}, churn {stats.churn_cycles}, consumed {dict(stats.consumed)}",
                      flush=True)
        chaos_stop.set()
        chaos_thread.join()
        if not broker.alive():
            broker.start(timeout=60)
        stop.set()
        for t in threads:
            t.join(200)
            if t.is_alive():
                stats.error(t.name, RuntimeError("did not stop within 200 s"), retriable=False)
        minutes = (time.monotonic() - t_start) / 60
        verdict = verify(broker.bootstrap, stats)
    finally:
        stop.set()
        chaos_stop.set()
        broker.kill()
        if tmp is not None:
            tmp.cleanup()

    retriable = sum(n for (kind, _), n in stats.errors.items() if kind == "retriable")
    fatal = sum(n for (kind, _), n in stats.errors.items() if kind == "fatal")
    for (kind, text), n in sorted(stats.errors.items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {kind:9s} x{n:<6d} {text}")
    for d in verdict.details[:30]:
        print("  " + d)
    print(f"soak: minutes={minutes:.1f} acknowledged={verdict.acknowledged} sent={sum(stats.sent.values())} "
          f"failed_deliveries={sum(stats.failed_deliveries.values())} restarts={stats.restarts} "
          f"losses={verdict.losses} duplicates={verdict.duplicates} gaps={verdict.gaps} "
          f"out_of_order={verdict.disorder} consumed={sum(stats.consumed.values())} "
          f"commits={sum(stats.commits.values())} churn_cycles={stats.churn_cycles} "
          f"retriable_errors={retriable} other_errors={fatal}")
    bad = verdict.losses or verdict.duplicates or verdict.gaps or verdict.disorder or fatal
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""At-least-once delivery through a share group under churn: N records on 2 partitions to 5 confluent-kafka
ShareConsumers with explicit acknowledgement, a seeded share of the records released (on their first delivery) or
rejected, and one consumer killed with kill -9 while it holds records it never acknowledged.

Checked: every record is accepted or rejected, each confirmed by the broker (commit_sync's per-partition result),
at least once; no record whose acceptance was confirmed is accepted again; every rejected record stays rejected;
every released record comes back (a later delivery with a higher delivery count) and is accepted; the records the
killed consumer held come back to the others; and at the end both share-partitions' start offsets
(DescribeShareGroupOffsets) are at the log end: nothing left available or acquired.

`python -m tests.broker.share.soak --records 100000 --seed 1` is the long run (about a minute);
tests/broker/share/test_share_soak.py runs a small seeded pass."""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.share_groups import assigned_members, set_group_config, start_offsets
from tests.broker_process import BrokerProcess

CONSUMERS, PARTITIONS = 5, 2
RELEASE_SHARE, REJECT_SHARE = 0.10, 0.02
BROKER_CONFIG = {
    "group.share.heartbeat.interval.ms": "500",
    "group.share.min.heartbeat.interval.ms": "100",
    "share.coordinator.state.topic.num.partitions": "2",
    "share.coordinator.state.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "2",
}

# One consumer process. Per batch: "D p offset delivery value" for each record received (flushed before anything
# is acknowledged), then, once commit_sync answered, "A"/"R"/"L" (accept/reject/release confirmed) or "F ... kind
# error" (refused: the record comes back) with the same fields. The victim (hold > 0) prints its hold-th batch and
# "HELD", then waits to be killed without acknowledging anything.
CONSUMER = r"""
import os, sys, time
from confluent_kafka import AcknowledgeType, KafkaException, ShareConsumer
bootstrap, group, topic, stop, hold, pause = sys.argv[1:7]
pause, hold, batches = float(pause), int(hold), 0
KIND = {"A": AcknowledgeType.ACCEPT, "R": AcknowledgeType.REJECT, "L": AcknowledgeType.RELEASE}
c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "share.acknowledgement.mode": "explicit",
                   "max.poll.records": 100, "log_level": 3})
c.subscribe([topic])
out = sys.stdout
while not os.path.exists(stop):
    msgs = [m for m in c.poll(0.2) if m.error() is None]
    if not msgs:
        continue
    batch = []
    for m in msgs:
        v, d = m.value().decode(), m.delivery_count()
        kind = "R" if v.endswith("-reject") else "L" if v.endswith("-release") and d == 1 else "A"
        batch.append((m, kind, f"{m.partition()} {m.offset()} {d} {v}"))
    out.write("".join(f"D {f}\n" for _, _, f in batch))
    out.flush()
    batches += 1
    if batches == hold:
        out.write("HELD\n")
        out.flush()
        time.sleep(3600)
    time.sleep(pause)  # the work
    for m, kind, _ in batch:
        c.acknowledge(m, KIND[kind])
    try:
        res = c.commit_sync(30)
        failed = {tp.partition: str(e).replace(" ", "_") for tp, e in res.items() if e is not None}
    except KafkaException as e:
        failed = {p: str(e).replace(" ", "_") for p in range(64)}
    out.write("".join(f"{kind} {f}\n" if m.partition() not in failed else f"F {f} {kind} {failed[m.partition()]}\n"
                      for m, kind, f in batch))
    out.flush()
c.close()
print("DONE", flush=True)
"""


class Consumer:
    """One consumer process; its lines are parsed as they come."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CONSUMER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[list[str]] = []
        self.held = threading.Event()
        self.err = ""
        self._threads = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._read_err, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("HELD"):
                self.held.set()
            self.lines.append(line.split())

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        self.err = self.proc.stderr.read()

    def wait(self, timeout: float) -> int:
        rc = self.proc.wait(timeout)
        for t in self._threads:
            t.join(10)
        return rc


@dataclass
class Ledger:
    """What the consumers printed, folded as it arrives."""

    accepted: dict[str, list[int]] = field(
        default_factory=dict
    )  # value -> delivery counts of confirmed accepts
    rejected: dict[str, list[int]] = field(default_factory=dict)
    released: dict[str, list[int]] = field(default_factory=dict)
    refused: list[list[str]] = field(default_factory=list)
    delivered: int = 0

    def fold(self, w: list[str]) -> None:
        kind = w[0]
        if kind == "D":
            self.delivered += 1
        elif kind in ("A", "R", "L"):
            book = {"A": self.accepted, "R": self.rejected, "L": self.released}[kind]
            book.setdefault(w[4], []).append(int(w[3]))
        elif kind == "F":
            self.refused.append(w)

    def settled(self) -> int:
        return len(self.accepted) + len(self.rejected)


def value(i: int, release: set[int], reject: set[int]) -> str:
    return f"v{i}" + ("-release" if i in release else "-reject" if i in reject else "")


def run_soak(base: Path, records: int, seed: int, timeout: float | None = None) -> dict[str, float]:
    """The scenario on a fresh broker under `base`; raises AssertionError naming what went wrong, else returns the
    counts for a report."""
    rng = random.Random(seed)
    marked = rng.sample(range(records), int(records * (RELEASE_SHARE + REJECT_SHARE)))
    release = set(marked[: int(records * RELEASE_SHARE)])
    reject = set(marked[int(records * RELEASE_SHARE) :])
    values = [value(i, release, reject) for i in range(records)]
    victim = rng.randrange(CONSUMERS)
    # the victim's share of the batches (max.poll.records 100) is about records / CONSUMERS / 100: it holds one
    # between a quarter and a half of the way through its own
    hold = max(1, int(records / CONSUMERS / 100 * rng.uniform(0.25, 0.5)))
    timeout = timeout or max(90.0, records / 500)
    broker = BrokerProcess(base / "broker", BROKER_CONFIG).start()
    topic, group = "soak", "soak-group"
    procs: list[Consumer] = []
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
        set_group_config(broker.bootstrap, group, {"share.auto.offset.reset": "earliest"})
        stop = base / "stop"
        for i in range(CONSUMERS):
            args = [broker.bootstrap, group, topic, str(stop), str(hold) if i == victim else "0", "0.005"]
            procs.append(Consumer(args))
        deadline = time.monotonic() + 60
        while assigned_members(broker.bootstrap, group) < CONSUMERS:
            assert time.monotonic() < deadline, f"5 members not assigned in 60 s: {[c.err for c in procs]}"
            time.sleep(0.2)
        started = time.monotonic()
        # batches of at most 100 records: a ShareFetch acquires whole batches (Kafka's batch_optimized mode, all
        # librdkafka asks for), so the batch size, not max.poll.records alone, sets what one poll holds
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "batch.num.messages": 100})
        for i, v in enumerate(values):
            while True:
                try:
                    p.produce(topic, v.encode(), partition=i % PARTITIONS)
                    break
                except BufferError:
                    p.poll(0.01)
        assert p.flush(60) == 0
        ends = {q: records // PARTITIONS + (1 if q < records % PARTITIONS else 0) for q in range(PARTITIONS)}
        ledger = Ledger()
        read = [0] * CONSUMERS
        killed = False
        end = started + timeout
        while True:
            for i, c in enumerate(procs):
                lines = c.lines
                while read[i] < len(lines):
                    ledger.fold(lines[read[i]])
                    read[i] += 1
            now = time.monotonic()
            # kill -9 once it holds its batch (or, if the others drained everything first, at the end)
            if not killed and (procs[victim].held.is_set() or ledger.settled() >= records):
                procs[victim].proc.kill()
                killed = True
            if killed and ledger.settled() >= records:
                offsets = start_offsets(broker.bootstrap, group, topic)
                if all(offsets.get(q, -1) >= e for q, e in ends.items()):
                    break
            assert now < end, f"not done in {timeout:.0f} s: {ledger.settled()} of {records} settled"
            time.sleep(0.05)
        seconds = time.monotonic() - started
        stop.touch()
        rcs = [c.wait(60) for c in procs]
        for i, (rc, c) in enumerate(zip(rcs, procs, strict=True)):
            if i != victim:
                assert rc == 0 and ["DONE"] in c.lines, f"consumer {i}: rc {rc}\n{c.err[-3000:]}"
        for i, c in enumerate(procs):  # lines printed after the last fold
            for w in c.lines[read[i] :]:
                ledger.fold(w)
        return check(values, procs[victim], ledger, seconds)
    finally:
        for c in procs:
            if c.proc.poll() is None:
                c.proc.kill()
                c.proc.wait()
        broker.stop()


def check(values: list[str], victim: Consumer, ledger: Ledger, seconds: float) -> dict[str, float]:
    want_rejected = {v for v in values if v.endswith("-reject")}
    want_accepted = set(values) - want_rejected
    missing = sorted(want_accepted - set(ledger.accepted))[:20]
    assert not missing, f"never accepted: {missing}"
    assert set(ledger.rejected) == want_rejected, sorted(set(ledger.rejected) ^ want_rejected)[:20]
    assert not set(ledger.accepted) & want_rejected
    twice = [v for v, ds in ledger.accepted.items() if len(ds) > 1][:20]
    assert not twice, f"acceptance confirmed twice: {twice}"
    twice = [v for v, ds in ledger.rejected.items() if len(ds) > 1][:20]
    assert not twice, f"rejection confirmed twice: {twice}"
    # released on the first delivery: back with a higher delivery count, then accepted
    released = [v for v in values if v.endswith("-release")]
    not_back = [v for v in released if ledger.accepted[v][0] < 2][:20]
    assert not not_back, f"released records accepted on their first delivery: {not_back}"
    # the victim's last batch, held when it was killed: back at the others with a higher delivery count
    held_at = max(i for i, w in enumerate(victim.lines) if w == ["HELD"]) if ["HELD"] in victim.lines else -1
    held = []
    if held_at >= 0:
        start = held_at
        while start > 0 and victim.lines[start - 1][0] == "D":
            start -= 1
        held = victim.lines[start:held_at]
    for w in held:
        v, d = w[4], int(w[3])
        book = ledger.rejected if v in want_rejected else ledger.accepted
        assert book[v][0] > d, f"held by the killed consumer at delivery {d}, settled at {book[v]}: {w}"
    for w in ledger.refused:  # a refused acknowledgement: the record came back and was settled later
        v, d = w[4], int(w[3])
        book = ledger.rejected if v in want_rejected else ledger.accepted
        assert max(book[v]) > d, (w, book[v])
    return {
        "records": len(values),
        "accepted": len(ledger.accepted),
        "rejected": len(ledger.rejected),
        "released": sum(len(ds) for ds in ledger.released.values()),
        "held_by_killed": len(held),
        "refused": len(ledger.refused),
        "deliveries": ledger.delivered,
        "seconds": seconds,
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    if args.records < 100:
        print("error: --records must be at least 100", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as d:
        try:
            r = run_soak(Path(d), args.records, args.seed)
        except AssertionError as e:
            print(f"FAILED: {str(e)[:4000]}", file=sys.stderr)
            return 1
    print(
        f"{r['records']:,} records to {CONSUMERS} share consumers on {PARTITIONS} partitions in {r['seconds']:.1f} s "
        f"({r['records'] / r['seconds']:,.0f} records/s): {r['accepted']:,} accepted and {r['rejected']:,} rejected, "
        f"each confirmed once; {r['released']:,} releases confirmed, every released record back and accepted; "
        f"{r['held_by_killed']} records held by the consumer killed with kill -9, all redelivered; "
        f"{r['refused']} acknowledgements refused and redelivered; {r['deliveries']:,} deliveries in all "
        f"(seed {args.seed})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

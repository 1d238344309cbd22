"""Workload rebalance: a 10-member group consuming 20 partitions under steady produce loses one member (close);
how long do the others stop consuming, and when does every partition flow again?

Three protocols, each with the clients' and broker's default timings: classic eager (range assignor), classic
cooperative-sticky, and KIP-848 (`group.protocol=consumer`, the broker's uniform assignor). Each member is a
confluent-kafka consumer in a child process that stamps every record it receives (wall clock, shared by the
processes). The parent produces 2,000 msg/s round-robin over the 20 partitions, waits until the group is stable
(every member assigned, all 20 partitions, no change for 1.5 s plus a random 0-5 s so that the leave falls at any
phase of the heartbeat intervals), lets one member close, watches until the stayers hold every partition again,
and reads the stamps back:

- "leave -> all consuming again": the later of (a) the first record of each of the leaver's partitions at its new
  owner and (b) the end of each stayer's pause (one longer than the noise: twice the steady-state floor, at least
  200 ms), measured from the leave;
- "longest gap seen by a stayer": the largest pause between two records received by a member that stayed, among
  those that end between the leave and half a second after (a) (eager revokes every partition, so its members
  stop; cooperative and KIP-848 members keep theirs).

The steady-state maximum pause before the leave is given in the note as the noise floor. No mock column:
librdkafka's mock cluster does not speak KIP-848 (ConsumerGroupHeartbeat). The Apache Kafka peers of --peers run
the same three protocols after kbroker, one broker at a time (the same leave phases), with their own defaults:
Kafka 4.x serves KIP-848 (its `consumer` group protocol is on by default since 4.0); Kafka 3.9 in ZooKeeper mode
has no KIP-848 (the consumer protocol needs KRaft's new group coordinator; it lists ConsumerGroupHeartbeat in
ApiVersions all the same, and KIP-848 members then wait unassigned), so it runs the classic rows only and the KIP-848
rows say so. Another peer that does not advertise ConsumerGroupHeartbeat is left out of the KIP-848 rows the same
way.
Default timings matter: a classic stayer learns of the rebalance at its next heartbeat (heartbeat.interval.ms 3 s),
a KIP-848 member of its new partitions at its next ConsumerGroupHeartbeat (group.consumer.heartbeat.interval.ms 5 s).
Three repetitions take about two minutes per broker; --quick (or --reps 1) one.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.harness import Ctx, KBroker, Row, Target, reap, spawn, start_peer, workdir

MEMBERS, PARTITIONS, RATE = 10, 20, 2000
# Seconds without an assignment change before the leave; at most this long watched after it (two KIP-848
# heartbeat intervals of 5 s: a partition the target moves off a stayer needs one to be revoked and one to be
# handed over).
STEADY, SETTLE = 1.5, 12.0
PHASE = 5.0  # the longest heartbeat interval of the three (KIP-848's 5 s)
TOPIC = "rebalance"
KIP848 = "KIP-848 (group.protocol=consumer)"
CONSUMER_GROUP_HEARTBEAT = 68  # the KIP-848 API key
MODES: dict[str, dict[str, str]] = {
    "classic eager (range)": {"partition.assignment.strategy": "range"},
    "classic cooperative-sticky": {"partition.assignment.strategy": "cooperative-sticky"},
    KIP848: {"group.protocol": "consumer"},
}

MEMBER = r"""
import os, sys, time
from confluent_kafka import Consumer
bootstrap, group, topic, out, leave_file, stop_file = sys.argv[1:7]
conf = dict(kv.split("=", 1) for kv in sys.argv[7:])
c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "latest",
              "enable.auto.commit": False, "log_level": 3, **conf})
c.subscribe([topic])
stamps, size = [], -1
while not os.path.exists(stop_file) and not os.path.exists(leave_file):
    now_size = len(c.assignment())
    if now_size != size:
        size = now_size
        print(f"ASSIGNED {size}", flush=True)
    for m in c.consume(500, 0.05):
        if m.error() is None:
            stamps.append((time.time(), m.partition()))
left = time.time()
c.close()
with open(out, "w") as f:
    f.write(f"left {left if os.path.exists(leave_file) else 0}\n")
    f.writelines(f"{t:.6f} {p}\n" for t, p in stamps)
"""


class Member:
    def __init__(self, ctx: Ctx, d: Path, i: int, bootstrap: str, group: str, conf: dict[str, str]) -> None:
        self.out, self.leave_file, self.stop_file = d / f"m{i}.txt", d / f"m{i}.leave", d / "stop"
        args = [sys.executable, "-c", MEMBER, bootstrap, group, TOPIC, str(self.out), str(self.leave_file),
                str(self.stop_file), *(f"{k}={v}" for k, v in conf.items())]
        self.proc = spawn(args, stdout=subprocess.PIPE, text=True)
        self.assigned = 0
        self.changed_at = time.monotonic()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("ASSIGNED "):
                self.assigned = int(line.split()[1])
                self.changed_at = time.monotonic()

    def stamps(self) -> tuple[float, list[tuple[float, int]]]:
        lines = self.out.read_text().splitlines()
        left = float(lines[0].split()[1])
        return left, [(float(t), int(p)) for t, p in (x.split() for x in lines[1:])]


def _producer(bootstrap: str, stop: threading.Event) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 3})
    i, t0 = 0, time.monotonic()
    while not stop.is_set():
        due = int((time.monotonic() - t0) * RATE)
        while i < due:
            p.produce(TOPIC, b"x" * 100, partition=i % PARTITIONS)
            i += 1
        p.poll(0)
        time.sleep(0.002)
    p.flush(10)


def _largest_gap_between(times: list[float], start: float, end: float) -> float:
    inside = [t for t in times if start <= t <= end]
    return max((b - a for a, b in zip(inside, inside[1:], strict=False)), default=0.0)


def measure(ctx: Ctx, kb: Target, mode: str, conf: dict[str, str], rep: int,
            phase: random.Random) -> tuple[float, float, float]:
    """One leave: (longest stayer gap, leave -> every partition flowing, steady-state max gap), in ms."""
    d = workdir(ctx.base, f"rebalance-{len(ctx.extra.setdefault('rebalance_runs', []))}")
    ctx.extra["rebalance_runs"].append(d)
    group = f"g-{abs(hash((mode, rep, time.time())))}"
    stop = threading.Event()
    producer = threading.Thread(target=_producer, args=(kb.bootstrap, stop), daemon=True)
    producer.start()
    members = [Member(ctx, d, i, kb.bootstrap, group, conf) for i in range(MEMBERS)]
    try:
        # Stable: every member has partitions, all 20 are assigned, and no assignment changed for STEADY seconds
        # (that window is the noise floor measured before the leave).
        # The wait past STEADY is random: a stayer learns of the leave at its next heartbeat, and members that
        # joined together heartbeat in step, so a fixed wait would always measure the same phase of the interval.
        quiet = STEADY + phase.uniform(0, PHASE)
        deadline = time.monotonic() + 120
        while not (all(m.assigned for m in members) and sum(m.assigned for m in members) == PARTITIONS
                   and time.monotonic() - max(m.changed_at for m in members) > quiet):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{mode}: group not stable: {[m.assigned for m in members]}")
            time.sleep(0.1)
        leaver = members[-1]
        leaver.leave_file.touch()
        leaver.proc.wait(30)
        # Watched until the stayers hold every partition again and nothing changed for a second and a half (the
        # records of the moved partitions flowing by then), at most SETTLE seconds.
        stayers = members[:-1]
        end = time.monotonic() + SETTLE
        while time.monotonic() < end and not (sum(m.assigned for m in stayers) == PARTITIONS
                                              and time.monotonic() - max(m.changed_at for m in stayers) > 1.5):
            time.sleep(0.1)
        (d / "stop").touch()
        for m in members:
            m.proc.wait(30)
    finally:
        stop.set()
        producer.join(15)
        for m in members:
            reap(m.proc)
    left, leaver_stamps = leaver.stamps()
    stays = [[t for t, _ in m.stamps()[1]] for m in members[:-1]]
    steady = max(_largest_gap_between(ts, left - STEADY, left) for ts in stays)
    # The rebalance is over once the leaver's partitions are consumed by their new owners: the window that the
    # stayers' pauses are looked for in ends half a second later (noise of a busy machine afterwards is not it).
    moved = {p for t, p in leaver_stamps if t > left - STEADY}
    firsts = {p: min((t for m in members[:-1] for t, q in m.stamps()[1] if q == p and t > left), default=None)
              for p in moved}
    late = sorted(p for p, t in firsts.items() if t is None)
    if not moved or late:
        raise RuntimeError(f"{mode}: the leaver's partitions {late or moved} not consumed within {SETTLE:.0f} s")
    handover = max(t for t in firsts.values() if t is not None) - left
    window_end = left + handover + 0.5
    stayer_gap, resumed = 0.0, 0.0
    threshold = max(0.2, 2 * steady)  # a pause longer than the noise
    for ts in stays:
        gaps = [(b - a, b) for a, b in zip(ts, ts[1:], strict=False) if left < b <= window_end]
        length, end = max(gaps, default=(0.0, left))
        stayer_gap = max(stayer_gap, length)
        if length > threshold:
            resumed = max(resumed, end - left)
    ctx.log(f"    the leaver's partitions {sorted(moved)} consumed again {handover:.2f} s after the leave; stayers "
            f"resumed {resumed:.2f} s after it")
    return stayer_gap * 1000, max(handover, resumed) * 1000, steady * 1000


def _advertises(t: Target, api_key: int) -> bool:
    from kbroker_tools.wire import WireClient

    with WireClient(t.bootstrap, timeout=10.0, client_id="bench-rebalance") as c:
        return any(k.api_key == api_key for k in c.api_versions().api_keys)


def _run_broker(ctx: Ctx, t: Target, rows: dict[str, tuple[Row, Row]], steady: dict[str, dict[str, list[float]]],
                modes: list[str], failed: dict[str, str]) -> None:
    """Every repetition of `modes` on one started broker; after a failure on a peer, the reasons go to `failed` and
    nothing more is tried on it (kbroker's failures fail the workload, as before)."""
    phase = random.Random(848)  # every broker sees the same leave phases
    t.create_topics([TOPIC], partitions=PARTITIONS)
    for rep in range(ctx.reps):
        for mode in modes:
            if mode in failed or ctx.out_of_time(f"rebalance {t.name} {mode} rep {rep + 1}"):
                continue
            try:
                gap, flowing, floor = measure(ctx, t, mode, MODES[mode], rep, phase)
            except Exception as e:  # noqa: BLE001 - a peer's failure is its cells' note
                if t.name == "kbroker":
                    raise
                failed[mode] = f"{type(e).__name__}: {str(e)[:200]}"
                ctx.log(f"  rebalance {mode} rep {rep + 1} {t.name}: failed: {failed[mode]}")
                # A group the broker cannot host costs a two-minute wait per try: the other modes are not tried.
                for m in modes:
                    if t.name not in steady[m]:
                        failed.setdefault(m, f"not tried after the {mode} failure")
                continue
            rows[mode][0].add(t, gap)
            rows[mode][1].add(t, flowing)
            steady[mode].setdefault(t.name, []).append(floor)
            ctx.log(f"  rebalance {mode} rep {rep + 1} {t.name}: stayer gap {gap:.0f} ms, all consuming again "
                    f"{flowing:.0f} ms after the leave (steady-state max gap {floor:.0f} ms)")
    for a, b in rows.values():
        a.add_rss(t)
        b.add_rss(t)


def run(ctx: Ctx) -> list[Row]:
    rows: dict[str, tuple[Row, Row]] = {
        mode: (Row(f"rebalance, {MEMBERS} members / {PARTITIONS} partitions, one closes: {mode}, longest gap seen "
                   "by a stayer", "ms", higher_is_better=False),
               Row(f"same, {mode}: leave -> all consuming again (stayers resumed, the leaver's partitions at their "
                   "new owners)", "ms", higher_is_better=False))
        for mode in MODES
    }
    steady: dict[str, dict[str, list[float]]] = {mode: {} for mode in MODES}
    kb = KBroker(ctx.base, {"offsets.topic.num.partitions": "4"})
    try:
        kb.start()
        _run_broker(ctx, kb, rows, steady, list(MODES), {})
    finally:
        kb.stop()
    # Apache Kafka afterwards, one broker at a time: kbroker's figures are taken as before, with no JVM beside them.
    notes: dict[str, str] = {mode: "" for mode in MODES}
    for key in ctx.extra.get("peers", []):
        if ctx.out_of_time(f"rebalance {key}"):
            break
        t = start_peer(ctx, key, label=" (rebalance)")
        if t is None:
            continue
        failed: dict[str, str] = {}
        try:
            modes = list(MODES)
            # Kafka 3.x on ZooKeeper lists ConsumerGroupHeartbeat in ApiVersions but never assigns a KIP-848 member
            # (the consumer protocol needs KRaft's new group coordinator): the mode decides, not the API list.
            if getattr(getattr(t, "peer", None), "mode", None) == "zk":
                modes.remove(KIP848)
                notes[KIP848] += (f" {t.name}: no figures, ZooKeeper mode has no KIP-848 (the consumer protocol "
                                  "needs KRaft's new group coordinator);")
            elif not _advertises(t, CONSUMER_GROUP_HEARTBEAT):
                modes.remove(KIP848)
                notes[KIP848] += f" {t.name}: no figures, ConsumerGroupHeartbeat (KIP-848) not advertised;"
            _run_broker(ctx, t, rows, steady, modes, failed)
        except Exception as e:  # noqa: BLE001 - a peer that cannot host the group: noted, the others go on
            failed.setdefault("all", f"{type(e).__name__}: {str(e)[:200]}")
            ctx.log(f"  rebalance {t.name}: failed: {failed['all']}")
        finally:
            t.stop()
        for mode, why in ({"all": failed["all"]} if "all" in failed else failed).items():
            for m in MODES if mode == "all" else [mode]:
                notes[m] += f" {t.name}: no figures, {why};"
    out: list[Row] = []
    for mode, (a, b) in rows.items():
        floors = steady[mode]
        noise = ""
        if floors.get("kbroker"):
            noise = f"steady-state max gap before the leave {max(floors['kbroker']):.0f} ms"
            others = [f"{name} {max(xs):.0f} ms" for name, xs in floors.items() if name != "kbroker" and xs]
            noise += (f" ({', '.join(others)})" if others else "") + "; "
        a.note = noise + "no mock column (librdkafka's mock cluster does not speak KIP-848);" + notes[mode]
        out += [a, b]
    return out

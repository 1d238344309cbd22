"""Three members of a KIP-848 consumer group (group.protocol=consumer), each a process of its own, share a topic
of 6 partitions under a steady producer; one is killed with SIGKILL. Shared by the confluent-kafka test
(tests/consumer_member.py) and the Java one (tests/java/ConsumerGroupMember.java): the members print the same lines.

The broker must run with a short group.consumer.session.timeout.ms: the killed member sends no leave heartbeat,
so its partitions move only when its session expires and the coordinator fences it."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from tests.broker_process import BrokerProcess
from tests.clients import wait_until
from tests.coordinator.test_consumer_groups import create_topic
from tests.group_helpers import committed, describe, end_offsets

PARTITIONS = 6
RATE = 300  # records a second over all partitions: one every ~20 ms on each, so a 1 s gap is a real stall
# The survivors' longest silence on the partitions they already owned, from a second before the kill until they
# have taken over. Only an assignment change that stops them (a revocation, an eager rebalance) gets near it.
MAX_GAP = 1.5
# The slack after the session timeout: the next survivor heartbeat (300 ms here), its OffsetFetch and first fetch.
TAKEOVER_SLACK = 3.0


@dataclass
class Member:
    """A member process; a thread collects its lines as they come."""

    name: str
    proc: subprocess.Popen[str]
    stderr_path: Path
    records: list[tuple[float, int, int, str]] = field(default_factory=list)
    member_id: str | None = None
    errors: list[str] = field(default_factory=list)
    closed: bool = False

    @classmethod
    def start(cls, name: str, cmd: Sequence[str], workdir: Path, cwd: Path) -> Member:
        stderr_path = workdir / f"{name}.stderr"
        with open(stderr_path, "w") as err:
            proc = subprocess.Popen(list(cmd), cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                    text=True, bufsize=1)
        m = cls(name, proc, stderr_path)
        threading.Thread(target=m._read, daemon=True).start()
        return m

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, _, rest = line.rstrip("\n").partition(" ")
            if kind == "R":
                t, p, o, v = rest.split(" ", 3)
                self.records.append((float(t), int(p), int(o), v))
            elif kind == "M":
                self.member_id = rest
            elif kind == "E":
                self.errors.append(rest)
            elif kind == "CLOSED":
                self.closed = True

    def partitions_since(self, t: float) -> set[int]:
        return {r[1] for r in list(self.records) if r[0] >= t}

    def values(self) -> set[str]:
        return {r[3] for r in list(self.records)}

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def close(self, timeout: float = 30) -> int:
        """EOF on stdin: the member closes its consumer (committing its position) and exits."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout)

    def diagnostics(self) -> str:
        return f"--- {self.name} stderr:\n{self.stderr_path.read_text(errors='replace')[-3000:]}"


class SteadyProducer(threading.Thread):
    """Values "0", "1", ... round-robin over the partitions at RATE a second, until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.count = 0
        self.halt = threading.Event()
        self.flushed = threading.Event()

    def run(self) -> None:
        p = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        batch = 15
        while not self.halt.is_set():
            for _ in range(batch):
                p.produce(self.topic, str(self.count).encode(), partition=self.count % PARTITIONS)
                self.count += 1
            p.poll(0)
            time.sleep(batch / RATE)
        if p.flush(30) == 0:
            self.flushed.set()

    def stop(self) -> int:
        self.halt.set()
        self.join(40)
        assert self.flushed.is_set(), "the producer could not deliver every record"
        return self.count


def max_gap(records: list[tuple[float, int, int, str]], partitions: set[int], start: float, end: float) -> float:
    times = [start] + sorted(r[0] for r in records if r[1] in partitions and start <= r[0] <= end) + [end]
    return max(b - a for a, b in zip(times, times[1:], strict=False))


def kill_one_of_three(broker: BrokerProcess, topic: str, group: str, member_cmd: Sequence[str], workdir: Path,
                      cwd: Path, session_timeout_ms: int, join_timeout: float = 20) -> dict[str, Any]:
    """The scenario with its checks; returns what it measured (seconds), for the test to print."""
    create_topic(broker.bootstrap, topic, PARTITIONS)
    producer = SteadyProducer(broker.bootstrap, topic)
    producer.start()
    members: list[Member] = []
    try:
        started = time.monotonic()
        members = [Member.start(f"member{i}", [*member_cmd, broker.bootstrap, topic, group], workdir, cwd)
                   for i in range(3)]
        survivors, victim = members[:2], members[2]

        def why() -> str:
            return "\n".join([*(m.diagnostics() for m in members), "--- broker log:", broker.read_log()[-4000:]])

        def recent(m: Member) -> set[int]:
            return m.partitions_since(time.monotonic() - 0.5)

        try:
            wait_until(lambda: [len(recent(m)) for m in members] == [2, 2, 2] and all(m.member_id for m in members)
                       and describe(broker.bootstrap, group).group_state == "Stable", timeout=join_timeout,
                       interval=0.1, what="each of the three members consuming two partitions, the group Stable")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{why()}") from None
        joined = time.monotonic() - started
        # The members' clock is the test's (CLOCK_MONOTONIC): their record times are comparable with ours.
        assert started <= members[0].records[-1][0] <= time.monotonic()
        time.sleep(1)  # a second of steady state: the baseline of the gap, and committed offsets for every partition
        own = {m.name: recent(m) for m in members}
        assert set().union(*own.values()) == set(range(PARTITIONS)), own
        moved = own[victim.name]
        victim_id = victim.member_id
        victim.kill()
        killed_at = time.monotonic()

        def first_after_kill(p: int) -> float | None:
            ts = [r[0] for m in survivors for r in list(m.records) if r[1] == p and r[0] >= killed_at]
            return min(ts) if ts else None

        try:
            wait_until(lambda: all(first_after_kill(p) is not None for p in moved),
                       timeout=session_timeout_ms / 1000 + TAKEOVER_SLACK + 5, interval=0.05,
                       what="the killed member's partitions consumed by the survivors")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{why()}") from None
        took_over_at = max(t for p in moved if (t := first_after_kill(p)) is not None)
        takeover = took_over_at - killed_at
        gaps = {m.name: max_gap(m.records, own[m.name], killed_at - 1, took_over_at) for m in survivors}
        # Each survivor ends up with three partitions, none of them shared.
        wait_until(lambda: [len(recent(m)) for m in survivors] == [3, 3], timeout=10, interval=0.1,
                   what="each survivor consuming three partitions")
        after = [recent(m) for m in survivors]
        assert not after[0] & after[1] and after[0] | after[1] == set(range(PARTITIONS)), after
        d = describe(broker.bootstrap, group)
        assert (d.error_code, d.group_state) == (0, "Stable")
        assert {m.member_id for m in d.members} == {m.member_id for m in survivors}
        assert victim_id not in {m.member_id for m in d.members}
        total = producer.stop()
        everything = {str(i) for i in range(total)}
        try:
            wait_until(lambda: set().union(*(m.values() for m in members)) >= everything, timeout=20, interval=0.1,
                       what="every produced record consumed by the group")
        except AssertionError as e:
            missing = sorted(everything - set().union(*(m.values() for m in members)), key=int)
            by_partition = {p: [v for v in missing if int(v) % PARTITIONS == p][:5] for p in range(PARTITIONS)}
            last = {m.name: {p: max((r[2] for r in list(m.records) if r[1] == p), default=None)
                             for p in range(PARTITIONS)} for m in members}
            raise AssertionError(f"{e}: {len(missing)} of {total} missing, first per partition {by_partition}; "
                                 f"last offset each member consumed per partition {last}; end offsets "
                                 f"{end_offsets(broker.bootstrap, topic, PARTITIONS)}\n{why()}") from None
        # At least once: on each moved partition the survivors start at the killed member's last commit, at or
        # before the record after the last one it consumed, and after the start (it did commit).
        duplicates = 0
        for p in moved:
            victim_offsets = {r[2] for r in victim.records if r[1] == p}
            survivor_offsets = [r[2] for m in survivors for r in list(m.records) if r[1] == p and r[0] >= killed_at]
            resumed = min(survivor_offsets)
            assert 0 < resumed <= max(victim_offsets) + 1, (p, resumed, max(victim_offsets))
            duplicates += len(victim_offsets & set(survivor_offsets))
        for m in survivors:
            assert m.close() == 0 and m.closed, m.diagnostics()
        assert committed(broker.bootstrap, group, topic, PARTITIONS) == end_offsets(broker.bootstrap, topic,
                                                                                   PARTITIONS)
        assert not [e for m in members for e in m.errors], [m.errors for m in members]
        fenced = f"Member {victim_id} fenced: session timeout ({session_timeout_ms} ms) expired in consumer group {group}"
        assert fenced in broker.read_log()
        # The survivors' partitions did not pause, and the killed member's moved once its session expired, not
        # before (its last heartbeat was at most one interval, 300 ms, before the kill).
        assert all(g < MAX_GAP for g in gaps.values()), gaps
        assert session_timeout_ms / 1000 - 0.5 <= takeover <= session_timeout_ms / 1000 + TAKEOVER_SLACK, takeover
        return {"joined": round(joined, 2), "takeover": round(takeover, 2),
                "max_gap": {k: round(v, 3) for k, v in gaps.items()}, "records": total,
                "re-consumed": duplicates}
    finally:
        producer.halt.set()
        for m in members:
            if m.proc.poll() is None:
                m.kill()

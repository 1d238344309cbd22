"""Workload share_groups: 5 share consumers (KIP-932, confluent-kafka's ShareConsumer, implicit acknowledgement) on
one 2-partition topic drain N preloaded 100-byte records; records per second and broker CPU per record, kbroker
beside Apache Kafka 4.x (KRaft, share groups GA since 4.2) in the same run.

Each repetition uses a fresh topic and group (`share.auto.offset.reset=earliest`, set through
IncrementalAlterConfigs on the GROUP resource). The N records are produced first; then five consumer processes
subscribe and wait, untimed, until ShareGroupDescribe shows all five members with an assignment. The clock starts
when they are told to poll; once N records have been delivered they stop polling and commit_sync what they hold
(the implicit acceptances of earlier batches rode on their ShareFetches), and the clock stops at the last answer.
Broker CPU over the same interval, divided by N. Untimed afterwards: DescribeShareGroupOffsets should show both
share-partitions' start offsets at the log end (noted if not), and each consumer reports the records it got: any
record never delivered fails the repetition, records delivered more than once are counted in the note.

librdkafka's mock cluster has no share groups (no ShareGroupHeartbeat or ShareFetch), so there is no mock column;
Kafka 3.9 and Tansu have none either. Target: kbroker's records/s >= Kafka 4.x's."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench import clients
from bench.harness import Ctx, KBroker, Row, Target, med, payloads, reap, spawn, start_peers, workdir

CONSUMERS, PARTITIONS = 5, 2
SHARE_PEERS = ("kafka4",)  # the --peers that have share groups
SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE, DESCRIBE_SHARE_GROUP_OFFSETS = 76, 77, 90
ACKED_WAIT = 10.0  # seconds after the last commit for the start offsets to reach the log end (untimed check)

CONSUMER = r"""
import os, sys, time
from confluent_kafka import ShareConsumer
bootstrap, group, topic, go, stop, out = sys.argv[1:7]
c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "share.acknowledgement.mode": "implicit",
                   "log_level": 3})
acks = [0, 0]  # offsets whose acknowledgement the broker confirmed, refused


def on_ack(offsets, err):
    acks[err is not None] += sum(len(o) for o in offsets.values())


c.set_acknowledgement_commit_callback(on_ack)
c.subscribe([topic])
print("SUBSCRIBED", flush=True)
while not os.path.exists(go) and not os.path.exists(stop):
    time.sleep(0.005)
got = []
while not os.path.exists(stop):
    k = 0
    for m in c.poll(0.02):
        if m.error() is None:
            got.append((m.partition(), m.offset()))
            k += 1
    if k:
        print(len(got), flush=True)
c.commit_sync(30)
print(f"COMMITTED {time.time()}", flush=True)
c.close()
print(f"ACKS {acks[0]} {acks[1]}", flush=True)
with open(out, "w") as f:
    f.writelines(f"{p} {o}\n" for p, o in got)
"""


def at_least_kafka(r: Row) -> bool | None:
    """kbroker's median records/s at least each Kafka 4.x's in the same run."""
    kafkas = [n for n in r.others if n.startswith("Kafka")]
    ratios = [r.ratio_to(n) for n in kafkas]
    if not ratios or any(q is None for q in ratios):
        return None
    return all(q is not None and q >= 1.0 for q in ratios)


class Member:
    """One ShareConsumer process; its stdout's last count is how many records it has received so far."""

    def __init__(self, d: Path, i: int, bootstrap: str, group: str, topic: str) -> None:
        self.go, self.stop, self.out = d / "go", d / "stop", d / f"m{i}.txt"
        self.proc = spawn(
            [
                sys.executable,
                "-c",
                CONSUMER,
                bootstrap,
                group,
                topic,
                str(self.go),
                str(self.stop),
                str(self.out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.subscribed = threading.Event()
        self.count = 0
        self.committed = 0.0  # wall clock when its last acknowledgements were committed, after the stop
        self.acks = (0, 0)  # acknowledgements the broker confirmed, refused (the acknowledgement callback)
        self.err = ""
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("SUBSCRIBED"):
                self.subscribed.set()
            elif line.startswith("COMMITTED"):
                self.committed = float(line.split()[1])
            elif line.startswith("ACKS"):
                self.acks = (int(line.split()[1]), int(line.split()[2]))
            elif line.strip().isdigit():
                self.count = int(line)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        self.err = self.proc.stderr.read()

    def records(self) -> list[tuple[int, int]]:
        try:
            lines = self.out.read_text().split("\n")
        except OSError:
            return []
        return [(int(p), int(o)) for p, o in (ln.split() for ln in lines if ln)]


def set_group_config(bootstrap: str, group: str, configs: dict[str, str]) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    res = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()
        ],
    )
    admin.incremental_alter_configs([res])[res].result(30)


def assigned_members(bootstrap: str, group: str) -> int:
    """Members of the share group holding at least one partition (ShareGroupDescribe)."""
    from kbroker.protocol.messages import ShareGroupDescribeRequest

    from kbroker_tools.wire import WireClient

    with WireClient(bootstrap) as w:
        v = w.max_version(SHARE_GROUP_DESCRIBE, 1)
        groups = w.request(SHARE_GROUP_DESCRIBE, v, ShareGroupDescribeRequest(group_ids=[group])).groups
    if not groups or groups[0].error_code:
        return 0
    return sum(1 for m in groups[0].members if any(t.partitions for t in m.assignment.topic_partitions))


def start_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """Share-partition start offset of each partition (DescribeShareGroupOffsets; -1 while not initialized)."""
    from kbroker.protocol.messages import DescribeShareGroupOffsetsRequest as D

    from kbroker_tools.wire import WireClient

    req = D(
        groups=[
            D.DescribeShareGroupOffsetsRequestGroup(
                group_id=group,
                topics=[D.DescribeShareGroupOffsetsRequestTopic(topic, list(range(PARTITIONS)))],
            )
        ]
    )
    with WireClient(bootstrap) as w:
        resp = w.request(DESCRIBE_SHARE_GROUP_OFFSETS, w.max_version(DESCRIBE_SHARE_GROUP_OFFSETS, 1), req)
    return {
        p.partition_index: p.start_offset if not p.error_code else -1
        for g in resp.groups
        for t in g.topics
        for p in t.partitions
    }


def serves_share_groups(bootstrap: str) -> bool:
    from kbroker_tools.wire import WireClient

    with WireClient(bootstrap) as w:
        return w.max_version(SHARE_GROUP_HEARTBEAT, 1) >= 1


def wait(cond: Callable[[], bool], timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return False


def drain(ctx: Ctx, row: Row, t: Target, n: int, values: list[bytes], rep: int) -> None:
    """One repetition on one broker: preload, join, drain; adds records/s and CPU us/record to the row."""
    topic, group = f"share-r{rep}", f"bench-share-r{rep}"
    t.create_topics([topic], partitions=PARTITIONS)
    set_group_config(t.bootstrap, group, {"share.auto.offset.reset": "earliest"})
    _, left = clients.produce(t.bootstrap, clients.partitions_of([topic], PARTITIONS), n, values, {}, 300)
    if left:
        raise RuntimeError(f"{left} of {n} records not acknowledged while preloading")
    ends = {p: n // PARTITIONS + (1 if p < n % PARTITIONS else 0) for p in range(PARTITIONS)}
    d = workdir(ctx.base, f"share-{t.name.replace(' ', '')}-r{rep}")
    members = [Member(d, i, t.bootstrap, group, topic) for i in range(CONSUMERS)]
    try:
        joined = wait(lambda: all(m.subscribed.is_set() for m in members), 60) and wait(
            lambda: assigned_members(t.bootstrap, group) == CONSUMERS, 30, 0.2
        )
        if not joined:
            row.note += (
                f" {t.name} rep{rep + 1}: {assigned_members(t.bootstrap, group)} of {CONSUMERS} members "
                "assigned after 30 s, drained anyway;"
            )
        c0, wall0 = t.cpu(), time.time()
        members[0].go.touch()
        delivered = wait(lambda: sum(m.count for m in members) >= n, max(120.0, n / 500), 0.005)
        # every record delivered: the consumers stop polling and commit what they hold (commit_sync returns once
        # the broker answered the acknowledgements); the clock stops at the last of those answers
        members[0].stop.touch()
        committed = wait(lambda: all(m.committed for m in members), 60, 0.005)
        cpu = t.cpu() - c0
        secs = max(m.committed for m in members) - wall0 if committed else float("nan")
        # untimed: the broker agrees that nothing is left (both start offsets at the log end)
        acked = committed and wait(
            lambda: all(
                start_offsets(t.bootstrap, group, topic).get(p, -1) >= end for p, end in ends.items()
            ),
            ACKED_WAIT,
            0.05,
        )
    finally:
        members[0].stop.touch()
        for m in members:
            try:
                m.proc.wait(60)
            except subprocess.TimeoutExpired:
                m.err += " (did not exit within 60 s of the stop)"
            reap(m.proc)
    if committed and not acked:
        offsets = start_offsets(t.bootstrap, group, topic)
        row.note += (
            f" {t.name} rep{rep + 1}: DescribeShareGroupOffsets start offsets {offsets} of log ends {ends} "
            f"{ACKED_WAIT:.0f} s after the last commit;"
        )
    got = [r for m in members for r in m.records()]
    unique = set(got)
    per_member = [len(m.records()) for m in members]
    lost = sum(ends.values()) - len(unique)
    confirmed, refused = sum(m.acks[0] for m in members), sum(m.acks[1] for m in members)
    row.note += (
        f" {t.name} rep{rep + 1}: {len(got) - len(unique)} duplicate deliveries, per consumer "
        f"{'/'.join(map(str, per_member))}, acknowledgements {confirmed} confirmed / {refused} refused;"
    )
    if not delivered or not committed or lost:
        errs = "; ".join(m.err.strip()[-300:] for m in members if m.err.strip())
        row.note += f" {t.name} rep{rep + 1}: {lost} never delivered, committed={committed} {errs};"
        row.add(t, float("nan"))
        ctx.log(
            f"  share groups rep {rep + 1} {t.name}: FAILED ({lost} never delivered, committed={committed})"
        )
        return
    row.add(t, n / secs, cpu * 1e6 / n)
    ctx.log(
        f"  share groups rep {rep + 1} {t.name}: {n / secs:,.0f} records/s, broker CPU {cpu * 1e6 / n:.2f} "
        f"us/record, {len(got) - len(unique)} duplicates, per consumer {per_member}, acknowledgements "
        f"{confirmed} confirmed / {refused} refused"
    )


def run(ctx: Ctx) -> list[Row]:
    n = ctx.n(200_000, 20_000)
    values = payloads(100)
    row = Row(
        f"share group: {CONSUMERS} ShareConsumers (confluent-kafka, implicit acks) drain {n:,} x 100 B "
        f"on {PARTITIONS} partitions",
        "records/s",
        target="kbroker >= Kafka 4.x",
        check=at_least_kafka,
    )
    row.note = "librdkafka's mock cluster has no share groups: kbroker and Apache Kafka 4.x only;"
    peers = ctx.extra.get("peers", [])
    left_out = [p for p in peers if p not in SHARE_PEERS]
    if left_out:
        row.note += f" {', '.join(left_out)}: no share groups;"
    kb = KBroker(ctx.base, {"share.coordinator.state.topic.replication.factor": "1"})
    others: list[Target] = []
    ctx.extra["peers"] = [p for p in peers if p in SHARE_PEERS]
    try:
        kb.start()
        others = start_peers(ctx)
        for t in list(others):
            if not serves_share_groups(t.bootstrap):
                row.note += f" {t.name}: ShareGroupHeartbeat not in ApiVersions (share.version feature off);"
                t.stop()
                others.remove(t)
        for rep in range(ctx.reps):
            if ctx.out_of_time(f"{row.workload} rep {rep + 1}"):
                break
            for t in (kb, *others) if rep % 2 == 0 else (*others, kb):  # A/B, then B/A
                try:
                    drain(ctx, row, t, n, values, rep)
                except Exception as e:  # noqa: BLE001 - a peer that fails: a note, not kbroker's figures lost
                    if t is kb:
                        raise
                    row.add(t, float("nan"))
                    row.note += f" {t.name} rep{rep + 1}: {type(e).__name__}: {str(e)[:200]};"
                    ctx.log(f"  share groups rep {rep + 1} {t.name}: failed: {type(e).__name__}: {e}")
        for t in (kb, *others):
            row.add_rss(t)
    finally:
        ctx.extra["peers"] = peers
        kb.stop()
        for t in others:
            t.stop()
    for t in others:
        q = row.ratio_to(t.name)
        if q is not None:
            row.note += f" kbroker/{t.name} {q:.2f}x (medians);"
    if med(row.kb) is None:
        row.note += " kbroker: no figure;"
    return [row]

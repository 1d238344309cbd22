"""Workload 5: scale. (a) RSS with 1,000 idle partitions (250 topics x 4, one message each); (b) produce and
consume 100-byte messages spread over those 1,000 partitions; (c) 200 concurrent producer connections
(200 confluent-kafka producers, each its own connection) producing 100-byte messages to 8 topics x 4 partitions;
kbroker, the mock and the --peers (Apache Kafka, Tansu) in turn."""

from __future__ import annotations

import time

from bench import clients
from bench.harness import (
    Ctx,
    KBroker,
    Peer,
    Row,
    Target,
    all_of,
    cpu_le,
    kb_le,
    payloads,
    ratio_ge,
    start_peers,
    watermark_total,
    watermarks,
)

NPART_TOPICS = 250  # x 4 partitions = 1,000
NPRODUCERS = 200


def many_producers(bootstrap: str, tps: list[tuple[str, int]], nprod: int, n: int, values: list[bytes],
                   timeout: float) -> tuple[float, int]:
    """nprod producers, each with its own connection, sending n messages in total round-robin; returns
    (seconds from the first produce until all are acknowledged, undelivered)."""
    from confluent_kafka import Producer

    ps = [Producer({"bootstrap.servers": bootstrap, **clients.PRODUCE_BASE}) for _ in range(nprod)]
    try:
        for p in ps:
            p.list_topics(tps[0][0], timeout=30)  # every producer connected before the clock starts
        ntp, nval = len(tps), len(values)
        deadline = time.monotonic() + timeout
        t0 = time.perf_counter()
        for i in range(n):
            t, part = tps[i % ntp]
            ps[i % nprod].produce(t, values[i % nval], partition=part)
            if i % 10000 == 0:
                for p in ps:
                    p.poll(0)
        left = 0
        for p in ps:
            left += p.flush(max(0.1, deadline - time.monotonic()))
        return time.perf_counter() - t0, left
    finally:
        for p in ps:
            p.purge()
            p.flush(0)
        del ps


def run(ctx: Ctx) -> list[Row]:
    n = ctx.n(1_000_000, 100_000)
    values = payloads(100)
    idle = Row("RSS with 1,000 idle partitions (one message each)", "MB", target="kbroker <= 150 MB",
               check=kb_le(150.0), higher_is_better=False)
    prow = Row("produce 100 B over 1,000 partitions", "msg/s", target=">= peer; CPU <= 0.15 us/msg",
               check=all_of(ratio_ge(1.0), cpu_le(0.15)))
    crow = Row("consume 100 B from 1,000 partitions, confluent-kafka", "msg/s",
               target=">= peer; CPU <= 0.1 us/msg", check=all_of(ratio_ge(1.0), cpu_le(0.1)))
    many = Row(f"produce 100 B from {NPRODUCERS} concurrent producer connections", "msg/s",
               target=">= peer; CPU <= 0.15 us/msg", check=all_of(ratio_ge(1.0), cpu_le(0.15)))
    rows = [idle, prow, crow, many]
    topics = [f"big_{k}" for k in range(NPART_TOPICS)]
    tps = clients.partitions_of(topics)
    kb, peer = KBroker(ctx.base), Peer()
    others: list[Target] = []
    try:
        kb.start()
        peer.start()
        others = start_peers(ctx)
        for t in (kb, peer, *others):
            t.create_topics(topics)
            clients.produce(t.bootstrap, tps, len(tps), values, {}, timeout=60)
            time.sleep(2.0)
            idle.add(t, t.rss_mb())
            ctx.log(f"  {t.name}: RSS {t.rss_mb():.1f} MB with 1,000 idle partitions")
        for t in (kb, *others):
            idle.add_rss(t)
        for rep in range(ctx.reps):
            if ctx.out_of_time(f"scale 1,000 partitions rep {rep + 1}"):
                break
            for t in (kb, peer, *others):
                hw0 = watermarks(t.bootstrap, topics)
                before = sum(hw0.values())
                c0 = t.cpu()
                secs, left = clients.produce(t.bootstrap, tps, n, values, {}, timeout=120)
                cpu = t.cpu() - c0
                acked = watermark_total(t.bootstrap, topics) - before
                if left or acked != n:
                    prow.note += f" {t.name} rep{rep + 1}: {acked} of {n} acked;"
                prate = n / secs if acked >= n else float("nan")
                prow.add(t, prate, cpu * 1e6 / n)
                # read what this rep produced
                want = n
                c0 = t.cpu()
                secs, got, _ = clients.consume_confluent(t.bootstrap, tps, want, 120, offsets=hw0)
                cpu = t.cpu() - c0
                if got < want:
                    crow.note += f" {t.name} rep{rep + 1}: read {got} of {want};"
                crate = got / secs if got >= want else float("nan")
                crow.add(t, crate, cpu * 1e6 / max(got, 1))
                ctx.log(f"  1,000 partitions rep {rep + 1} {t.name}: produce {prate:,.0f} msg/s, consume "
                        f"{crate:,.0f} msg/s ({got} messages)")
        for t in (kb, *others):
            prow.add_rss(t)
            crow.add_rss(t)
    finally:
        kb.stop()
        peer.stop()
        for t in others:
            t.stop()

    # 200 producer connections, fresh brokers
    nm = ctx.n(100_000, 20_000)
    kb, peer = KBroker(ctx.base), Peer()
    others = []
    try:
        kb.start()
        peer.start()
        others = start_peers(ctx)
        for rep in range(ctx.reps):
            if ctx.out_of_time(f"scale {NPRODUCERS} producers rep {rep + 1}"):
                break
            topics = [f"m{rep}_{k}" for k in range(8)]
            tps = clients.partitions_of(topics)
            for t in (kb, peer, *others):
                t.create_topics(topics)
            for t in (kb, peer, *others):
                c0 = t.cpu()
                secs, left = many_producers(t.bootstrap, tps, NPRODUCERS if not ctx.quick else 50, nm, values, 120)
                cpu = t.cpu() - c0
                acked = watermark_total(t.bootstrap, topics)
                if left or acked != nm:
                    many.note += f" {t.name} rep{rep + 1}: {acked} of {nm} acked;"
                rate = nm / secs if acked >= nm else float("nan")
                many.add(t, rate, cpu * 1e6 / nm)
                ctx.log(f"  {NPRODUCERS if not ctx.quick else 50} producers rep {rep + 1} {t.name}: "
                        f"{rate:,.0f} msg/s, CPU {cpu * 1e6 / nm:.3f} us/msg")
        for t in (kb, *others):
            many.add_rss(t)
        if ctx.quick:
            many.workload = many.workload.replace(str(NPRODUCERS), "50 (--quick)")
    finally:
        kb.stop()
        peer.stop()
        for t in others:
            t.stop()
    return rows

"""Workload 1: produce N x 100-byte messages with confluent-kafka (acks=all, linger.ms 5, batch.size 1 MB) over
8 topics x 4 partitions, idempotence off/on x compression none/lz4/zstd; kbroker, the mock and the --peers
(Apache Kafka, Tansu: started once for all six rows) in turn."""

from __future__ import annotations

import itertools

from bench import clients
from bench.harness import (
    Ctx,
    KBroker,
    Peer,
    Row,
    Target,
    all_of,
    cpu_le,
    payloads,
    profile,
    ratio_ge,
    start_peers,
    watermark_total,
)

NTOPICS = 8


def run_config(ctx: Ctx, idem: bool, codec: str, n: int, tag: str, others: list[Target]) -> Row:
    name = f"produce 100 B, {codec}, idempotence {'on' if idem else 'off'}"
    row = Row(name, "msg/s", target=">= peer; CPU <= 0.15 us/msg",
              check=all_of(ratio_ge(1.0), cpu_le(0.15)))
    conf = {"enable.idempotence": idem, "compression.type": codec}
    values = payloads(100)
    kb, peer = KBroker(ctx.base), Peer()
    try:
        kb.start()
        peer.start()
        for rep in range(ctx.reps):
            if ctx.out_of_time(f"{name} rep {rep + 1}"):
                break
            topics = [f"{tag}r{rep}_{k}" for k in range(NTOPICS)]
            tps = clients.partitions_of(topics)
            for t in (kb, peer, *others):
                t.create_topics(topics)
            for t in (kb, peer, *others):
                c0 = t.cpu()
                secs, left = clients.produce(t.bootstrap, tps, n, values, conf, timeout=120)
                cpu = t.cpu() - c0
                acked = watermark_total(t.bootstrap, topics)
                if left or acked != n:
                    row.note += f" {t.name} rep{rep + 1}: {left} undelivered, {acked} acked;"
                rate = n / secs if acked >= n else float("nan")
                row.add(t, rate, cpu * 1e6 / n)
                ctx.log(f"  {name} rep {rep + 1} {t.name}: {rate:,.0f} msg/s, broker CPU {cpu * 1e6 / n:.3f} us/msg")
        for t in (kb, *others):
            row.add_rss(t)
        if ctx.profile and not idem and codec == "none" and not ctx.out_of_time("produce profile"):
            topics = [f"{tag}prof_{k}" for k in range(NTOPICS)]
            kb.create_topics(topics)
            profile(ctx, kb.pid, "produce (100 B, none, idempotence off)", "produce",
                    lambda: clients.produce(kb.bootstrap, clients.partitions_of(topics), n, values, conf, timeout=120))
    finally:
        kb.stop()
        peer.stop()
    return row


def run(ctx: Ctx) -> list[Row]:
    n = ctx.n(1_000_000, 100_000)
    codecs = ["none", "lz4", "zstd"]
    rows = []
    others = start_peers(ctx)
    try:
        for i, (idem, codec) in enumerate(itertools.product([False, True], codecs)):
            if ctx.out_of_time(f"produce {codec} idempotence={idem}"):
                break
            rows.append(run_config(ctx, idem, codec, n, f"p{i}", others))
    finally:
        for t in others:
            t.stop()
    return rows

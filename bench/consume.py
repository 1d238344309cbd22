"""Workload 2: consume N x 100-byte messages (8 topics x 4 partitions, from offset 0, assign without a group) with
confluent-kafka (fetch.queue.backoff.ms=10), aiokafka and kafka-python; kbroker, the mock and the --peers in turn."""

from __future__ import annotations

from bench import clients
from bench.harness import (
    Ctx,
    KBroker,
    Peer,
    Row,
    Target,
    all_of,
    cpu_le,
    kb_ge,
    payloads,
    profile,
    ratio_ge,
    start_peers,
    watermark_total,
)

NTOPICS = 8


def run(ctx: Ctx) -> list[Row]:
    n = ctx.n(1_000_000, 100_000)
    topics = [f"c_{k}" for k in range(NTOPICS)]
    tps = clients.partitions_of(topics)
    values = payloads(100)
    rows = {
        "confluent-kafka": Row("consume 100 B, confluent-kafka", "msg/s",
                               target=">= 1M msg/s and >= peer; CPU <= 0.1 us/msg",
                               check=all_of(kb_ge(1e6), ratio_ge(1.0), cpu_le(0.1))),
        "aiokafka": Row("consume 100 B, aiokafka", "msg/s", target=">= peer; CPU <= 0.1 us/msg",
                        check=all_of(ratio_ge(1.0), cpu_le(0.1))),
        "kafka-python": Row("consume 100 B, kafka-python", "msg/s", target=">= peer; CPU <= 0.1 us/msg",
                            check=all_of(ratio_ge(1.0), cpu_le(0.1))),
    }
    # kafka-python reads ~100k msg/s whatever the broker: a smaller count keeps the run short.
    counts = {"confluent-kafka": n, "aiokafka": n, "kafka-python": max(1, n // 4)}
    kb, peer = KBroker(ctx.base), Peer()
    others: list[Target] = []
    try:
        kb.start()
        peer.start()
        others = start_peers(ctx)
        for t in (kb, peer, *list(others)):
            t.create_topics(topics)
            clients.produce(t.bootstrap, tps, n, values, {}, timeout=120)
            acked = watermark_total(t.bootstrap, topics)
            if acked != n and t in others:  # a peer that cannot hold the data set: its cells say why, not the run
                for r in rows.values():
                    r.note += f" {t.name}: no figures, its high watermarks sum to {acked} after {n} acked messages;"
                t.stop()
                others.remove(t)
            elif acked != n:
                raise RuntimeError(f"{t.name}: loaded {acked} of {n} messages")
        for rep in range(ctx.reps):
            for cname, fn in clients.CONSUMERS.items():
                if ctx.out_of_time(f"consume {cname} rep {rep + 1}"):
                    continue
                row, want = rows[cname], counts[cname]
                for t in (kb, peer, *others):
                    c0 = t.cpu()
                    secs, got, _ = fn(t.bootstrap, tps, want, 120)
                    cpu = t.cpu() - c0
                    if got < want:
                        row.note += f" {t.name} rep{rep + 1}: read {got} of {want};"
                    rate = got / secs if got >= want else float("nan")
                    row.add(t, rate, cpu * 1e6 / max(got, 1))
                    ctx.log(f"  consume {cname} rep {rep + 1} {t.name}: {rate:,.0f} msg/s, "
                            f"broker CPU {cpu * 1e6 / max(got, 1):.3f} us/msg")
        for r in rows.values():
            for t in (kb, *others):
                r.add_rss(t)
        if ctx.profile and not ctx.out_of_time("consume profile"):
            profile(ctx, kb.pid, "consume (confluent-kafka, 100 B)", "consume",
                    lambda: clients.consume_confluent(kb.bootstrap, tps, n, 120))
    finally:
        kb.stop()
        peer.stop()
        for t in others:
            t.stop()
    return list(rows.values())

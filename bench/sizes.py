"""Workload 4: 1 KB and 100 KB messages, produced (confluent-kafka, acks=all, linger.ms 5, batch.size 1 MB) and
consumed back (confluent-kafka), in MB/s of message values. 8 topics x 4 partitions; 100 MB per run by default
(the mock keeps ~5 MiB per partition, so a run must stay below ~160 MB to be read back); kbroker, the mock and
the --peers in turn."""

from __future__ import annotations

from bench import clients
from bench.harness import Ctx, KBroker, Peer, Row, Target, payloads, ratio_ge, start_peers, watermark_total

NTOPICS = 8


def run(ctx: Ctx) -> list[Row]:
    total_mb = 20 if ctx.quick else 100
    total_mb = total_mb * ctx.scale
    rows: list[Row] = []
    kb, peer = KBroker(ctx.base), Peer()
    others: list[Target] = []
    try:
        kb.start()
        peer.start()
        others = start_peers(ctx)
        for size, label in ((1000, "1 KB"), (100_000, "100 KB")):
            n = max(32, int(total_mb * 1e6 / size))
            prow = Row(f"produce {label} messages ({n:,})", "MB/s", target=">= peer", check=ratio_ge(1.0))
            crow = Row(f"consume {label} messages, confluent-kafka", "MB/s", target=">= peer", check=ratio_ge(1.0))
            values = payloads(size, count=64)
            for rep in range(ctx.reps):
                if ctx.out_of_time(f"sizes {label} rep {rep + 1}"):
                    break
                topics = [f"s{size}r{rep}_{k}" for k in range(NTOPICS)]
                tps = clients.partitions_of(topics)
                for t in (kb, peer, *others):
                    t.create_topics(topics)
                for t in (kb, peer, *others):
                    c0 = t.cpu()
                    secs, left = clients.produce(t.bootstrap, tps, n, values, {}, timeout=120)
                    cpu = t.cpu() - c0
                    acked = watermark_total(t.bootstrap, topics)
                    ok = acked >= n and not left
                    if not ok:
                        prow.note += f" {t.name} rep{rep + 1}: {acked} of {n} acked;"
                    prate = n * size / 1e6 / secs if ok else float("nan")
                    prow.add(t, prate, cpu * 1e6 / n)
                    c0 = t.cpu()
                    secs, got, nbytes = clients.consume_confluent(t.bootstrap, tps, n, 120)
                    cpu = t.cpu() - c0
                    if got < n:
                        crow.note += f" {t.name} rep{rep + 1}: read {got} of {n};"
                    crate = nbytes / 1e6 / secs if got >= n else float("nan")
                    crow.add(t, crate, cpu * 1e6 / max(got, 1))
                    ctx.log(f"  {label} rep {rep + 1} {t.name}: produce {prate:.0f} MB/s, consume {crate:.0f} MB/s")
            for t in (kb, *others):
                prow.add_rss(t)
                crow.add_rss(t)
            rows += [prow, crow]
    finally:
        kb.stop()
        peer.stop()
        for t in others:
            t.stop()
    return rows

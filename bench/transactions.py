"""Workload: transactions. Produce N x 100-byte messages with confluent-kafka over 8 topics x 4 partitions,
idempotent (the baseline) and transactional with a commit every 1,000 and every 10,000 messages, alternating
within each repetition on the same brokers; then read N transactionally written messages with
read_uncommitted and with read_committed; kbroker, the mock and the --peers (Apache Kafka, Tansu) in turn. Targets: transactional produce >= 0.9x idempotent produce, and
read_committed consume >= 0.95x read_uncommitted, both on kbroker in the same run."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from bench import clients
from bench.harness import Ctx, KBroker, Peer, Row, Target, med, payloads, start_peers, watermark_total

NTOPICS = 8
COMMIT_EVERY = (1_000, 10_000)
# kbroker settings as in the transaction tests: few __transaction_state partitions keep start-up short.
KB_OVERRIDES = {"transaction.state.log.num.partitions": "5"}


def at_least(baseline: Row, factor: float) -> Callable[[Row], bool | None]:
    """kbroker's median at least `factor` x the baseline row's kbroker median."""

    def chk(r: Row) -> bool | None:
        a, b = med(r.kb), med(baseline.kb)
        return None if a is None or b is None else a >= factor * b

    return chk


def vs(baseline: Row, r: Row) -> str:
    a, b = med(r.kb), med(baseline.kb)
    pa, pb = med(r.peer), med(baseline.peer)
    kb = "-" if a is None or b is None else f"{a / b:.2f}"
    peer = "-" if pa is None or pb is None else f"{pa / pb:.2f}"
    others = ""
    for name, xs in r.others.items():
        oa, ob = med(xs), med(baseline.others.get(name, []))
        if oa is not None and ob:
            others += f", {name} {oa / ob:.2f}x"
    return f" vs {baseline.workload}: kbroker {kb}x, peer {peer}x{others};"


def _measure(ctx: Ctx, row: Row, t: Target, n: int, fn: Callable[[], tuple[float, int]], topics: list[str],
             rep: int) -> None:
    c0 = t.cpu()
    secs, left = fn()
    cpu = t.cpu() - c0
    acked = watermark_total(t.bootstrap, topics)
    # transactional topics hold one marker per partition per transaction beyond the messages
    if left or acked < n:
        row.note += f" {t.name} rep{rep + 1}: {left} not committed, high watermarks {acked};"
    rate = n / secs if not left and acked >= n else float("nan")
    row.add(t, rate, cpu * 1e6 / n)
    ctx.log(f"  {row.workload} rep {rep + 1} {t.name}: {rate:,.0f} msg/s, broker CPU {cpu * 1e6 / n:.3f} us/msg")


def run_produce(ctx: Ctx, n: int) -> list[Row]:
    values = payloads(100)
    base = Row("produce 100 B, idempotent (baseline of the transactional rows)", "msg/s", target="(baseline)")
    txn_rows = {k: Row(f"produce 100 B, transactional, commit every {k:,}", "msg/s",
                       target="kbroker >= 0.9x its idempotent produce", check=at_least(base, 0.9))
                for k in COMMIT_EVERY}
    kb, peer = KBroker(ctx.base, KB_OVERRIDES), Peer()
    others: list[Target] = []
    try:
        kb.start()
        peer.start()
        others = start_peers(ctx)
        for rep in range(ctx.reps):
            for name, row, commit_every in [("idem", base, 0), *((f"t{k}", txn_rows[k], k) for k in COMMIT_EVERY)]:
                if ctx.out_of_time(f"{row.workload} rep {rep + 1}"):
                    break
                topics = [f"x{name}r{rep}_{k}" for k in range(NTOPICS)]
                tps = clients.partitions_of(topics)
                for t in (kb, peer, *others):
                    t.create_topics(topics)
                for t in (kb, peer, *others):
                    fn = (partial(clients.produce_transactional, t.bootstrap, tps, n, values, {}, 180, commit_every)
                          if commit_every else
                          partial(clients.produce, t.bootstrap, tps, n, values, {"enable.idempotence": True}, 180))
                    try:
                        _measure(ctx, row, t, n, fn, topics, rep)
                    except Exception as e:  # noqa: BLE001 - a peer without transactions: a note, not a lost run
                        if t in (kb, peer):
                            raise
                        row.add(t, float("nan"))
                        row.note += f" {t.name} rep{rep + 1}: {type(e).__name__}: {str(e)[:200]};"
                        ctx.log(f"  {row.workload} rep {rep + 1} {t.name}: failed: {type(e).__name__}: {e}")
        for r in (base, *txn_rows.values()):
            for t in (kb, *others):
                r.add_rss(t)
    finally:
        kb.stop()
        peer.stop()
        for t in others:
            t.stop()
    for r in txn_rows.values():
        r.note += vs(base, r)
    return [base, *txn_rows.values()]


def run_consume(ctx: Ctx, n: int) -> list[Row]:
    values = payloads(100)
    topics = [f"xc_{k}" for k in range(NTOPICS)]
    tps = clients.partitions_of(topics)
    uncommitted = Row("consume 100 B transactional data, confluent-kafka, read_uncommitted", "msg/s",
                      target="(baseline)")
    committed = Row("consume 100 B transactional data, confluent-kafka, read_committed", "msg/s",
                    target="kbroker >= 0.95x its read_uncommitted", check=at_least(uncommitted, 0.95))
    kb, peer = KBroker(ctx.base, KB_OVERRIDES), Peer()
    others: list[Target] = []
    try:
        kb.start()
        peer.start()
        others = start_peers(ctx)
        for t in (kb, peer, *list(others)):
            t.create_topics(topics)
            try:
                _, left = clients.produce_transactional(t.bootstrap, tps, n, values, {}, 300, COMMIT_EVERY[0])
            except Exception as e:  # noqa: BLE001 - a peer without transactions is left out below
                if t in (kb, peer):
                    raise
                left = n
                ctx.log(f"  [{t.name}: transactional load failed: {type(e).__name__}: {e}]")
            if left and t in others:  # a peer that cannot load the data set: its cells say why, not the run
                for r in (uncommitted, committed):
                    r.note += f" {t.name}: no figures, {left} of {n} messages not committed while loading;"
                t.stop()
                others.remove(t)
            elif left:
                raise RuntimeError(f"{t.name}: {left} of {n} messages not committed while loading")
        for rep in range(ctx.reps):
            for row, level in ((uncommitted, "read_uncommitted"), (committed, "read_committed")):
                if ctx.out_of_time(f"{row.workload} rep {rep + 1}"):
                    break
                for t in (kb, peer, *others):
                    c0 = t.cpu()
                    secs, got, _ = clients.consume_confluent(t.bootstrap, tps, n, 120,
                                                             conf={"isolation.level": level})
                    cpu = t.cpu() - c0
                    if got < n:
                        row.note += f" {t.name} rep{rep + 1}: read {got} of {n};"
                    rate = got / secs if got >= n else float("nan")
                    row.add(t, rate, cpu * 1e6 / max(got, 1))
                    ctx.log(f"  consume {level} rep {rep + 1} {t.name}: {rate:,.0f} msg/s, "
                            f"broker CPU {cpu * 1e6 / max(got, 1):.3f} us/msg")
        for r in (uncommitted, committed):
            for t in (kb, *others):
                r.add_rss(t)
    finally:
        kb.stop()
        peer.stop()
        for t in others:
            t.stop()
    committed.note += vs(uncommitted, committed)
    return [uncommitted, committed]


def run(ctx: Ctx) -> list[Row]:
    n = ctx.n(1_000_000, 100_000)
    rows = run_produce(ctx, n)
    if not ctx.out_of_time("transactions consume"):
        rows += run_consume(ctx, n)
    return rows

"""Workload: start-up to the first answered request on an empty log, RSS idle and RSS under a produce load, for
kbroker and each --peers broker (Apache Kafka 3.9 on ZooKeeper, 4.x on KRaft, Tansu), each started fresh per
repetition, alternating. The mock has RSS rows only (its READY line includes creating its topics)."""

from __future__ import annotations

import time

from bench import clients
from bench.harness import PEERS, Ctx, KBroker, Peer, Row, Target, payloads, watermark_total

NTOPICS = 8
IDLE_SECONDS = 5.0


def first_answer(bootstrap: str, began: float, timeout: float = 180.0) -> float:
    """Seconds from `began` until a Metadata request is answered (kbroker's start() only waits for the port)."""
    from kbroker_tools.wire import WireClient

    while time.monotonic() < began + timeout:
        try:
            with WireClient(bootstrap, timeout=2.0, client_id="bench-footprint") as c:
                if c.metadata([]).brokers:
                    return time.monotonic() - began
        except (OSError, ValueError, ConnectionError):
            time.sleep(0.005)
    raise RuntimeError(f"{bootstrap}: no Metadata answer within {timeout:.0f} s")


def _fresh(ctx: Ctx, key: str) -> Target:
    if key == "kbroker":
        return KBroker(ctx.base)
    if key == "mock":
        return Peer()
    return PEERS[key](ctx)


def run(ctx: Ctx) -> list[Row]:
    n = ctx.n(500_000, 100_000)
    start = Row(
        "start-up to first answered Metadata, empty log",
        "s",
        target="<= 1/10 of Kafka's",
        check=lambda r: None if r.ratio_to(_first_kafka(r)) is None else r.ratio_to(_first_kafka(r)) <= 0.1,
        higher_is_better=False,
    )
    idle = Row(
        f"RSS idle ({IDLE_SECONDS:.0f} s after start-up)",
        "MB",
        target="<= 1/4 of Kafka's",
        check=lambda r: None if r.ratio_to(_first_kafka(r)) is None else r.ratio_to(_first_kafka(r)) <= 0.25,
        higher_is_better=False,
    )
    load = Row(
        f"peak RSS producing {n:,} x 100 B (8 topics x 4 partitions)",
        "MB",
        target="<= 1/4 of Kafka's",
        check=lambda r: None if r.ratio_to(_first_kafka(r)) is None else r.ratio_to(_first_kafka(r)) <= 0.25,
        higher_is_better=False,
    )
    keys = ["kbroker", "mock", *ctx.extra.get("peers", [])]
    values = payloads(100)
    down: set[str] = set()
    for rep in range(ctx.reps):
        if ctx.out_of_time(f"footprint rep {rep + 1}"):
            break
        for key in keys:
            if key in down:
                continue
            t = _fresh(ctx, key)
            try:
                began = time.monotonic()
                try:
                    t.start()
                except Exception as e:  # noqa: BLE001 - a peer that cannot run here: noted once, left out
                    down.add(key)
                    reason = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
                    ctx.extra.setdefault("unavailable", {})[t.name] = reason
                    ctx.log(f"  [{t.name} unavailable: {reason}]")
                    continue
                if key != "mock":
                    secs = first_answer(t.bootstrap, began)
                    start.add(t, secs)
                time.sleep(IDLE_SECONDS)
                rss_idle = t.rss_mb()
                idle.add(t, rss_idle)
                topics = [f"fp{rep}_{k}" for k in range(NTOPICS)]
                t.create_topics(topics)
                clients.produce(t.bootstrap, clients.partitions_of(topics), n, values, {}, timeout=180)
                acked = watermark_total(t.bootstrap, topics)
                if acked < n:
                    load.note += f" {t.name} rep{rep + 1}: {acked} of {n} acked;"
                peak = t.hwm_mb()
                load.add(t, peak)
                ctx.log(
                    f"  footprint rep {rep + 1} {t.name}: "
                    f"{'start-up ' + format(secs, '.2f') + ' s, ' if key != 'mock' else ''}"
                    f"RSS idle {rss_idle:.0f} MB, peak under load {peak:.0f} MB"
                )
            finally:
                t.stop()
    return [start, idle, load]


def _first_kafka(r: Row) -> str:
    names = sorted(n for n in r.others if n.startswith("Kafka"))
    return names[0] if names else ""

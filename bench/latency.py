"""Workload 3: end-to-end latency. A producer (linger.ms 0, acks=all) sends 100-byte messages at a fixed rate
(10,000 msg/s) carrying time.monotonic_ns() (system-wide on Linux); a consumer in another process stamps each
message on arrival. Reports p50/p99/p99.9 over the run minus the first second (connection warm-up), for kbroker,
the mock and the --peers in turn."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time

from bench.harness import ROOT, Ctx, KBroker, Peer, Row, Target, kb_le, reap, spawn, start_peers

RATE = 10_000
TOPIC = "lat"
PARTITIONS = 4


def consumer_main(bootstrap: str, topic: str, seconds: float) -> None:
    """Child process: read until `seconds` of silence after the first message or 2x seconds in total."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-lat", "enable.auto.commit": False,
                  "fetch.queue.backoff.ms": 10, "log_level": 3, "enable.partition.eof": False,
                  **json.loads(os.environ.get("BENCH_LAT_CONSUMER_CONF", "{}"))})
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    print("READY", flush=True)
    lat: list[int] = []
    unpack = struct.Struct(">q").unpack_from
    t_end = time.monotonic() + 2 * seconds + 10
    last = None
    while time.monotonic() < t_end:
        m = c.poll(0.1)  # returns as soon as one message is there (consume(n, t) would wait for n)
        now = time.monotonic_ns()
        if m is not None:
            last = time.monotonic()
            if m.error() is None:
                sent = unpack(m.value())[0]
                lat.append((sent, now - sent))
        elif last is not None and time.monotonic() - last > 1.0:
            break
    c.close()
    json.dump(lat, sys.stdout)
    sys.stdout.flush()


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def one_run(bootstrap: str, seconds: float, rate: int = RATE, topic: str = TOPIC) -> tuple[list[float], int, int]:
    """Returns (latencies in ms after warm-up, sent, received), `rate` messages a second to `topic`."""
    from confluent_kafka import Producer

    cons = spawn([sys.executable, "-m", "bench.latency", "consumer", bootstrap, topic, str(seconds)], cwd=ROOT,
                 stdout=subprocess.PIPE, text=True)
    try:
        assert cons.stdout is not None
        if cons.stdout.readline().strip() != "READY":
            raise RuntimeError("latency consumer did not start")
        p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "log_level": 3})
        p.list_topics(topic, timeout=10)
        time.sleep(1.0)  # consumer's first fetches are in flight
        pad = b"x" * 92
        pack = struct.Struct(">q").pack
        n = int(rate * seconds)
        t0 = time.monotonic()
        i = 0
        while i < n:
            due = t0 + i / rate
            now = time.monotonic()
            if now < due:
                time.sleep(min(due - now, 0.0005))
                continue
            # send everything that is due (bursts of a few messages after each sleep)
            while i < n and t0 + i / rate <= now:
                p.produce(topic, pack(time.monotonic_ns()) + pad, partition=i % PARTITIONS)
                i += 1
            p.poll(0)
        p.flush(30)
        out, _ = cons.communicate(timeout=2 * seconds + 30)
        samples = json.loads(out)
        t_warm = (t0 + 1.0) * 1e9
        lat = [d / 1e6 for s, d in samples if s >= t_warm]
        return lat, n, len(samples)
    finally:
        reap(cons)


def run(ctx: Ctx) -> list[Row]:
    seconds = ctx.extra["latency_seconds"]
    rows = {
        q: Row(f"e2e latency at {RATE:,} msg/s, p{q}", "ms",
               target={"50": "<= 2 ms", "99": "<= 5 ms", "99.9": ""}[q],
               check={"50": kb_le(2.0), "99": kb_le(5.0), "99.9": None}[q], higher_is_better=False)
        for q in ("50", "99", "99.9")
    }
    kb, peer = KBroker(ctx.base), Peer(TOPIC, 1)
    others: list[Target] = []
    try:
        kb.start()
        peer.start()
        others = start_peers(ctx)
        for t in (kb, *others):
            t.create_topics([TOPIC], PARTITIONS)
        for rep in range(ctx.reps):
            if ctx.out_of_time(f"latency rep {rep + 1}"):
                break
            for t in (kb, peer, *others):
                c0 = t.cpu()
                lat, sent, got = one_run(t.bootstrap, seconds)
                cpu = t.cpu() - c0
                for q, row in rows.items():
                    v = pct(lat, float(q) / 100)
                    row.add(t, v, cpu * 1e6 / max(sent, 1) if q == "50" else None)
                    if got < sent and q == "50":
                        row.note += f" {t.name} rep{rep + 1}: received {got} of {sent};"
                ctx.log(f"  latency rep {rep + 1} {t.name}: p50 {pct(lat, .5):.2f} p99 {pct(lat, .99):.2f} "
                        f"p99.9 {pct(lat, .999):.2f} ms ({got}/{sent} received)")
        for r in rows.values():
            for t in (kb, *others):
                r.add_rss(t)
    finally:
        kb.stop()
        peer.stop()
        for t in others:
            t.stop()
    return list(rows.values())


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "consumer":
    consumer_main(sys.argv[2], sys.argv[3], float(sys.argv[4]))

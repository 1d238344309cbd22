"""Workload 6 (the mock has no disk): fill a large log (--restart-gb, default 10 GB, 0.2 GB with --quick), then
- fetch latency at random offsets of the large log vs a small log in the same broker (raw Fetch v4 requests,
  one partition, max_wait 0: index lookup + read + send);
- restart time after a clean shutdown (SIGTERM) and after kill -9 (with unflushed appends): until the port
  listens and until the first fetch of the large log is served;
- fetch latency again after recovery.
Apache Kafka (--peers kafka3.9 / kafka4), after kbroker: the same large log filled the same way, then the same clean
and kill -9 restarts, timed from exec to the first Fetch of the recovered partition served (and to the first answered
Metadata naming a controller in the "listening" rows: Kafka opens its port before it can answer). Kafka 3.9 keeps
its ZooKeeper running across the restarts; after kill -9 its start-up includes waiting for the old session's broker
registration to expire (the negotiated zookeeper.session.timeout.ms, 10 s here): until then Kafka exits at start-up
with NodeExists on /brokers/ids/0, and the bench starts it again at once, as a supervisor (systemd Restart=) would,
counting every attempt in the time and the attempts in the row's note."""

from __future__ import annotations

import random
import socket
import struct
import time

from bench import clients, page_cache
from bench.harness import PEERS, Ctx, KafkaTarget, KBroker, Row, kb_le, payloads

BIG, SMALL = "biglog", "smalllog"
PARTITIONS = 4
MSG = 10_000


class RawFetcher:
    """Fetch v4 over a plain socket: no client library in the measured path."""

    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.corr = 0

    def close(self) -> None:
        self.sock.close()

    def _recv(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return bytes(buf)

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = 1 << 20) -> tuple[int, int, int]:
        """Returns (error_code, high_watermark, records bytes)."""
        self.corr += 1
        t = topic.encode()
        body = struct.pack(">hhih", 1, 4, self.corr, 5) + b"bench"
        body += struct.pack(">iiiib", -1, 0, 0, max_bytes, 0)
        body += struct.pack(">ih", 1, len(t)) + t + struct.pack(">iiqi", 1, partition, offset, max_bytes)
        self.sock.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", self._recv(4))[0]
        resp = self._recv(size)
        pos = 4 + 4 + 4  # correlation id, throttle, topic count
        tlen = struct.unpack_from(">h", resp, pos)[0]
        pos += 2 + tlen + 4
        _, err, hw, _lso, naborted = struct.unpack_from(">ihqqi", resp, pos)
        pos += 4 + 2 + 8 + 8 + 4 + max(naborted, 0) * 16
        rec = struct.unpack_from(">i", resp, pos)[0]
        return err, hw, rec


def high_watermarks(bootstrap: str, topic: str) -> list[int]:
    f = RawFetcher(bootstrap)
    try:
        return [f.fetch(topic, p, 0, 1)[1] for p in range(PARTITIONS)]
    finally:
        f.close()


def fetch_latencies(bootstrap: str, topic: str, hws: list[int], count: int, seed: int = 1) -> list[float]:
    rnd = random.Random(seed)
    f = RawFetcher(bootstrap)
    out = []
    try:
        for _ in range(count):
            p = rnd.randrange(PARTITIONS)
            off = rnd.randrange(max(hws[p], 1))
            t0 = time.perf_counter()
            err, _, nbytes = f.fetch(topic, p, off, 64 * 1024)
            out.append((time.perf_counter() - t0) * 1000)
            if err or nbytes <= 0:
                raise RuntimeError(f"fetch {topic}-{p}@{off}: error {err}, {nbytes} bytes")
    finally:
        f.close()
    return out


def until_first_fetch(bootstrap: str, t_start: float, timeout: float = 300) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            f = RawFetcher(bootstrap)
            try:
                err, _, nbytes = f.fetch(BIG, 0, 0, 64 * 1024)
            finally:
                f.close()
            if err == 0 and nbytes > 0:
                return time.monotonic() - t_start
        except OSError:
            pass
        time.sleep(0.005)
    raise RuntimeError("no fetch served after restart")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run(ctx: Ctx) -> list[Row]:
    gb = ctx.extra["restart_gb"]
    n_big = max(PARTITIONS, int(gb * 1e9 / MSG))
    n_small = max(PARTITIONS, int(min(gb * 1e9 / 40, 50e6) / MSG))
    label = f"{gb:g} GB"
    fill = Row(f"fill the {label} log (10 KB messages, acks=all)", "MB/s", target="")
    lat_small = Row(f"fetch latency p50, {n_small * MSG / 1e6:.0f} MB log (random offsets, 64 KB)", "ms",
                    target="reference", higher_is_better=False)
    lat_big = Row(f"fetch latency p50, {label} log", "ms", target="~ the small log's (independent of size)",
                  higher_is_better=False)
    lat_big99 = Row(f"fetch latency p99, {label} log (small log in note)", "ms", target="", higher_is_better=False)
    clean_l = Row(f"clean restart, {label}: start -> listening (Kafka: first answered Metadata)", "s",
                  target="< 1 s (for 10 GB)",
                  check=kb_le(1.0), higher_is_better=False)
    clean_f = Row(f"clean restart, {label}: start -> first fetch served", "s", target="< 1 s (for 10 GB)",
                  check=kb_le(1.0), higher_is_better=False)
    shut = Row(f"clean shutdown (SIGTERM -> exit), {label}", "s", target="", higher_is_better=False)
    kill_l = Row(f"restart after kill -9, {label}: start -> listening (Kafka: first answered Metadata)", "s",
                 target="", higher_is_better=False)
    kill_f = Row(f"restart after kill -9, {label}: start -> first fetch served", "s", target="",
                 higher_is_better=False)
    lat_after = Row(f"fetch latency p50, {label} log, after kill -9 recovery", "ms",
                    target="~ before", higher_is_better=False)
    rows = [fill, lat_small, lat_big, lat_big99, shut, clean_l, clean_f, kill_l, kill_f, lat_after]
    kb = KBroker(ctx.base)
    try:
        kb.start()
        kb.create_topics([BIG, SMALL], PARTITIONS)
        values = payloads(MSG, count=32)
        conf = {"batch.size": 256 * 1024}
        c0 = kb.cpu()
        secs, left = clients.produce(kb.bootstrap, clients.partitions_of([BIG]), n_big, values, conf, timeout=600)
        fill.kb.append(n_big * MSG / 1e6 / secs)
        fill.kb_cpu_us.append((kb.cpu() - c0) * 1e6 / n_big)
        if left:
            fill.note = f"{left} undelivered"
        ctx.log(f"  filled {n_big * MSG / 1e9:.2f} GB in {secs:.1f} s")
        clients.produce(kb.bootstrap, clients.partitions_of([SMALL]), n_small, values, conf, timeout=120)
        hw_big, hw_small = high_watermarks(kb.bootstrap, BIG), high_watermarks(kb.bootstrap, SMALL)
        count = 100 if ctx.quick else 300
        cached = page_cache.resident_share(sorted((kb.data_dir / "logs").glob(f"{BIG}-*/*.log")))
        for rep in range(ctx.reps):
            ls = fetch_latencies(kb.bootstrap, SMALL, hw_small, count, rep)
            lb = fetch_latencies(kb.bootstrap, BIG, hw_big, count, rep)
            lat_small.kb.append(pct(ls, 0.5))
            lat_big.kb.append(pct(lb, 0.5))
            lat_big99.kb.append(pct(lb, 0.99))
            lat_big99.note = f"small log p99 {pct(ls, 0.99):.2f} ms"
        ctx.log(f"  fetch p50 small {lat_small.kb} big {lat_big.kb} ms")
        for rep in range(ctx.reps):
            if ctx.out_of_time(f"restart rep {rep + 1}"):
                break
            shut.kb.append(kb.stop_clean())
            t0 = time.monotonic()
            clean_l.kb.append(kb.start(timeout=600))
            clean_f.kb.append(until_first_fetch(kb.bootstrap, t0))
            # appends that were never flushed, then kill -9
            clients.produce(kb.bootstrap, clients.partitions_of([BIG]), 400, values, conf, timeout=60)
            kb.kill9()
            t0 = time.monotonic()
            kill_l.kb.append(kb.start(timeout=600))
            kill_f.kb.append(until_first_fetch(kb.bootstrap, t0))
            ctx.log(f"  restart rep {rep + 1}: shutdown {shut.kb[-1]:.2f} s, clean {clean_l.kb[-1]:.2f}/"
                    f"{clean_f.kb[-1]:.2f} s, kill -9 {kill_l.kb[-1]:.2f}/{kill_f.kb[-1]:.2f} s")
            hw = high_watermarks(kb.bootstrap, BIG)
            if sum(hw) < sum(hw_big):
                kill_f.note += f" rep{rep + 1}: high watermark went back from {sum(hw_big)} to {sum(hw)};"
            hw_big = hw
            lat_after.kb.append(pct(fetch_latencies(kb.bootstrap, BIG, hw_big, count, 100 + rep), 0.5))
        for r in rows:
            r.kb_rss_mb.append(kb.hwm_mb())
        if "tansu" in ctx.extra.get("peers", []):
            clean_f.note += " Tansu: not run (its memory:// storage engine keeps no log to recover);"
        for key in ctx.extra.get("peers", []):
            if key.startswith("kafka") and not ctx.out_of_time(f"restart {key}"):
                try:
                    kafka_restarts(ctx, key, n_big, values, conf, fill, shut, clean_l, clean_f, kill_l, kill_f)
                except Exception as e:  # noqa: BLE001 - Kafka's failure must not lose kbroker's rows
                    first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
                    kill_f.note += f" {key}: failed: {type(e).__name__}: {first};"
                    ctx.log(f"  [{key} restart failed: {type(e).__name__}: {first}]")
        ratio = (lat_big.kb and lat_small.kb) and (sorted(lat_big.kb)[len(lat_big.kb) // 2]
                                                    / sorted(lat_small.kb)[len(lat_small.kb) // 2])
        if ratio:
            lat_big.note = f"{ratio:.2f}x the small log's p50"
            if cached is not None:
                lat_big.note += f"; {100 * cached:.0f}% of the {label} log was in the page cache when the reads began"
            lat_big.check = lambda r, q=ratio: q <= 1.5
    finally:
        kb.stop()
    return rows


def kafka_restarts(ctx: Ctx, key: str, n_big: int, values: list[bytes], conf: dict[str, int], fill: Row, shut: Row,
                   clean_l: Row, clean_f: Row, kill_l: Row, kill_f: Row) -> None:
    """Apache Kafka's figures for the fill and restart rows: the same log, the same clean and kill -9 restarts."""
    t = PEERS[key](ctx)
    assert isinstance(t, KafkaTarget)
    try:
        try:
            t.start()
        except Exception as e:  # noqa: BLE001 - ArtifactUnavailable, or it would not start
            reason = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
            ctx.extra.setdefault("unavailable", {})[t.name] = reason
            ctx.log(f"  [{t.name} unavailable: {reason}]")
            return
        t.create_topics([BIG], PARTITIONS)
        c0 = t.cpu()
        secs, left = clients.produce(t.bootstrap, clients.partitions_of([BIG]), n_big, values, conf, timeout=600)
        fill.add(t, n_big * MSG / 1e6 / secs if not left else float("nan"), (t.cpu() - c0) * 1e6 / n_big)
        if left:
            fill.note += f" {t.name}: {left} undelivered;"
        hw_big = high_watermarks(t.bootstrap, BIG)
        ctx.log(f"  {t.name}: filled {n_big * MSG / 1e9:.2f} GB in {secs:.1f} s")
        for rep in range(ctx.reps):
            if ctx.out_of_time(f"restart {t.name} rep {rep + 1}"):
                break
            t0 = time.monotonic()
            t.peer._terminate(600)  # Kafka alone: its ZooKeeper stays up, as a user's would
            shut.add(t, time.monotonic() - t0)
            t0 = time.monotonic()
            t.start(timeout=600)
            clean_l.add(t, time.monotonic() - t0)
            clean_f.add(t, until_first_fetch(t.bootstrap, t0))
            clients.produce(t.bootstrap, clients.partitions_of([BIG]), 400, values, conf, timeout=60)
            t.peer.kill()
            t0 = time.monotonic()
            attempts = start_supervised(t, t0 + 600)
            kill_l.add(t, time.monotonic() - t0)
            if attempts > 1:
                kill_l.note += f" {t.name} rep{rep + 1}: {attempts} starts (NodeExists until the session expired);"
            kill_f.add(t, until_first_fetch(t.bootstrap, t0))
            ctx.log(f"  {t.name} restart rep {rep + 1}: shutdown {shut.others[t.name][-1]:.2f} s, clean "
                    f"{clean_l.others[t.name][-1]:.2f}/{clean_f.others[t.name][-1]:.2f} s, kill -9 "
                    f"{kill_l.others[t.name][-1]:.2f}/{kill_f.others[t.name][-1]:.2f} s")
            hw = high_watermarks(t.bootstrap, BIG)
            if sum(hw) < sum(hw_big):
                kill_f.note += f" {t.name} rep{rep + 1}: high watermark went back from {sum(hw_big)} to {sum(hw)};"
            hw_big = hw
        for r in (fill, shut, clean_l, clean_f, kill_l, kill_f):
            r.add_rss(t)
    finally:
        t.stop()


def start_supervised(t: KafkaTarget, deadline: float) -> int:
    """Start Kafka again and again while it exits at start-up because its killed predecessor's ZooKeeper registration
    is still there; returns the number of starts."""
    attempts = 0
    while True:
        attempts += 1
        try:
            t.start(timeout=max(1.0, deadline - time.monotonic()))
            return attempts
        except RuntimeError as e:
            if "NodeExists" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)

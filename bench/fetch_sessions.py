"""Workload fetch_sessions: KIP-227 fetch sessions over 1,000 partitions (250 topics x 4, as in scale).

(a) The official Java client (kafka-clients 3.9, which uses incremental fetch sessions) reads 1M x 100 B messages
    spread over the 1,000 partitions: msg/s and broker CPU per message. kbroker's fetch-session gauges (metrics
    port) and the client's FetchSessionHandler log (DEBUG) show that it used one session: one full fetch of the
    1,000 partitions, then incremental fetches in that session.
(b) Idle CPU: 100 consumers in one group (round-robin: 10 partitions each) long-poll the 1,000 partitions with no
    traffic (fetch wait 500 ms, the clients' default); broker CPU seconds per second over a window once the group
    is stable, with kbroker's request rates and session gauges. Two rows: confluent-kafka consumers (librdkafka
    has no fetch sessions: every Fetch names the consumer's 10 partitions), kbroker vs the mock; and Java
    consumers (one session each: 100 sessions holding the 1,000 partitions), kbroker only.

librdkafka's mock serves neither the Java client (see JAVA_ON_PEER) nor kafka-python's group members (JoinGroup
answered with INVALID_REQUEST), hence confluent-kafka for the comparison. The --peers (Apache Kafka, Tansu) get
every row: the same topics, loaded the same way, and both clients; their broker CPU is their process's CPU-time
clock, as kbroker's, and each idle row's note gives every broker's CPU per Fetch the clients sent.
bench/FetchSessionBench.java is compiled with javac once per run against the jars tests/java uses (found by
tests/java/test_java_client.find_jar_dir), with the SLF4J stderr binding from tests/java. --quick: 100k messages,
20 consumers, a 5 s window. The idle rows run at most 2 repetitions (each ~30 s per broker and client).
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any

from bench import clients
from bench.harness import (
    ROOT,
    Ctx,
    KBroker,
    Peer,
    Row,
    Target,
    all_of,
    cpu_le,
    free_port,
    payloads,
    reap,
    spawn,
    start_peers,
    watermarks,
)
from bench.scale import NPART_TOPICS

JAVA_SOURCE = ROOT / "bench" / "FetchSessionBench.java"
FSH_LOGGER = "org.apache.kafka.clients.FetchSessionHandler"
EXTRA_PROPS: tuple[str, ...] = tuple(os.environ.get("KBROKER_BENCH_JAVA_PROPS", "").split())


# ---------------------------------------------------------------------------------------------------- Java


def java_classpath(ctx: Ctx) -> str:
    """javac once per run (cached in ctx.extra); raises RuntimeError with the reason when Java is unavailable."""
    if "java_classpath" in ctx.extra:
        return str(ctx.extra["java_classpath"])
    if shutil.which("javac") is None or shutil.which("java") is None:
        raise RuntimeError("javac/java not on PATH")
    from tests.java.test_java_client import JARS, SOURCES, find_jar_dir

    jar_dir = find_jar_dir()
    if jar_dir is None:
        raise RuntimeError("kafka-clients jars not found (pip install the `test` extra)")
    jars = [str(jar_dir / f"{j}.jar") for j in JARS]
    binding = [s for s in SOURCES if s.name == "StaticLoggerBinder.java"]
    out = ctx.base / "java-classes"
    out.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["javac", "-d", str(out), "-cp", os.pathsep.join(jars), str(JAVA_SOURCE), *map(str, binding)],
                       capture_output=True, text=True, timeout=180)
    if r.returncode != 0:
        raise RuntimeError(f"javac failed:\n{r.stdout}\n{r.stderr}")
    cp = os.pathsep.join([str(out), *jars])
    ctx.extra["java_classpath"] = cp
    return cp


class Driver:
    """A client process speaking the line protocol of FetchSessionBench.java: stdout lines into a queue, stdin
    lines on request, stderr to a file."""

    def __init__(self, cmd: list[str], stderr: Path) -> None:
        self.stderr_path = stderr
        with open(stderr, "wb") as err:
            self.proc = spawn(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                              bufsize=1)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    @classmethod
    def java(cls, cp: str, args: list[str], stderr: Path, props: tuple[str, ...] = ()) -> Driver:
        return cls(["java", "-Dkcompat.log=WARN", *props, *EXTRA_PROPS, "-cp", cp, "FetchSessionBench", *args],
                   stderr)

    @classmethod
    def confluent(cls, args: list[str], stderr: Path) -> Driver:
        return cls([sys.executable, "-m", "bench.fetch_sessions", *args], stderr)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, prefix: str, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"Java: no {prefix} within {timeout:.0f}s; stderr: {self.stderr()[-2000:]}") from None
            if line is None:
                raise RuntimeError(f"Java exited ({self.proc.wait()}) before {prefix}; stderr: {self.stderr()[-2000:]}")
            if line.startswith(prefix + " ") or line == prefix:
                return line.split()[1:]

    def fresh(self, prefix: str, timeout: float) -> list[str]:
        """The next line with prefix printed after now (older queued lines are dropped)."""
        while True:
            try:
                if self.lines.get_nowait() is None:
                    raise RuntimeError(f"client exited ({self.proc.wait()}); stderr: {self.stderr()[-2000:]}")
            except queue.Empty:
                return self.expect(prefix, timeout)

    def send(self, line: str = "go") -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def finish(self, timeout: float = 30.0) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        reap(self.proc)


def scrape(port: int) -> dict[str, float]:
    """kbroker's /metrics: fetch-session gauges and request counters (as "req:<api name>")."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("kafka_server_fetchsessioncache_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
        elif line.startswith('kafka_network_requestmetrics_requests_total{request="'):
            out["req:" + line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
    return out


SESSIONS = "kafka_server_fetchsessioncache_numincrementalfetchsessions"
CACHED = "kafka_server_fetchsessioncache_numincrementalfetchpartitionscached"
EVICTIONS = "kafka_server_fetchsessioncache_incrementalfetchsessionevictions_total"


# ---------------------------------------------------------------------------------------------------- (a)


def java_consume(ctx: Ctx, cp: str, t: Target, hw: dict[tuple[str, int], int], mport: int | None,
                 tag: str) -> dict[str, Any]:
    """The Java consumer reads every partition from 0 to its high watermark; broker CPU between the go-ahead and
    the last record; the fetch sessions it used, from kbroker's gauges and from its FetchSessionHandler's log."""
    spec = ctx.base / f"java-consume-{tag}.txt"
    spec.write_text("".join(f"{tp} {p} 0 {end}\n" for (tp, p), end in hw.items()))
    j = Driver.java(cp, ["consume", t.bootstrap, str(spec)], ctx.base / f"java-consume-{tag}.err",
                    props=(f"-Dkcompat.log.{FSH_LOGGER}=DEBUG",))
    try:
        j.expect("READY", 120)
        m0 = scrape(mport) if mport else {}
        c0 = t.cpu()
        j.send()
        got, nbytes, secs, want = j.expect("CONSUMED", 360)
        cpu = t.cpu() - c0
        m1 = scrape(mport) if mport else {}  # the consumer is still open: its session too
        j.send("close")
        j.finish()
    finally:
        reap(j.proc)
    # Requests as the client built them, up to the consumer's close (whose session-closing request is not counted).
    built = re.findall(r"Built (full|incremental) fetch \(sessionId=(\w+), epoch=(\w+)\)[^\n]*?(?:with (\d+) "
                       r"partition|\n)", j.stderr().split("to close the existing session")[0])
    full = [b for b in built if b[0] == "full"]
    incremental = [b for b in built if b[0] == "incremental"]
    return {"got": int(got), "want": int(want), "bytes": int(nbytes), "secs": float(secs), "cpu": cpu,
            "m0": m0, "m1": m1, "full": len(full), "first_full_partitions": int(full[0][3] or 0) if full else 0,
            "incremental": len(incremental), "session_ids": sorted({b[1] for b in incremental})}


def idle_consumers(ctx: Ctx, client: str, cp: str, t: Target, topics: list[str], nconsumers: int, window: float,
                   tag: str, mport: int | None,
                   during: Callable[[], AbstractContextManager[Any]] = nullcontext) -> dict[str, Any]:
    """nconsumers consumers of `client` (java or confluent-kafka) join one group on the topics; once every partition
    is assigned evenly and the group has been stable 3 s, the broker's CPU over `window` seconds (inside `during()`:
    bench.idle_poll's profiler)."""
    tf = ctx.base / "idle-topics.txt"
    tf.write_text("".join(f"{x}\n" for x in topics))
    group = f"idle-{tag}-{time.monotonic_ns()}"
    args = [t.bootstrap, str(nconsumers), group, str(tf)]
    err = ctx.base / f"idle-{client}-{tag}.err"
    mb = scrape(mport) if mport else {}  # sessions left by earlier clients
    j = Driver.java(cp, ["idle", *args], err) if client == "java" else Driver.confluent(args, err)
    npart = 4 * len(topics)

    def status(timeout: float, fresh: bool = False) -> list[float]:
        return [float(x) for x in (j.fresh if fresh else j.expect)("STATUS", timeout)]

    try:
        t0 = time.monotonic()
        stable, last = 0, None
        while stable < 3:  # every partition assigned, evenly, and no assignment change for 3 status lines
            try:
                total, lo, hi, _f, changes, *_ = status(max(1.0, 240 - (time.monotonic() - t0)))
            except RuntimeError as e:
                if time.monotonic() - t0 < 239:
                    raise
                raise RuntimeError(f"the group did not settle within 240 s (last: {last}); {e}") from None
            key = (total, lo, hi, changes)
            ok = total == npart and hi - lo <= 1 and lo > 0
            stable = stable + 1 if ok and key == last else 0
            last = key
        join_s = time.monotonic() - t0
        time.sleep(2.0)  # the first (full) fetches of the last assignment, which create the sessions, are over
        s0 = status(10, fresh=True)
        ts0 = time.monotonic()
        m0 = scrape(mport) if mport else {}
        with during():
            c0, w0 = t.cpu(), time.monotonic()
            time.sleep(window)
            c1, w1 = t.cpu(), time.monotonic()
        m1 = scrape(mport) if mport else {}
        s1 = status(10, fresh=True)
        ts1 = time.monotonic()
        j.send("stop")
        j.finish(60)
    finally:
        reap(j.proc)
    secs = w1 - w0
    return {"cpu_per_s": (c1 - c0) / secs, "secs": secs, "join_s": join_s, "client_fetch_per_s": (s1[3] - s0[3]) / (ts1 - ts0),
            "sessions": m1.get(SESSIONS, 0) - mb.get(SESSIONS, 0), "cached": m1.get(CACHED, 0) - mb.get(CACHED, 0),
            "evicted": m1.get(EVICTIONS, 0) - mb.get(EVICTIONS, 0),
            "rebalanced": s1[4] != s0[4], "rates": {k[4:]: (m1[k] - m0.get(k, 0)) / secs for k in m1 if k.startswith("req:")}}


# ---------------------------------------------------------------------------------------------------- run

# librdkafka's mock answers the Java client's ApiVersions v4 with an error response (UNSUPPORTED_VERSION) that the
# client decodes with a throttle time of 1,179,648 ms, so the client never sends it another request (Metadata
# times out). Checked with kafka-clients 3.9.1 and the confluent-kafka 2.16 mock.
JAVA_ON_PEER = False
PEER_NO_JAVA = ("the C mock cannot serve the Java client (its ApiVersions v4 error answer decodes as a 1,179,648 ms "
                "throttle; Metadata then times out): kbroker only")


def _peer_guard(ctx: Ctx, row: Row, t: Target, is_peer: bool, rep: int,
                fn: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    """fn(); for an Apache Kafka or Tansu peer, a failure (a group that never settles, a client that gives up) is a
    '-' cell with a note instead of the loss of every row."""
    if not is_peer:
        return fn()
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        row.add(t, float("nan"))
        row.note += f" {t.name} rep{rep + 1}: failed: {first};"
        ctx.log(f"  [{row.workload[:40]}... {t.name} rep {rep + 1} failed: {first}]")
        return None


def run(ctx: Ctx) -> list[Row]:
    n = ctx.n(1_000_000, 100_000)
    nconsumers = 20 if ctx.quick else 100
    window = 5.0 if ctx.quick else 15.0
    idle_reps = min(ctx.reps, 2)
    sessions_ok: list[bool] = []
    jrow = Row("consume 100 B from 1,000 partitions, Java client (kafka-clients 3.9, incremental fetch session)",
               "msg/s", target="CPU <= 0.1 us/msg (as confluent-kafka's row); one fetch session",
               check=all_of(cpu_le(0.1), lambda r: (all(sessions_ok) if sessions_ok else None)))
    krow = Row(f"idle CPU, {nconsumers} confluent-kafka consumers in one group long-polling the 1,000 partitions "
               f"(fetch.wait.max.ms 500; librdkafka has no fetch sessions; CPU column: us per Fetch sent)", "% of a core", target="kbroker <= peer",
               check=lambda r: None if r.ratio() is None else r.ratio() <= 1.0, higher_is_better=False)
    irow = Row(f"idle CPU, {nconsumers} Java consumers in one group long-polling the 1,000 partitions "
               f"(fetch.max.wait.ms 500; CPU column: us per Fetch sent)", "% of a core", target="report", higher_is_better=False)
    rows = [jrow, krow, irow]
    try:
        cp = java_classpath(ctx)
    except (RuntimeError, ImportError) as e:
        cp = ""
        for r in (jrow, irow):
            r.note = f"skipped: {e}"
        ctx.log(f"  [Java rows skipped: {e}]")
    if not JAVA_ON_PEER:
        for r in (jrow, irow):
            r.note += f" {PEER_NO_JAVA};"

    values = payloads(100)
    topics = [f"big_{k}" for k in range(NPART_TOPICS)]
    tps = clients.partitions_of(topics)
    mport = free_port()
    kb, peer = KBroker(ctx.base, {"metrics.port": str(mport)}), Peer()
    hw: dict[str, dict[tuple[str, int], int]] = {}
    others: list[Target] = []
    try:
        kb.start()
        peer.start()
        others = start_peers(ctx)
        for t in (kb, peer, *others):
            t.create_topics(topics)
            secs, _left = clients.produce(t.bootstrap, tps, n, values, {}, timeout=180)
            hw[t.name] = watermarks(t.bootstrap, topics)
            loaded = sum(hw[t.name].values())
            ctx.log(f"  {t.name}: loaded {loaded:,} messages over {len(tps)} partitions in {secs:.1f} s")
            if loaded != n:
                jrow.note += f" {t.name}: {loaded} of {n} loaded;"
        java_targets = [kb, peer, *others] if JAVA_ON_PEER else [kb, *others]
        for rep in range(ctx.reps if cp else 0):
            if ctx.out_of_time(f"fetch_sessions Java consume rep {rep + 1}"):
                break
            for t in java_targets:
                r = _peer_guard(ctx, jrow, t, t in others, rep,
                                partial(java_consume, ctx, cp, t, hw[t.name], mport if t is kb else None,
                                        f"{t.name}-{rep}"))
                if r is None:
                    continue
                ok = r["got"] >= r["want"] == n
                jrow.add(t, r["got"] / r["secs"] if ok else float("nan"), r["cpu"] * 1e6 / max(r["got"], 1))
                if not ok:
                    jrow.note += f" {t.name} rep{rep + 1}: read {r['got']} of {r['want']};"
                sess = f"{r['full']} full + {r['incremental']} incremental fetch requests"
                if t is kb:
                    d_sess = r["m1"].get(SESSIONS, 0) - r["m0"].get(SESSIONS, 0)
                    evicted = r["m1"].get(EVICTIONS, 0) - r["m0"].get(EVICTIONS, 0)
                    one = d_sess == 1 and r["full"] == 1 and len(r["session_ids"]) == 1 and not evicted
                    sessions_ok.append(one)
                    sess = (f"kbroker gauge +{d_sess:.0f} session ({evicted:.0f} evicted); client: {sess}, the "
                            f"full one with {r['first_full_partitions']} partitions, session id(s) "
                            f"{', '.join(r['session_ids']) or '-'}")
                    if rep == 0:
                        jrow.note += f" kbroker rep1: {sess};"
                ctx.log(f"  Java consume rep {rep + 1} {t.name}: {r['got'] / r['secs']:,.0f} msg/s "
                        f"({r['got']:,} in {r['secs']:.2f} s), CPU {r['cpu'] * 1e6 / max(r['got'], 1):.3f} us/msg; "
                        f"{sess}")
        for t in (kb, *others):
            jrow.add_rss(t)

        for rep in range(idle_reps):
            if ctx.out_of_time(f"fetch_sessions idle rep {rep + 1}"):
                break
            runs = [("confluent-kafka", kb, krow), ("confluent-kafka", peer, krow)]
            runs += [("confluent-kafka", t, krow) for t in others]
            if cp:
                runs += [("java", t, irow) for t in (kb, *others)]
            for client, t, row in runs:
                r = _peer_guard(ctx, row, t, t in others, rep,
                                partial(idle_consumers, ctx, client, cp, t, topics, nconsumers, window,
                                        f"{t.name}-{rep}", mport if t is kb else None))
                if r is None:
                    continue
                fetch_s = r["client_fetch_per_s"]
                row.add(t, 100.0 * r["cpu_per_s"], r["cpu_per_s"] * 1e6 / fetch_s if fetch_s > 0 else None)
                extra = f"clients sent {fetch_s:.0f} Fetch/s, {r['cpu_per_s'] * 1e6 / max(fetch_s, 1e-9):.0f} us"
                if t is kb:
                    rates = ", ".join(f"{v:.0f} {k}" for k, v in sorted(r["rates"].items(), key=lambda kv: -kv[1])
                                      if v >= 0.05)
                    extra = (f"{r['sessions']:.0f} fetch sessions opened by these consumers holding {r['cached']:.0f} "
                             f"partitions, {r['evicted']:.0f} evicted; kbroker answered {rates} requests/s; {extra}")
                extra += " broker CPU per Fetch"
                if r["rebalanced"]:
                    extra += "; the group REBALANCED during the window"
                if rep == 0:
                    row.note += f" {t.name} rep1: {extra};"
                ctx.log(f"  idle rep {rep + 1} {client} {t.name}: {100 * r['cpu_per_s']:.2f}% of a core over "
                        f"{r['secs']:.1f} s ({nconsumers} consumers stable after {r['join_s']:.1f} s); {extra}")
            for t in (kb, *others):
                krow.add_rss(t)
        irow.kb_rss_mb = list(krow.kb_rss_mb)
        irow.others_rss_mb = {k: list(v) for k, v in krow.others_rss_mb.items()}
        for row in (krow, irow):
            row.note += f" CPU over {window:.0f} s once every partition is assigned and the group is stable;"
    finally:
        kb.stop()
        peer.stop()
        for t in others:
            t.stop()
    for r in rows:
        r.note = r.note.strip()
    return rows


# ---------------------------------------------------------------------------------------------------- confluent-kafka


def confluent_idle(bootstrap: str, n: int, group: str, topics_file: str) -> None:
    """The `idle` mode of FetchSessionBench.java with confluent-kafka consumers, for the comparison with the mock
    peer, which serves neither the Java client nor kafka-python's group members (JoinGroup answered with
    INVALID_REQUEST): n consumers in one group (roundrobin), a thread each; every second `STATUS <assigned total>
    <min> <max> <Fetch requests sent, from librdkafka's statistics> <assignment changes>`; stops on a stdin line.
    librdkafka does not use fetch sessions: each Fetch names the consumer's partitions in full."""
    import json

    from confluent_kafka import Consumer

    topics = [x.strip() for x in Path(topics_file).read_text().splitlines() if x.strip()]
    assigned, changes, fetches = [0] * n, [0] * n, [0] * n
    stop = threading.Event()

    def member(k: int) -> None:
        def stats(js: str) -> None:
            fetches[k] = sum(b.get("req", {}).get("Fetch", 0) for b in json.loads(js).get("brokers", {}).values())

        c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": f"{group}-{k}",
                      "enable.auto.commit": False, "partition.assignment.strategy": "roundrobin", "log_level": 3,
                      "statistics.interval.ms": 1000, "stats_cb": stats})
        c.subscribe(topics)
        last: list[Any] = []
        while not stop.is_set():
            c.poll(1.0)
            now = c.assignment()
            if now != last:
                changes[k] += 1
                last = now
            assigned[k] = len(now)
        c.close()

    threads = [threading.Thread(target=member, args=(k,), daemon=True) for k in range(n)]
    for t in threads:
        t.start()

    def status() -> None:
        while not stop.is_set():
            print(f"STATUS {sum(assigned)} {min(assigned)} {max(assigned)} {sum(fetches)} {sum(changes)}", flush=True)
            time.sleep(1.0)

    threading.Thread(target=status, daemon=True).start()
    sys.stdin.readline()
    stop.set()
    for t in threads:
        t.join(30)


if __name__ == "__main__":
    confluent_idle(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])

"""Broker processes (kbroker, the librdkafka mock, Apache Kafka and Tansu peers), /proc measurements, cleanup,
result rows."""

from __future__ import annotations

import ctypes
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PEER_DIR = Path(os.environ.get("KBROKER_BENCH_PEERS", ROOT.parent / "shared" / "bench-peers"))
PEER_SCRIPT = PEER_DIR / "librdkafka_mock_broker.py"
CLK_TCK = os.sysconf("SC_CLK_TCK")

# ---------------------------------------------------------------------------------------------------- cleanup

_children: list[subprocess.Popen[Any]] = []
_dirs: list[Path] = []
_lock = threading.Lock()


def _pdeathsig() -> None:
    """In the child: die with SIGKILL when the benchmark process dies (even if it is itself SIGKILLed)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def spawn(args: list[str], **kw: Any) -> subprocess.Popen[Any]:
    proc = subprocess.Popen(args, preexec_fn=_pdeathsig, **kw)
    with _lock:
        _children.append(proc)
    return proc


def reap(proc: subprocess.Popen[Any], sig: int = signal.SIGKILL, timeout: float = 10.0) -> None:
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        except ProcessLookupError:
            pass
    with _lock:
        if proc in _children:
            _children.remove(proc)


def _kill_children() -> None:
    with _lock:
        procs = list(_children)
    for p in procs:
        try:
            reap(p, signal.SIGKILL, 5)
        except Exception:  # noqa: BLE001
            pass


def cleanup_all() -> None:
    """Kill every process this benchmark started and remove its data directories."""
    _kill_children()
    for d in reversed(list(_dirs)):
        shutil.rmtree(d, ignore_errors=True)
        _dirs.remove(d)


def cleanup_children() -> None:
    """Between workloads: kill leftover processes and remove broker data directories (not the base dir)."""
    _kill_children()
    for d in list(_dirs[1:]):
        shutil.rmtree(d, ignore_errors=True)
        _dirs.remove(d)


def install_signal_handlers() -> None:
    def on_term(signum: int, _frame: Any) -> None:
        cleanup_all()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)


def workdir(base: Path, name: str) -> Path:
    base.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base))
    _dirs.append(d)
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------------- /proc


def cpu_seconds(pid: int) -> float:
    """CPU time of the whole process (all its threads, live and exited), seconds, in nanoseconds: Linux's
    per-process CPU-time clock (clock_getcpuclockid's id, CPUCLOCK_SCHED), where /proc/PID/stat counts 10 ms
    ticks, as coarse as the ~100 ms some rows measure. /proc when the clock is not there (another kernel)."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2) / 1e9
    except OSError:
        return sum(user_system_seconds(pid))


def user_system_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process from /proc/PID/stat, in 10 ms ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def mem_mb(pid: int, key: str = "VmHWM") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def machine_info() -> dict[str, str]:
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    return {
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "ram": f"{mem_kb / 1024 / 1024:.1f} GiB",
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "python": sys.version.split()[0],
        "record_walk": _record_walk_kind(),
    }


def _record_walk_kind() -> str:
    # Produce walks every record and every request goes through the codec; without the C accelerators each record
    # costs ~1 us more and each request tens of us, which skews broker CPU.
    from kbroker.protocol import codec, record_walk

    if codec.COMPILED and record_walk.COMPILED:
        return "compiled"
    return f"codec {codec.IMPLEMENTATION}, record walk {record_walk.IMPLEMENTATION}"


# ---------------------------------------------------------------------------------------------------- targets


class Target:
    """A broker under test. `name` is 'kbroker' or 'peer'."""

    name = "?"
    proc: subprocess.Popen[Any] | None = None
    bootstrap = ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def hwm_mb(self) -> float:
        return mem_mb(self.pid, "VmHWM")

    def rss_mb(self) -> float:
        return mem_mb(self.pid, "VmRSS")

    def create_topics(self, names: list[str], partitions: int = 4, configs: dict[str, str] | None = None) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        if self.proc is not None:
            reap(self.proc, signal.SIGKILL)
            self.proc = None

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class KBroker(Target):
    name = "kbroker"

    instances: list[KBroker] = []

    def __init__(self, base: Path, overrides: dict[str, str] | None = None) -> None:
        KBroker.instances.append(self)
        self.data_dir = workdir(base, "kbroker")
        self.port = free_port()
        self.overrides = {
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "log.dirs": str(self.data_dir / "logs"),
            "group.initial.rebalance.delay.ms": "0",
            **(overrides or {}),
        }
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log_path = self.data_dir / "broker.log"

    def start(self, timeout: float = 120.0) -> float:
        """Start and wait until the port accepts connections; returns the seconds that took."""
        args = [sys.executable, "-m", "kbroker.broker", str(ROOT / "configs" / "server.properties")]
        for k, v in self.overrides.items():
            args += ["--override", f"{k}={v}"]
        logf = open(self.log_path, "ab")
        t0 = time.monotonic()
        self.proc = spawn(args, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT)
        logf.close()
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kbroker exited with {self.proc.returncode}:\n{self.read_log()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return time.monotonic() - t0
            except OSError:
                time.sleep(0.005)
        self.stop()
        raise RuntimeError(f"kbroker did not listen within {timeout}s:\n{self.read_log()[-3000:]}")

    def read_log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop_clean(self, timeout: float = 120.0) -> float:
        """SIGTERM and wait for exit (clean shutdown); returns seconds."""
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        finally:
            reap(self.proc)
            self.proc = None
        return time.monotonic() - t0

    def kill9(self) -> None:
        assert self.proc is not None
        reap(self.proc, signal.SIGKILL)
        self.proc = None

    def create_topics(self, names: list[str], partitions: int = 4, configs: dict[str, str] | None = None) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 3})
        for i in range(0, len(names), 500):
            chunk = names[i : i + 500]
            fs = admin.create_topics(
                [NewTopic(n, partitions, 1, config=dict(configs or {})) for n in chunk], request_timeout=60
            )
            for f in fs.values():
                try:
                    f.result(60)
                except Exception as e:  # noqa: BLE001 - a lost answer: the metadata check below decides
                    if "TOPIC_ALREADY_EXISTS" not in str(e):
                        print(f"  [kbroker create_topics: {type(e).__name__}: {e}; checking metadata]", flush=True)
        wait_metadata(self.bootstrap, names, partitions)


class Peer(Target):
    """librdkafka's mock cluster in its own process (in-memory, ~5 MiB kept per partition)."""

    name = "peer"

    def __init__(self, prefix: str = "warm", ntopics: int = 1) -> None:
        self.prefix, self.ntopics = prefix, ntopics

    def start(self, timeout: float = 60.0) -> float:
        t0 = time.monotonic()
        self.proc = spawn(
            [sys.executable, str(PEER_SCRIPT), self.prefix, str(self.ntopics)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout)
        if not line or not line[0].startswith("READY"):
            self.stop()
            raise RuntimeError(f"peer did not become ready: {line!r}")
        self.bootstrap = line[0].split()[1]
        return time.monotonic() - t0

    def create_topics(self, names: list[str], partitions: int = 4, configs: dict[str, str] | None = None) -> None:
        # The mock auto-creates topics (4 partitions) on a Metadata request; it cannot CreateTopics.
        if partitions != 4:
            raise ValueError("the mock peer only creates 4-partition topics")
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 3})
        for n in names:
            admin.list_topics(n, timeout=10)
        wait_metadata(self.bootstrap, names, partitions)


class KafkaTarget(Target):
    """Apache Kafka (bench.peers.kafka): 3.x on its own ZooKeeper, 4.x as a KRaft combined node; data on disk."""

    def __init__(self, base: Path, version: str, heap: str = "1g", **kw: Any) -> None:
        """`kw` goes to KafkaPeer (zookeeper=, broker_id=, overrides=: a node of a cluster)."""
        from bench.peers.kafka import KafkaPeer

        self.peer = KafkaPeer(version, base=workdir(base, f"kafka-{version}"), heap=heap, **kw)
        self.name = f"Kafka {self.peer.version}"

    def start(self, timeout: float = 180.0) -> float:
        """Start and wait for an answered Metadata request naming a controller; returns the seconds that took."""
        self.peer.start(timeout)
        self.proc, self.bootstrap = self.peer.proc, self.peer.bootstrap
        with _lock:  # killed with the others when the benchmark is interrupted
            _children.append(self.peer.proc)  # type: ignore[arg-type]
            if self.peer._zk is not None and self.peer._zk.proc is not None:
                _children.append(self.peer._zk.proc)
        return float(self.peer.started_in or 0.0)

    def stop(self) -> None:
        self.peer.stop()
        self.proc = None

    def create_topics(self, names: list[str], partitions: int = 4, configs: dict[str, str] | None = None) -> None:
        admin_create_topics(self.name, self.bootstrap, names, partitions, configs)


class TansuTarget(Target):
    """Tansu (bench.peers.tansu) with its in-memory storage engine."""

    def __init__(self, base: Path) -> None:
        from bench.peers.tansu import VERSION, TansuPeer

        self.peer = TansuPeer(base=workdir(base, "tansu"))
        self.name = f"Tansu {VERSION}"

    def start(self, timeout: float = 60.0) -> float:
        self.peer.start(timeout)
        self.proc, self.bootstrap = self.peer.proc, self.peer.bootstrap
        with _lock:
            _children.append(self.peer.proc)  # type: ignore[arg-type]
        return float(self.peer.started_in or 0.0)

    def stop(self) -> None:
        self.peer.stop()
        self.proc = None

    def create_topics(self, names: list[str], partitions: int = 4, configs: dict[str, str] | None = None) -> None:
        admin_create_topics(self.name, self.bootstrap, names, partitions, configs)


# --peers names -> what they start; the mock ("peer") is always there, as before.
PEERS = {"kafka3.9": lambda ctx: KafkaTarget(ctx.base, "3.9", ctx.extra.get("kafka_heap", "1g")),
         "kafka4": lambda ctx: KafkaTarget(ctx.base, "4", ctx.extra.get("kafka_heap", "1g")),
         "tansu": lambda ctx: TansuTarget(ctx.base)}


def start_peers(ctx: Ctx) -> list[Target]:
    """The Apache Kafka and Tansu peers chosen with --peers, started; one that cannot run is logged and noted
    (ctx.extra["unavailable"]) and left out, so the workload runs with the others."""
    return [t for key in ctx.extra.get("peers", []) if (t := start_peer(ctx, key)) is not None]


def start_peer(ctx: Ctx, key: str, configure: Callable[[Target], None] | None = None,
               label: str = "") -> Target | None:
    """One --peers broker, started after `configure` (e.g. server.properties overrides) was applied to it; None,
    logged and noted under its name plus `label`, when it cannot run (or `configure` refuses it)."""
    try:
        t = PEERS[key](ctx)
    except Exception as e:  # noqa: BLE001
        ctx.extra.setdefault("unavailable", {})[key + label] = f"{type(e).__name__}: {e}"
        return None
    try:
        if configure is not None:
            configure(t)
        secs = t.start()
        ctx.log(f"  [{t.name}{label} up in {secs:.1f} s on {t.bootstrap}]")
        return t
    except Exception as e:  # noqa: BLE001 - ArtifactUnavailable, or the broker would not start
        t.stop()
        reason = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        ctx.extra.setdefault("unavailable", {})[t.name + label] = reason
        ctx.log(f"  [{t.name}{label} unavailable: {reason}]")
        return None


def admin_create_topics(label: str, bootstrap: str, names: list[str], partitions: int,
                        configs: dict[str, str] | None) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    for i in range(0, len(names), 500):
        chunk = names[i : i + 500]
        fs = admin.create_topics(
            [NewTopic(n, partitions, 1, config=dict(configs or {})) for n in chunk], request_timeout=60
        )
        for f in fs.values():
            try:
                f.result(60)
            except Exception as e:  # noqa: BLE001 - a lost answer: the metadata check below decides
                if "TOPIC_ALREADY_EXISTS" not in str(e):
                    print(f"  [{label} create_topics: {type(e).__name__}: {e}; checking metadata]", flush=True)
    wait_metadata(bootstrap, names, partitions)


def wait_metadata(bootstrap: str, names: list[str], partitions: int, timeout: float = 60.0) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3, "allow.auto.create.topics": False})
    deadline = time.monotonic() + timeout
    want = set(names)
    while True:
        md = admin.list_topics(timeout=10)
        ok = {t for t in want if t in md.topics and len(md.topics[t].partitions) == partitions
              and md.topics[t].error is None}
        if ok == want:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"topics missing after {timeout}s: {sorted(want - ok)[:5]}")
        time.sleep(0.1)


def watermarks(bootstrap: str, topics: list[str], partitions: int = 4) -> dict[tuple[str, int], int]:
    """High watermark of every partition."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-wm", "log_level": 3})
    try:
        return {(t, p): c.get_watermark_offsets(TopicPartition(t, p), timeout=10)[1]
                for t in topics for p in range(partitions)}
    finally:
        c.close()


def watermark_total(bootstrap: str, topics: list[str], partitions: int = 4) -> int:
    """Sum of high watermarks: the number of messages the broker acknowledged (fresh topics start at 0)."""
    return sum(watermarks(bootstrap, topics, partitions).values())


def save_logs(dest: Path) -> list[str]:
    """Copy the logs of every kbroker started so far (for a failed workload); returns the paths."""
    out = []
    dest.mkdir(parents=True, exist_ok=True)
    for i, kb in enumerate(KBroker.instances):
        if kb.log_path.exists():
            target = dest / f"kbroker-{i}.log"
            shutil.copyfile(kb.log_path, target)
            out.append(str(target))
    KBroker.instances.clear()
    return out


# ---------------------------------------------------------------------------------------------------- results


def fmt(x: float | None, digits: int = 3) -> str:
    if x is None or x != x:
        return "-"
    ax = abs(x)
    if ax >= 1e6:
        return f"{x / 1e6:.{max(digits - 1, 1)}f}M"
    if ax >= 1e4:
        return f"{x / 1e3:.0f}k"
    if ax >= 1000:
        return f"{x:.0f}"
    if ax >= 100:
        return f"{x:.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def med(xs: list[float]) -> float | None:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else None


def spread(xs: list[float]) -> str:
    xs = [x for x in xs if x == x]
    if not xs:
        return "-"
    m = fmt(statistics.median(xs))
    if len(xs) == 1:
        return m
    return f"{m} ({fmt(min(xs))}-{fmt(max(xs))})"


@dataclass
class Row:
    workload: str
    metric: str  # unit of kb/peer, e.g. "msg/s", "MB/s", "ms"
    kb: list[float] = field(default_factory=list)
    peer: list[float] = field(default_factory=list)
    kb_cpu_us: list[float] = field(default_factory=list)  # kbroker CPU microseconds per message
    peer_cpu_us: list[float] = field(default_factory=list)
    kb_rss_mb: list[float] = field(default_factory=list)  # kbroker peak RSS (VmHWM) during the workload
    # Apache Kafka and Tansu, by target name ("Kafka 3.9.2", "Kafka 4.4.0", "Tansu 0.6.0"), in the same run.
    others: dict[str, list[float]] = field(default_factory=dict)
    others_cpu_us: dict[str, list[float]] = field(default_factory=dict)
    others_rss_mb: dict[str, list[float]] = field(default_factory=dict)
    target: str = ""
    check: Callable[[Row], bool | None] | None = None
    note: str = ""
    higher_is_better: bool = True

    def add(self, t: Target, value: float, cpu_us: float | None = None) -> None:
        """One repetition's figure (and broker CPU per message) for target t, whichever broker it is."""
        if t.name == "kbroker":
            self.kb.append(value)
            if cpu_us is not None:
                self.kb_cpu_us.append(cpu_us)
        elif t.name == "peer":
            self.peer.append(value)
            if cpu_us is not None:
                self.peer_cpu_us.append(cpu_us)
        else:
            self.others.setdefault(t.name, []).append(value)
            if cpu_us is not None:
                self.others_cpu_us.setdefault(t.name, []).append(cpu_us)

    def add_rss(self, t: Target) -> None:
        try:
            hwm = t.hwm_mb()
        except OSError:
            return
        if t.name == "kbroker":
            self.kb_rss_mb.append(hwm)
        elif t.name != "peer":
            self.others_rss_mb.setdefault(t.name, []).append(hwm)

    def ratio_to(self, name: str) -> float | None:
        """kbroker's median over peer `name`'s."""
        a, b = med(self.kb), med(self.others.get(name, []))
        if a is None or b is None or b == 0:
            return None
        return a / b

    def ratio(self) -> float | None:
        a, b = med(self.kb), med(self.peer)
        if a is None or b is None or b == 0:
            return None
        return a / b

    def verdict(self) -> str:
        if self.check is None:
            return ""
        try:
            ok = self.check(self)
        except Exception:  # noqa: BLE001
            ok = None
        return {True: "PASS", False: "FAIL", None: "?"}[ok]


def cpu_le(limit: float) -> Callable[[Row], bool | None]:
    def chk(r: Row) -> bool | None:
        m = med(r.kb_cpu_us)
        return None if m is None else m <= limit

    return chk


def all_of(*checks: Callable[[Row], bool | None]) -> Callable[[Row], bool | None]:
    def chk(r: Row) -> bool | None:
        res = [c(r) for c in checks]
        if any(x is False for x in res):
            return False
        if any(x is None for x in res):
            return None
        return True

    return chk


def ratio_ge(x: float) -> Callable[[Row], bool | None]:
    def chk(r: Row) -> bool | None:
        q = r.ratio()
        return None if q is None else q >= x

    return chk


def kb_ge(x: float) -> Callable[[Row], bool | None]:
    def chk(r: Row) -> bool | None:
        m = med(r.kb)
        return None if m is None else m >= x

    return chk


def kb_le(x: float) -> Callable[[Row], bool | None]:
    def chk(r: Row) -> bool | None:
        m = med(r.kb)
        return None if m is None else m <= x

    return chk


@dataclass
class Ctx:
    """Settings shared by all workloads."""

    base: Path
    reps: int
    quick: bool
    scale: float  # multiplies message counts
    profile: bool
    profiles: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (py-spy raw, perf data)
    deadline: float = float("inf")  # monotonic time after which workloads skip what remains
    log: Callable[[str], None] = print
    skipped: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def n(self, full: int, quick: int) -> int:
        return max(1, int((quick if self.quick else full) * self.scale))

    def out_of_time(self, what: str) -> bool:
        if time.monotonic() > self.deadline:
            self.skipped.append(what)
            self.log(f"  [time budget exhausted: skipping {what}]")
            return True
        return False


def payloads(size: int, count: int = 256, seed: int = 7) -> list[bytes]:
    """Message values that compress roughly like text/JSON (about 2-3x with lz4), not all-zero or random."""
    rnd = random.Random(seed)
    words = [bytes(rnd.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(2, 9))) for _ in range(500)]
    out = []
    for _ in range(count):
        buf = bytearray()
        while len(buf) < size:
            buf += b'{"k":"' + rnd.choice(words) + b'","v":' + str(rnd.randint(0, 99999)).encode() + b"},"
        out.append(bytes(buf[:size]))
    return out


class PySpy:
    """`py-spy record --gil -f raw` attached to a pid for the duration of a `with` block.

    --gil: only the thread holding the GIL is sampled. kbroker's threads run uvloop, whose epoll wait py-spy
    cannot tell from work (it shows as self time of Processor.run), so GIL samples are the honest measure of
    where the broker's Python time goes."""

    def __init__(self, pid: int, out: Path, rate: int = 1000) -> None:
        self.pid, self.out, self.rate = pid, out, rate
        self.proc: subprocess.Popen[Any] | None = None

    def __enter__(self) -> PySpy:
        exe = shutil.which("py-spy")
        if exe is None:
            return self
        self.proc = spawn(
            [exe, "record", "--gil", "-f", "raw", "-r", str(self.rate), "-o", str(self.out), "--pid", str(self.pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)  # let it attach
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None:
            reap(self.proc, signal.SIGINT, 30)  # SIGINT: py-spy writes its output and exits


class Perf:
    """`perf record -F 999 -g` of a pid (native + kernel: what py-spy cannot see), if perf is installed."""

    def __init__(self, pid: int, out: Path) -> None:
        self.pid, self.out = pid, out
        self.proc: subprocess.Popen[Any] | None = None

    def __enter__(self) -> Perf:
        exe = shutil.which("perf")
        if exe is not None:
            self.proc = spawn([exe, "record", "-F", "999", "-g", "-o", str(self.out), "-p", str(self.pid)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.5)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None:
            reap(self.proc, signal.SIGINT, 60)


def profile(ctx: Ctx, pid: int, name: str, slug: str, fn: Callable[[], Any], passes: int = 2) -> None:
    """Run fn `passes` times under perf, then `passes` times under py-spy (not both at once: py-spy's blocking
    sampler stops the process, which perf would record as scheduler time). ctx.profiles[name] = (py-spy, perf)."""
    spy, perf = ctx.base / f"pyspy-{slug}.raw", ctx.base / f"perf-{slug}.data"
    with Perf(pid, perf):
        for _ in range(passes):
            fn()
    with PySpy(pid, spy):
        for _ in range(passes):
            fn()
    ctx.profiles[name] = (str(spy), str(perf))

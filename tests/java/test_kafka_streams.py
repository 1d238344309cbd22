"""Kafka Streams 3.9 and 4.4 (from Maven Central) on kbroker, exactly_once_v2: two instances of a word count (repartition,
state store, changelog), a windowed count and a stream-table join (streams/StreamsApp.java), one of them killed with
SIGKILL twice while input arrives and restarted; the read_committed output then equals an independent computation
of the input, with no join result lost or duplicated, and a new instance with an empty state directory restores the
word counts from their changelog. `python -m tests.java.test_kafka_streams --rounds N` runs the kill loop longer."""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.peers.maven import ArtifactUnavailable, classpath
from tests.broker_process import BrokerProcess, wait_all_registered
from tests.clients import ck_read_committed
from tests.zookeeper import ZooKeeperServer, zookeeper_missing

HERE = Path(__file__).parent
# The generation kbroker emulates, and the newest release (what a new project starts with).
VERSIONS = ["3.9.1", "4.4.0"]
# CI runs the first version; the second with KBROKER_JVM_ALL_VERSIONS=1 or by hand (`python -m tests.java.test_kafka_streams --version 4.4.0`), which keeps the
# suite's time down while each version stays one command away.
TESTED_VERSIONS = VERSIONS if os.environ.get("KBROKER_JVM_ALL_VERSIONS") == "1" else VERSIONS[:1]
PARTITIONS = 3
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
USERS = {f"u{i}": f"name{i}" for i in range(12)}
BASE_TS = 1_700_000_000_000
JAVA_LOG = os.environ.get("KBROKER_JAVA_LOG", "WARN")


def streams_classpath(tmp: Path, version: str = VERSIONS[0]) -> str:
    """StreamsApp compiled against kafka-streams and its dependencies; skips the test when they cannot be had."""
    name = "streams-3.9" if version == "3.9.1" else f"streams-{version.rsplit('.', 1)[0]}"
    try:
        cp = classpath(name, [f"org.apache.kafka:kafka-streams:{version}"])
    except ArtifactUnavailable as e:
        pytest.skip(f"kafka-streams {version} could not be fetched from Maven Central: {e}")
    out = tmp / "classes"
    out.mkdir(exist_ok=True)
    sources = [HERE / "streams" / "StreamsApp.java", HERE / "org" / "slf4j" / "impl" / "StaticLoggerBinder.java"]
    r = subprocess.run(["javac", "-d", str(out), "-cp", cp, *map(str, sources)], capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr
    return os.pathsep.join([str(out), cp])


class Instance:
    """One StreamsApp JVM; its output lines are collected so the test can wait for a state."""

    def __init__(self, cp: str, bootstrap: str, state_dir: Path, log: Path, standbys: int = 1, rf: int = 1,
                 protocol: str = "classic") -> None:
        self.args = ["java", f"-Dkcompat.log={JAVA_LOG}", "-Xmx256m", "-cp", cp, "StreamsApp", bootstrap,
                     str(state_dir), str(standbys), str(rf), protocol]
        self.log = log
        self.lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> Instance:
        self.lines = []
        err = self.log.open("a")
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=err, text=True)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        return self

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line.strip())

    def wait_running(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "STATE RUNNING" in self.lines:
                return
            assert self.proc is not None and self.proc.poll() is None, f"StreamsApp exited: {self.lines}"
            time.sleep(0.2)
        raise AssertionError(f"StreamsApp not RUNNING after {timeout} s: {self.lines}\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class Input:
    """Produces the three inputs (idempotent, acks=all, Java's murmur2 partitioner so orders and users are
    co-partitioned as Streams expects) and keeps the expected results."""

    def __init__(self, bootstrap: str, seed: int) -> None:
        self.p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                           "partitioner": "murmur2_random"})
        self.rng = random.Random(seed)
        self.words: collections.Counter[str] = collections.Counter()
        self.clicks: collections.Counter[str] = collections.Counter()
        self.orders: list[str] = []

    def users(self) -> None:
        for uid, name in USERS.items():
            self.p.produce("users", key=uid, value=name, timestamp=BASE_TS)
        assert self.p.flush(30) == 0

    def batch(self, n: int) -> None:
        for _ in range(n):
            line = " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(1, 5)))
            self.words.update(line.split())
            self.p.produce("words-in", value=line)
            user = self.rng.choice(list(USERS))
            ts = BASE_TS + self.rng.randrange(0, 60_000)
            self.clicks[f"{user}@{ts - ts % 10_000}"] += 1
            self.p.produce("clicks", key=user, value="/page", timestamp=ts)
            order = f"{len(self.orders)}"
            self.orders.append(f"{USERS[user]}:{order}")
            self.p.produce("orders", key=user, value=order, timestamp=BASE_TS + 120_000)
        assert self.p.flush(30) == 0


def read_committed(bootstrap: str, topic: str) -> list[tuple[str, str]]:
    return [((k or b"").decode(), (v or b"").decode()) for k, v in ck_read_committed(bootstrap, topic)]


def last_values(records: list[tuple[str, str]]) -> dict[str, int]:
    return {k: int(v) for k, v in records}


def converged(bootstrap: str, expected: Input) -> tuple[bool, str]:
    words = last_values(read_committed(bootstrap, "word-counts"))
    clicks = last_values(read_committed(bootstrap, "clicks-per-window"))
    joined = sorted(v for _, v in read_committed(bootstrap, "orders-enriched"))
    ok = words == dict(expected.words) and clicks == dict(expected.clicks) and joined == sorted(expected.orders)
    return ok, (f"words {words} vs {dict(expected.words)}; clicks {len(clicks)} keys vs {len(expected.clicks)}; "
                f"joined {len(joined)} vs {len(expected.orders)} (duplicates {len(joined) - len(set(joined))})")


def wait_converged(bootstrap: str, expected: Input, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    why = ""
    while time.monotonic() < deadline:
        ok, why = converged(bootstrap, expected)
        if ok:
            return
        time.sleep(1)
    raise AssertionError(f"outputs never matched the input: {why}")


def create_topics(bootstrap: str, rf: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [NewTopic(t, PARTITIONS, rf) for t in ("words-in", "clicks", "orders", "word-counts",
                                                    "clicks-per-window", "orders-enriched")]
    topics.append(NewTopic("users", PARTITIONS, rf, config={"cleanup.policy": "compact"}))
    for f in admin.create_topics(topics).values():
        f.result(30)


def run_scenario(cp: str, bootstrap: str, work: Path, rounds: int, seed: int, rf: int = 1,
                 disrupt: Callable[[], None] | None = None, protocol: str = "classic", restore: bool = True) -> None:
    create_topics(bootstrap, rf)
    data = Input(bootstrap, seed)
    data.users()
    a = Instance(cp, bootstrap, work / "state-a", work / "a.log", rf=rf, protocol=protocol).start()
    b = Instance(cp, bootstrap, work / "state-b", work / "b.log", rf=rf, protocol=protocol).start()
    try:
        a.wait_running()
        b.wait_running()
        data.batch(100)
        if disrupt is not None:
            disrupt()
            data.batch(100)
        rng = random.Random(seed)
        for _ in range(rounds):
            victim = rng.choice([a, b])
            time.sleep(rng.uniform(0.2, 1.5))
            victim.kill()  # mid-transaction, as likely as not
            data.batch(100)
            victim.start()
            data.batch(50)
            victim.wait_running()
        data.batch(50)
        wait_converged(bootstrap, data)
    finally:
        a.stop()
        b.stop()
    if not restore:
        return
    # A new instance with nothing on disk restores the word counts from the changelog, then counts on from there.
    c = Instance(cp, bootstrap, work / "state-c", work / "c.log", rf=rf, protocol=protocol).start()
    try:
        c.wait_running()
        data.p.produce("words-in", value="alpha")
        data.words["alpha"] += 1
        assert data.p.flush(30) == 0
        wait_converged(bootstrap, data, timeout=60)
    finally:
        c.stop()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "broker", {"num.partitions": "3", "transaction.state.log.num.partitions": "3",
                                            "offsets.topic.num.partitions": "3",
                                            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
                                            # group.protocol=streams: a killed instance's tasks move within seconds
                                            "group.streams.session.timeout.ms": "6000",
                                            "group.streams.heartbeat.interval.ms": "1000",
                                            "group.streams.num.standby.replicas": "1"})
    b.start()
    yield b
    b.stop()


@pytest.mark.parametrize("version", TESTED_VERSIONS)
def test_exactly_once_through_kills_and_a_restore(broker: BrokerProcess, tmp_path: Path, version: str) -> None:
    if not _have_java():
        pytest.skip("javac/java not on PATH: Kafka Streams test not run")
    cp = streams_classpath(tmp_path, version)
    run_scenario(cp, broker.bootstrap, tmp_path, rounds=2, seed=7)


def test_streams_rebalance_protocol_through_a_kill_and_a_broker_restart(broker: BrokerProcess, tmp_path: Path) -> None:
    """KIP-1071 (group.protocol=streams, Kafka Streams 4.4): two instances, the broker restarted under them (the
    streams group is read back from __consumer_offsets) and one instance SIGKILLed; the output is exactly the
    input's."""
    if not _have_java():
        pytest.skip("javac/java not on PATH: Kafka Streams test not run")
    cp = streams_classpath(tmp_path, "4.4.0")

    def restart() -> None:
        broker.stop()
        broker.start()

    run_scenario(cp, broker.bootstrap, tmp_path, rounds=1, seed=5, disrupt=restart, protocol="streams",
                 restore=False)
    assert "Loaded streams group kbroker-streams-test" in broker.read_log()


def test_three_brokers_replication_factor_3_with_a_broker_killed(tmp_path: Path) -> None:
    """Streams with replication factor 3 on a ZooKeeper cluster: broker 2 is killed with SIGKILL while input
    arrives and comes back; the results are still exactly the input's."""
    if not _have_java():
        pytest.skip("javac/java not on PATH: Kafka Streams test not run")
    if zookeeper_missing() is not None:
        pytest.skip(zookeeper_missing() or "")
    cp = streams_classpath(tmp_path)
    zk = ZooKeeperServer(tmp_path / "zk").start()
    brokers = [BrokerProcess(tmp_path / f"b{i}", {
        "zookeeper.connect": zk.connect, "broker.id": str(i), "zookeeper.session.timeout.ms": "4000",
        "replica.lag.time.max.ms": "2000", "offsets.topic.replication.factor": "3", "min.insync.replicas": "2",
        "transaction.state.log.replication.factor": "3", "transaction.state.log.min.isr": "2",
        "offsets.topic.num.partitions": "3", "transaction.state.log.num.partitions": "3",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"}) for i in (1, 2, 3)]
    try:
        for b in brokers:
            b.start()
        wait_all_registered(brokers, timeout=30)
        bootstrap = ",".join(b.bootstrap for b in brokers)
        run_scenario(cp, bootstrap, tmp_path, rounds=0, seed=11, rf=3, disrupt=brokers[1].kill)
        assert not brokers[1].alive()
    finally:
        for b in brokers:
            b.kill()
        zk.stop()


def _have_java() -> bool:
    import shutil

    return shutil.which("javac") is not None and shutil.which("java") is not None


def main(argv: list[str]) -> int:
    """The long kill loop: `python -m tests.java.test_kafka_streams --rounds 20 --seed 1 [--protocol streams]`."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--version", choices=VERSIONS, default=None)
    ap.add_argument("--protocol", choices=["classic", "streams"], default="classic",
                    help="the group protocol: streams is KIP-1071 (Kafka Streams 4.2+, so --version 4.4.0)")
    args = ap.parse_args(argv)
    version = args.version or (VERSIONS[-1] if args.protocol == "streams" else VERSIONS[0])
    if args.protocol == "streams" and version.startswith("3."):
        ap.error("group.protocol=streams needs Kafka Streams 4.2 or later: --version 4.4.0")
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        b = BrokerProcess(work / "broker", {"num.partitions": "3", "transaction.state.log.num.partitions": "3",
                                            "offsets.topic.num.partitions": "3",
                                            "group.streams.session.timeout.ms": "6000",
                                            "group.streams.heartbeat.interval.ms": "1000",
                                            "group.streams.num.standby.replicas": "1"}).start()
        try:
            run_scenario(streams_classpath(work, version), b.bootstrap, work, args.rounds, args.seed,
                         protocol=args.protocol)
        finally:
            b.stop()
    print(f"exactly-once held through {args.rounds} kills")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

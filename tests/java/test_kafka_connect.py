"""Kafka Connect 3.9 and 4.3 (connect-runtime and connect-file from Maven Central) on kbroker: a distributed cluster of two
workers keeping its configs, offsets and statuses in compacted kbroker topics, exactly-once source support
(KIP-618: transactional source tasks, zombie fencing), the FileStream source and sink connectors driven through the
REST API (create, pause, resume, restart, delete), and a worker killed with SIGKILL: its task moves to the other
worker and the topic, read read_committed, holds every line of the input file exactly once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.peers.maven import ArtifactUnavailable, classpath
from tests.broker_process import BrokerProcess, free_port
from tests.clients import ck_read_committed

HERE = Path(__file__).parent

# The generation kbroker emulates, and the newest release whose connect-file the Maven repository serves.
VERSIONS = ["3.9.1", "4.3.1"]
# CI runs the first version; the second with KBROKER_JVM_ALL_VERSIONS=1 or by hand (`python -m tests.java.test_kafka_connect --version 4.3.1`), which keeps the
# suite's time down while each version stays one command away.
TESTED_VERSIONS = VERSIONS if os.environ.get("KBROKER_JVM_ALL_VERSIONS") == "1" else VERSIONS[:1]
GROUP = "kbroker-connect"
LOG4J = "log4j.rootLogger=WARN, stderr\nlog4j.appender.stderr=org.apache.log4j.ConsoleAppender\n" \
        "log4j.appender.stderr.Target=System.err\nlog4j.appender.stderr.layout=org.apache.log4j.PatternLayout\n" \
        "log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n\n"


def connect_classpath(version: str, tmp: Path) -> str:
    """The Connect jars, and the tests' SLF4J 1.7 binding so the workers' warnings reach their logs."""
    if shutil.which("java") is None or shutil.which("javac") is None:
        pytest.skip("java/javac not on PATH: Kafka Connect test not run")
    name = "connect-3.9" if version == "3.9.1" else f"connect-{version}"
    try:
        cp = classpath(name, [f"org.apache.kafka:{a}:{version}" for a in ("connect-runtime", "connect-file",
                                                                          "connect-json")])
    except ArtifactUnavailable as e:
        pytest.skip(f"Kafka Connect {version} could not be fetched from Maven Central: {e}")
    out = tmp / "slf4j-binding"
    r = subprocess.run(["javac", "-d", str(out), "-cp", cp, str(HERE / "org" / "slf4j" / "impl" /
                                                                 "StaticLoggerBinder.java")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return os.pathsep.join([str(out), cp])


class Worker:
    def __init__(self, cp: str, bootstrap: str, work: Path, name: str) -> None:
        self.port = free_port()
        self.name = name
        self.work = work
        props = {
            "bootstrap.servers": bootstrap, "group.id": GROUP,
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.storage.StringConverter",
            "config.storage.topic": "connect-configs", "offset.storage.topic": "connect-offsets",
            "status.storage.topic": "connect-status", "config.storage.replication.factor": "1",
            "offset.storage.replication.factor": "1", "status.storage.replication.factor": "1",
            "offset.storage.partitions": "3", "status.storage.partitions": "3",
            "listeners": f"http://127.0.0.1:{self.port}", "rest.advertised.host.name": "127.0.0.1",
            "rest.advertised.port": str(self.port), "exactly.once.source.support": "enabled",
            "offset.flush.interval.ms": "500", "scheduled.rebalance.max.delay.ms": "2000",
            "session.timeout.ms": "6000", "heartbeat.interval.ms": "1000", "task.shutdown.graceful.timeout.ms": "2000",
            "plugin.discovery": "only_scan",
        }
        self.props_file = work / f"{name}.properties"
        self.props_file.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (work / "log4j.properties").write_text(LOG4J)
        self.cmd = ["java", "-Xmx384m", f"-Dlog4j.configuration=file:{work / 'log4j.properties'}",
                    f"-Dkcompat.log={os.environ.get('KBROKER_JAVA_LOG', 'WARN')}", "-cp", cp,
                    "org.apache.kafka.connect.cli.ConnectDistributed", str(self.props_file)]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def worker_id(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Worker:
        log = (self.work / f"{self.name}.log").open("ab")
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT)
        return self

    def log(self) -> str:
        return (self.work / f"{self.name}.log").read_text(errors="replace")[-4000:]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def rest(worker: Worker, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201, 202, 204)) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(worker.url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status in ok, (method, path, resp.status)
            raw = resp.read()
            return json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{method} {path}: {e.code} {e.read()[:500]!r}") from None


def wait_for(cond: Any, what: str, timeout: float = 90.0, workers: list[Worker] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = cond()
            if last:
                return last
        except (AssertionError, OSError) as e:
            last = e
        time.sleep(0.5)
    logs = "\n".join(f"--- {w.name}:\n{w.log()}" for w in workers or [])
    raise AssertionError(f"timed out waiting for {what}: {last}\n{logs}")


def topic_lines(bootstrap: str, topic: str) -> list[str]:
    return [(v or b"").decode() for _, v in ck_read_committed(bootstrap, topic, timeout=20)]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "broker", {"offsets.topic.num.partitions": "3",
                                            "transaction.state.log.num.partitions": "3",
                                            "auto.create.topics.enable": "false"})
    b.start()
    yield b
    b.stop()


def append(path: Path, lines: list[str]) -> None:
    with path.open("a") as f:
        f.writelines(line + "\n" for line in lines)


def task_worker(w: Worker, connector: str) -> str | None:
    status = rest(w, "GET", f"/connectors/{connector}/status")
    tasks = status.get("tasks") or []
    if tasks and tasks[0]["state"] == "RUNNING":
        return str(tasks[0]["worker_id"])
    return None


def kill_the_task_owner(workers: list[Worker], source_file: Path, expected: list[str], bootstrap: str) -> Worker:
    """SIGKILL the worker running the source task while the file grows, wait for the other worker to run the task,
    check every line is in the topic exactly once, and start the killed worker again (it rejoins the group);
    returns the worker that took the task over."""
    owner = wait_for(lambda: task_worker(workers[0] if workers[0].alive() else workers[1], "lines-in"),
                     "the source task running", workers=workers)
    victim = next(w for w in workers if w.worker_id == owner)
    survivor = next(w for w in workers if w is not victim)
    victim.kill()
    more = [f"line-{i}" for i in range(len(expected), len(expected) + 150)]
    append(source_file, more)
    expected += more
    wait_for(lambda: task_worker(survivor, "lines-in") == survivor.worker_id, "the task on the survivor",
             timeout=120, workers=workers)
    wait_for(lambda: topic_lines(bootstrap, "lines") == expected, "every line exactly once", timeout=120,
             workers=workers)
    victim.start()
    return survivor


@pytest.mark.parametrize("version", TESTED_VERSIONS)
def test_distributed_workers_exactly_once_source_and_a_killed_worker(broker: BrokerProcess, tmp_path: Path,
                                                                      version: str) -> None:
    cp = connect_classpath(version, tmp_path)
    source_file, sink_file = tmp_path / "in.txt", tmp_path / "out.txt"
    source_file.write_text("")
    workers = [Worker(cp, broker.bootstrap, tmp_path, f"worker{i}").start() for i in (1, 2)]
    try:
        for w in workers:
            wait_for(lambda w=w: rest(w, "GET", "/connectors") == [], f"{w.name} REST up", timeout=180,
                     workers=workers)
        # Connect created its topics compacted on kbroker (it checks the policy and refuses otherwise).
        from confluent_kafka.admin import AdminClient, ConfigResource

        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for topic in ("connect-configs", "connect-offsets", "connect-status"):
            res = ConfigResource(ConfigResource.Type.TOPIC, topic)
            configs = admin.describe_configs([res])[res].result(10)
            assert configs["cleanup.policy"].value == "compact", topic

        w1 = workers[0]
        expected = [f"line-{i}" for i in range(200)]
        append(source_file, expected)
        rest(w1, "POST", "/connectors", {"name": "lines-in", "config": {
            "connector.class": "org.apache.kafka.connect.file.FileStreamSourceConnector", "tasks.max": "1",
            "file": str(source_file), "topic": "lines", "exactly.once.support": "required",
            "transaction.boundary": "poll", "topic.creation.default.replication.factor": "1",
            "topic.creation.default.partitions": "1"}})
        rest(w1, "POST", "/connectors", {"name": "lines-out", "config": {
            "connector.class": "org.apache.kafka.connect.file.FileStreamSinkConnector", "tasks.max": "1",
            "file": str(sink_file), "topics": "lines"}})
        wait_for(lambda: topic_lines(broker.bootstrap, "lines") == expected, "the first 200 lines in the topic",
                 workers=workers)

        # Pause: nothing more is read from the file; resume: the rest arrives.
        rest(w1, "PUT", "/connectors/lines-in/pause")
        wait_for(lambda: rest(w1, "GET", "/connectors/lines-in/status")["connector"]["state"] == "PAUSED", "paused")
        more = [f"line-{i}" for i in range(200, 250)]
        append(source_file, more)
        time.sleep(3)
        assert len(topic_lines(broker.bootstrap, "lines")) == 200
        rest(w1, "PUT", "/connectors/lines-in/resume")
        expected += more
        wait_for(lambda: topic_lines(broker.bootstrap, "lines") == expected, "250 lines after resume",
                 workers=workers)

        # SIGKILL the worker running the source task; the other one takes it over, fencing the dead one's producer.
        survivor = kill_the_task_owner(workers, source_file, expected, broker.bootstrap)

        # The sink wrote every line (at least once, which is what Connect promises for this sink).
        wait_for(lambda: set(sink_file.read_text().splitlines()) >= set(expected), "the sink file complete",
                 workers=workers)

        rest(survivor, "POST", "/connectors/lines-in/restart?includeTasks=true&onlyFailed=false")
        wait_for(lambda: task_worker(survivor, "lines-in") is not None, "the source task back after a restart")
        for name in ("lines-in", "lines-out"):
            rest(survivor, "DELETE", f"/connectors/{name}")
        wait_for(lambda: rest(survivor, "GET", "/connectors") == [], "the connectors deleted")
        assert topic_lines(broker.bootstrap, "lines") == expected
    finally:
        for w in workers:
            w.stop()
    assert broker.alive()


def main(argv: list[str]) -> int:
    """The long kill loop: `python -m tests.java.test_kafka_connect --rounds 10 [--version 4.3.1]`."""
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description="Kafka Connect on kbroker: kill the task's worker, N times")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--version", choices=VERSIONS, default=VERSIONS[0])
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        b = BrokerProcess(work / "broker", {"offsets.topic.num.partitions": "3",
                                            "transaction.state.log.num.partitions": "3"}).start()
        workers = [Worker(connect_classpath(args.version, work), b.bootstrap, work, f"worker{i}").start()
                   for i in (1, 2)]
        try:
            source_file = work / "in.txt"
            expected = [f"line-{i}" for i in range(100)]
            append(source_file, expected)
            wait_for(lambda: rest(workers[0], "GET", "/connectors") == [], "REST up", timeout=180, workers=workers)
            rest(workers[0], "POST", "/connectors", {"name": "lines-in", "config": {
                "connector.class": "org.apache.kafka.connect.file.FileStreamSourceConnector", "tasks.max": "1",
                "file": str(source_file), "topic": "lines", "exactly.once.support": "required",
                "topic.creation.default.replication.factor": "1", "topic.creation.default.partitions": "1"}})
            for i in range(args.rounds):
                kill_the_task_owner(workers, source_file, expected, b.bootstrap)
                print(f"round {i + 1}: {len(expected)} lines, each exactly once", flush=True)
        finally:
            for w in workers:
                w.stop()
            b.stop()
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))

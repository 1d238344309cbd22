"""The pytest plugin as a user's test suite meets it: a project of its own, run by pytest with two pytest-xdist
workers (one broker each), the four Python client APIs (confluent-kafka, its asyncio API, kafka-python,
aiokafka) against the `kafka_broker` / `kafka_topic` fixtures, ini and command-line overrides, crash and restart,
and the in-process mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.broker_process import ROOT

pytest.importorskip("xdist")

USER_TESTS = '''
import asyncio, json, os
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, ConfigResource

OUT = os.environ["KBROKER_PLUGIN_OUT"]


@pytest.fixture(autouse=True)
def record(kafka_broker, request):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.path.join(OUT, f"{worker}-{request.node.name}.json"), "w") as f:
        json.dump({"bootstrap": kafka_broker.bootstrap_servers, "data_dir": str(kafka_broker.data_dir),
                   "pid": kafka_broker._proc.pid if kafka_broker._proc else None,
                   "in_process": kafka_broker.in_process, "start_seconds": kafka_broker.start_seconds}, f)


def ck_consume(bootstrap, topic, n):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got = []
    try:
        for _ in range(200):
            m = c.poll(0.1)
            if m is not None and m.error() is None:
                got.append(m.value())
            if len(got) >= n:
                break
    finally:
        c.close()
    return got


def test_confluent_kafka(kafka_broker, kafka_topic):
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    for i in range(10):
        p.produce(kafka_topic, value=b"v%d" % i)
    assert p.flush(10) == 0
    assert ck_consume(kafka_broker.bootstrap_servers, kafka_topic, 10) == [b"v%d" % i for i in range(10)]


def test_confluent_kafka_asyncio(kafka_broker, kafka_topic):
    from confluent_kafka.aio import AIOProducer

    async def main():
        p = AIOProducer({"bootstrap.servers": kafka_broker.bootstrap_servers}, max_workers=1)
        try:
            futs = [await p.produce(kafka_topic, value=b"a%d" % i) for i in range(5)]
            await p.flush()
            return [(await f).offset() for f in futs]
        finally:
            await p.close()

    assert asyncio.run(main()) == [0, 1, 2, 3, 4]
    assert ck_consume(kafka_broker.bootstrap_servers, kafka_topic, 5) == [b"a%d" % i for i in range(5)]


@pytest.mark.kafka_topic(partitions=3)
def test_kafka_python(kafka_broker, kafka_topic):
    from kafka import KafkaConsumer, KafkaProducer

    p = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers)
    for part in range(3):
        p.send(kafka_topic, value=b"p%d" % part, partition=part).get(timeout=10)
    p.close()
    c = KafkaConsumer(kafka_topic, bootstrap_servers=kafka_broker.bootstrap_servers, auto_offset_reset="earliest",
                      consumer_timeout_ms=5000)
    assert c.partitions_for_topic(kafka_topic) == {0, 1, 2}
    assert sorted(m.value for m in c) == [b"p0", b"p1", b"p2"]
    c.close()


def test_aiokafka(kafka_broker, kafka_topic):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    async def main():
        p = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers)
        await p.start()
        try:
            for i in range(5):
                await p.send_and_wait(kafka_topic, b"x%d" % i)
        finally:
            await p.stop()
        c = AIOKafkaConsumer(kafka_topic, bootstrap_servers=kafka_broker.bootstrap_servers,
                             auto_offset_reset="earliest")
        await c.start()
        try:
            got = await c.getmany(timeout_ms=5000, max_records=5)
            return [m.value for msgs in got.values() for m in msgs]
        finally:
            await c.stop()

    assert asyncio.run(main()) == [b"x%d" % i for i in range(5)]


def test_overrides_from_ini_and_command_line(kafka_broker):
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    res = ConfigResource(ConfigResource.Type.BROKER, "0")
    configs = admin.describe_configs([res])[res].result(10)
    assert configs["num.partitions"].value == "2"            # pytest.ini kbroker_overrides
    assert configs["log.segment.bytes"].value == "1048576"   # --kbroker-override


def test_kill_and_restart_keep_acknowledged_data(kafka_broker):
    if kafka_broker.in_process:
        with pytest.raises(RuntimeError, match="subprocess"):
            kafka_broker.kill()
        kafka_broker.restart()
        return
    topic = kafka_broker.create_topic("crash-test", partitions=1, config={"flush.messages": "1"})
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers, "acks": "all"})
    for i in range(20):
        p.produce(topic, value=b"c%d" % i)
    assert p.flush(10) == 0
    kafka_broker.kill()
    assert not kafka_broker.alive()
    kafka_broker.restart()
    assert kafka_broker.alive()
    assert ck_consume(kafka_broker.bootstrap_servers, topic, 20) == [b"c%d" % i for i in range(20)]
'''


def run_user_suite(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    project = tmp_path / "userproject"
    project.mkdir()
    (project / "test_with_kafka.py").write_text(USER_TESTS)
    (project / "pytest.ini").write_text("[pytest]\nkbroker_overrides =\n    num.partitions=2\n"
                                        "filterwarnings = ignore::DeprecationWarning\n")
    out = tmp_path / "out"
    out.mkdir()
    # The plugin of this checkout is loaded by name with entry-point autoloading off: an installed kbroker's
    # entry point would register the same module a second time (and may belong to another checkout).
    # Without this run's own xdist variables: under `pytest -n`, the nested run would take itself for a worker.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env.update(KBROKER_PLUGIN_OUT=str(out), PYTHONPATH=str(ROOT), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    args = [sys.executable, "-m", "pytest", "-p", "kbroker_tools.pytest_plugin", "-p", "xdist.plugin",
            "-p", "no:cacheprovider", "-q", "--kbroker-override", "log.segment.bytes=1048576", *extra]
    proc = subprocess.run(args, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    return proc, out


def test_entry_point_loads_the_plugin_without_any_flag(tmp_path):
    """pyproject's pytest11 entry point, as an installed distribution declares it: pytest finds the fixtures."""
    import tomllib

    entry_points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    assert entry_points == {"kbroker": "kbroker_tools.pytest_plugin"}
    site = tmp_path / "site"
    dist = site / "kbroker_entrypoint_check-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kbroker-entrypoint-check\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(
        "[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_plain.py").write_text(
        "def test_topic(kafka_broker, kafka_topic):\n"
        "    assert kafka_broker.bootstrap_servers.startswith('127.0.0.1:') and kafka_topic\n")
    # An installed kbroker declares the same entry point name: pytest registers the first and skips the other.
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_DISABLE_PLUGIN_AUTOLOAD"}
    env["PYTHONPATH"] = f"{site}:{ROOT}"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=project, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "1 passed" in r.stdout and "kbroker: the kafka_broker fixture's broker (subprocess)" in r.stdout


def test_fixtures_in_xdist_workers_with_four_clients(tmp_path):
    proc, out = run_user_suite(tmp_path, "-n", "2")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "6 passed" in proc.stdout, proc.stdout[-3000:]
    seen = [json.loads(p.read_text()) for p in out.glob("gw*-*.json")]
    workers = {p.name.split("-")[0] for p in out.glob("gw*-*.json")}
    brokers = {s["bootstrap"] for s in seen}
    assert len(workers) == len(brokers) >= 1  # one broker per worker
    for s in seen:
        assert not Path(s["data_dir"]).exists(), "the data directory outlives the session"
        if s["pid"] is not None:
            assert not Path(f"/proc/{s['pid']}").exists() or "zombie" in Path(f"/proc/{s['pid']}/status").read_text()
    starts = [line for line in proc.stdout.splitlines() if line.startswith("kbroker: the kafka_broker fixture")]
    assert len(starts) == len(workers), proc.stdout[-3000:]
    print("\n".join(starts))


def test_in_process_mode(tmp_path):
    proc, out = run_user_suite(tmp_path, "--kbroker-in-process", "-k",
                               "confluent_kafka and not asyncio or overrides or kill")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "3 passed" in proc.stdout, proc.stdout[-3000:]
    (info,) = [json.loads(p.read_text()) for p in out.glob("main-test_confluent_kafka.json")]
    assert info["in_process"] is True and info["pid"] is None
    assert "(in-process) answered in" in proc.stdout
    print([line for line in proc.stdout.splitlines() if line.startswith("kbroker:")])

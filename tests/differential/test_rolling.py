"""The rolling replacement of a three-broker Apache Kafka 3.9 cluster by three kbrokers under load
(`python -m tests.differential.rolling`), and the reverse (`--reverse`: three kbrokers become Kafka 3.9 brokers).
Out of the default run: three Kafka JVMs, ZooKeeper and three kbrokers take about three minutes of both CI cores
each way; KBROKER_ROLLING=1 runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.zookeeper import zookeeper_missing

ROOT = Path(__file__).resolve().parents[2]


ROLLING = pytest.mark.skipif(
    os.environ.get("KBROKER_ROLLING") != "1",
    reason="three Kafka 3.9 JVMs and three kbrokers for minutes: set KBROKER_ROLLING=1 (docs/differential.md)",
)


def _rolling(*args: str) -> list[str]:
    why = zookeeper_missing()
    if why:
        pytest.skip(why)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        [sys.executable, "-m", "tests.differential.rolling", "--seconds-between", "10", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    if r.returncode == 2:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert any(line.endswith("PASS") for line in lines), lines[-20:]
    lost = [line for line in lines if "read back" in line]
    assert lost and lost[0].split("lost ")[1].startswith("0 "), lost
    return lines


@ROLLING
def test_kafka_cluster_becomes_kbrokers_one_broker_at_a_time() -> None:
    lines = _rolling()
    assert sum("kbroker" in line and "is in the ISR of every partition" in line for line in lines) == 3, lines


@ROLLING
def test_kbroker_cluster_becomes_kafka_one_broker_at_a_time() -> None:
    lines = _rolling("--reverse")
    assert sum("Kafka" in line and "is in the ISR of every partition" in line for line in lines) == 3, lines

"""A mixed ZooKeeper cluster, one Apache Kafka 3.9 broker and one kbroker with kbroker as the controller: kbroker's
LeaderAndIsr drives Kafka's replicas, and acks=all records are taken by a Kafka leader with a kbroker follower and
by a kbroker leader with a Kafka follower (the probe `python -m tests.differential.mixed`, about 45 s)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.zookeeper import zookeeper_missing

ROOT = Path(__file__).resolve().parents[2]


def test_kbroker_controller_drives_kafka_and_both_replicate() -> None:
    why = zookeeper_missing()
    if why:
        pytest.skip(why)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        [sys.executable, "-m", "tests.differential.mixed", "--kbroker-first"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    if r.returncode == 2:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert "CreateTopics via the controller (kbroker): ok" in lines
    produced = [line for line in lines if line.startswith("produce acks=all")]
    assert sorted("leader kafka" in line for line in produced) == [False, True], produced
    assert all(line.endswith("error 0, base offset 0") for line in produced), produced
    # Both brokers agree on the controller (kbroker, node 0) and on replicas and ISR of both partitions.
    views = [line.split(": ", 1)[1] for line in lines if line.startswith(("kafka: ", "kbroker: "))]
    assert len(views) == 2 and views[0] == views[1] and views[0].startswith("controller 0, brokers [0, 1]"), (
        views
    )

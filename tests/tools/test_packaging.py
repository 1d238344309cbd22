"""Packaging: `kbroker --version/--help/--print-config`, the wire-protocol health check, the Docker image."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from kbroker.broker.config import KEYS

from tests.broker_process import ROOT, BrokerProcess, free_port


def kbroker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kbroker.broker", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=30)


def test_version():
    r = kbroker("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("kbroker "), r.stdout


def test_help_lists_every_config_key_with_its_default():
    r = kbroker("--help")
    assert r.returncode == 0, r.stderr
    lines = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines() if line.startswith("  ")
             and line.split() and line.split()[0] in KEYS}
    assert set(lines) == set(KEYS)
    assert lines["num.partitions"] == ["1"]
    assert lines["log.segment.bytes"] == ["1073741824"]
    assert lines["zookeeper.connect"] == ["(unset)"]


def test_print_config_names_the_source_of_each_value(tmp_path):
    props = tmp_path / "server.properties"
    props.write_text("broker.id=7\nlog.retention.hours=24\nnum.partitions=2\n")
    r = kbroker("--print-config", str(props), "--override", "num.partitions=5")
    assert r.returncode == 0, r.stderr
    rows = {}
    for line in r.stdout.splitlines():
        key, value, source = line.split()[0], line.split()[1], line.rsplit("[", 1)[1].rstrip("]")
        rows[key] = (value, source)
    assert set(rows) == set(KEYS)
    assert rows["broker.id"] == ("7", str(props))
    assert rows["num.partitions"] == ("5", "--override")
    assert rows["log.retention.ms"] == (str(24 * 3600 * 1000), "derived")
    assert rows["num.io.threads"] == ("8", "default")
    bad = kbroker("--print-config", str(props), "--override", "num.partitions=zero")
    assert bad.returncode == 2 and "num.partitions" in bad.stderr and "Traceback" not in bad.stderr


def test_healthcheck_speaks_the_protocol(tmp_path):
    down = subprocess.run([sys.executable, "-m", "kbroker_tools.healthcheck", f"127.0.0.1:{free_port()}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert down.returncode == 1 and "unhealthy" in down.stderr
    b = BrokerProcess(tmp_path / "broker").start()
    try:
        up = subprocess.run([sys.executable, "-m", "kbroker_tools.healthcheck", b.bootstrap],
                            cwd=ROOT, capture_output=True, text=True, timeout=30)
        assert up.returncode == 0, up.stderr
        assert "healthy" in up.stdout
    finally:
        assert b.stop() == 0


def _container_engine() -> str | None:
    for engine in ("docker", "podman"):
        path = shutil.which(engine)
        if path and subprocess.run([path, "info"], capture_output=True, timeout=30).returncode == 0:
            return path
    return None


def test_docker_image_builds_and_is_healthy():
    engine = _container_engine()
    if engine is None:
        pytest.skip("no container engine (docker or podman) on this machine: the Dockerfile build is not tested here")
    tag = "kbroker-test:packaging"
    build = subprocess.run([engine, "build", "-t", tag, str(ROOT)], capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([engine, "run", "--rm", "--entrypoint", "kbroker", tag, "--version"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("kbroker "), run.stderr
    user = subprocess.run([engine, "run", "--rm", "--entrypoint", "id", tag, "-u"], capture_output=True, text=True,
                          timeout=120)
    assert user.stdout.strip() not in ("", "0"), "the image must not run as root"

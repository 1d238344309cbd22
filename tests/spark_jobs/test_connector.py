"""kbroker.spark_jobs.connector: which connector versions are tried, the cache marker, and the one-line failure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark", minversion="4.2")

from kbroker.spark_jobs import connector  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_candidates_try_the_pyspark_version_then_each_older_line_down_to_4_2() -> None:
    assert connector.candidates("4.3.0") == ["4.3.0", "4.2.+"]
    assert connector.candidates("4.2.1") == ["4.2.1"]
    assert connector.candidates("4.5.0") == ["4.5.0", "4.4.+", "4.3.+", "4.2.+"]
    assert connector.candidates("4.3.0.dev1")[0] == "4.3.0.dev1"


def test_resolved_needs_the_marker_and_its_jar(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KBROKER_CACHE", str(tmp_path))
    assert connector.resolved("9.9.9") is None
    ivy = tmp_path / "ivy"
    (ivy / "jars").mkdir(parents=True)
    (ivy / "kbroker-connector-for-pyspark-9.9.9").write_text(f"{connector.ARTIFACT}:9.8.0\n")
    assert connector.resolved("9.9.9") is None  # the jar is gone: resolve again
    (ivy / "jars" / "org.apache.spark_spark-sql-kafka-0-10_2.13-9.8.0.jar").write_bytes(b"PK")
    assert connector.resolved("9.9.9") == f"{connector.ARTIFACT}:9.8.0"
    conf = connector.spark_conf(f"{connector.ARTIFACT}:9.8.0")
    assert conf["spark.jars.ivy"] == str(ivy) and conf["spark.jars.packages"].endswith(":9.8.0")


def test_fetch_without_a_repository_is_one_line_and_exit_1(tmp_path) -> None:
    """An empty cache and the JVM's HTTP(S) sent to a closed port: every candidate is tried, none resolves."""
    proxy = "-Dhttps.proxyHost=127.0.0.1 -Dhttps.proxyPort=9 -Dhttp.proxyHost=127.0.0.1 -Dhttp.proxyPort=9"
    env = dict(os.environ, KBROKER_CACHE=str(tmp_path), JAVA_TOOL_OPTIONS=proxy, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "kbroker.spark_jobs.connector", "fetch"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("connector: ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    for cand in connector.candidates(connector.pyspark_version()):
        assert f"{connector.ARTIFACT}:{cand}" in lines[0]
    assert "Connection refused" in lines[0]
    assert not (tmp_path / "ivy" / f"kbroker-connector-for-pyspark-{connector.pyspark_version()}").exists()

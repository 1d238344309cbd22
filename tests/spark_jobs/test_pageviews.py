"""The page-view pipeline end to end: real broker, real clients, Spark with Trigger.AvailableNow via the kbroker
Python source and sink, checked window by window against a pure-Python model of event-time windows + watermark."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

pytest.importorskip("pyspark", minversion="4.2")
pytest.importorskip("pyarrow")

from kbroker.spark_jobs import pageviews  # noqa: E402

from tests.spark_jobs.conftest import create_topic, produce, window_records  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MIN = 60_000
# A minute-aligned base time (2024-01-01T00:00:00Z).
T0 = 1_704_067_200_000


def ev(sec: float, page: str, user: str = "u1") -> str:
    return json.dumps({"ts": T0 + int(sec * 1000), "user": user, "page": page})


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def model(
    runs: list[list[list[str]]], window_ms: int = MIN, delay_ms: int = MIN
) -> dict[tuple[str, str], int]:
    """Spark's append-mode windowed count over runs of micro-batches (each run: its data batches, in order).

    Spark's rules (3.4+): micro-batch k runs with watermark W_k = max(event time before batch k) - delay (never
    going back, 0 at first). A row is dropped as late when its window ended at or before W_(k-1), the watermark of
    the previous batch; windows ending at or before W_k are emitted, once, in batch k. When a batch raises the
    watermark and no data follows, Spark runs a no-data batch to emit what the new watermark closes. Malformed
    records (no ts or page) are ignored.
    """
    w_prev = w = 0  # W_(k-1), W_k
    max_ts: int | None = None
    state: Counter[tuple[str, int]] = Counter()
    emitted: dict[tuple[str, str], int] = {}

    def batch(rows: list[str]) -> None:
        nonlocal w_prev, w, max_ts
        for raw in rows:
            try:
                e = json.loads(raw)
                ts, page = int(e["ts"]), e["page"]
            except (ValueError, KeyError, TypeError):
                continue
            max_ts = ts if max_ts is None else max(max_ts, ts)
            start = ts - ts % window_ms
            if start + window_ms <= w_prev:
                continue  # late
            state[(page, start)] += 1
        for page, start in sorted(state):
            if start + window_ms <= w:
                emitted[(page, iso(start))] = state.pop((page, start))
        w_prev, w = w, max(w, max_ts - delay_ms) if max_ts is not None else w

    for run in runs:
        for rows in run:
            batch(rows)
        if w > w_prev:
            batch([])  # the no-data batch
    return emitted


def output_windows(bootstrap: str, topic: str) -> dict[tuple[str, str], int]:
    """Output records as {(page, window_start): views}; asserts each window appears once and is well formed."""
    recs = window_records(bootstrap, topic)
    seen: dict[tuple[str, str], int] = {}
    for key, v in recs:
        assert key == v["page"]
        assert set(v) == {"page", "window_start", "window_end", "views"}
        start = datetime.strptime(v["window_start"], "%Y-%m-%dT%H:%M:%S%z")
        end = datetime.strptime(v["window_end"], "%Y-%m-%dT%H:%M:%S%z")
        assert (end - start).total_seconds() == 60
        k = (v["page"], v["window_start"])
        assert k not in seen, f"window emitted twice: {k}"
        seen[k] = v["views"]
    return seen


def cfg(broker, tin: str, tout: str, ckpt: Path, **kw) -> pageviews.JobConfig:
    return pageviews.JobConfig(broker.bootstrap, tin, tout, str(ckpt), source="python", **kw)


def test_model_sanity() -> None:
    b1 = [ev(1, "/a"), ev(2, "/a"), ev(30, "/b"), ev(130, "/b")]
    b2 = [ev(5, "/a"), ev(70, "/a"), ev(200, "/c")]
    assert model([[b1]]) == {("/a", iso(T0)): 2, ("/b", iso(T0)): 1}
    # 5 s is late (window [0, 60) closed at watermark 70 s); 70 s is counted; watermark 140 s closes [60, 120).
    assert model([[b1], [b2]]) == {("/a", iso(T0)): 2, ("/b", iso(T0)): 1, ("/a", iso(T0 + MIN)): 1}
    # Within one run, the late filter lags one batch behind eviction: 5 s still counts when it comes in the batch
    # right after the one that raised the watermark, and [0, 60) is emitted with it.
    assert model([[b1, b2]])[("/a", iso(T0))] == 3


def test_pipeline_counts_late_events_and_restart(spark, broker, admin, topic_name, tmp_path, caplog) -> None:
    tin = create_topic(admin, topic_name + "-in", partitions=2)
    tout = create_topic(admin, topic_name + "-out", partitions=1)
    c = cfg(broker, tin, tout, tmp_path / "ckpt")
    pages = ["/home", "/cart", "/item/1"]

    # Run 1: 4 minutes of traffic over 2 partitions, plus one malformed record.
    run1 = [ev(s * 7.3 % 240, pages[s % 3], f"u{s % 5}") for s in range(60)] + [ev(245, "/home"), "not json"]
    produce(broker.bootstrap, tin, run1[: len(run1) // 2], partition=0)
    produce(broker.bootstrap, tin, run1[len(run1) // 2 :], partition=1)
    with caplog.at_level(logging.INFO, logger="spark_jobs"):
        pageviews.run(spark, c)
    want1 = model([[run1]])
    assert want1, "run 1 should close some windows"
    assert output_windows(broker.bootstrap, tout) == want1

    # Run 2 from the same checkpoint: late events for closed windows (dropped), events for a still-open window
    # (counted), and events that push the watermark so more windows close.
    run2 = [ev(10, "/home"), ev(65, "/cart"), ev(150, "/cart")]  # late: their windows closed in run 1
    run2 += [ev(185, "/home"), ev(200, "/item/1"), ev(235, "/cart")]  # window [180, 240) is still open
    run2 += [ev(250 + i * 20, pages[i % 3]) for i in range(8)] + [ev(420, "/home")]
    produce(broker.bootstrap, tin, run2[0::2], partition=0)
    produce(broker.bootstrap, tin, run2[1::2], partition=1)
    q = pageviews.run(spark, c)
    want2 = model([[run1], [run2]])
    got = output_windows(broker.bootstrap, tout)
    assert got == want2
    assert len(want2) > len(want1)
    # Spark did drop the three late events (three distinct page/window keys).
    dropped = sum(
        op.get("numRowsDroppedByWatermark", 0) for p in q.recentProgress for op in p["stateOperators"]
    )
    assert dropped == 3

    # Run 3 with nothing new emits nothing more.
    pageviews.run(spark, c)
    assert output_windows(broker.bootstrap, tout) == want2


def test_restart_with_small_batches_emits_each_window_once(
    spark, broker, admin, topic_name, tmp_path
) -> None:
    """maxOffsetsPerTrigger=7 on one partition makes micro-batches of 7 records (deterministic), three runs."""
    tin = create_topic(admin, topic_name + "-in", partitions=1)
    tout = create_topic(admin, topic_name + "-out", partitions=1)
    c = cfg(broker, tin, tout, tmp_path / "ckpt", max_offsets_per_trigger=7)
    all_events: list[str] = []
    runs: list[list[list[str]]] = []
    for run in range(3):
        # Mostly in-order traffic with a late straggler every few records.
        new = []
        for i in range(16):
            sec = run * 150 + i * 10
            new.append(ev(sec if i % 5 else max(0, sec - 140), f"/p{i % 2}"))
        produce(broker.bootstrap, tin, new, partition=0)
        pending = new
        all_events += new
        q = pageviews.run(spark, c)
        sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
        assert sum(sizes) == len(pending) and max(sizes) <= 7, sizes
        runs.append([pending[i : i + 7] for i in range(0, len(pending), 7)])
        assert output_windows(broker.bootstrap, tout) == model(runs)
    # Some events were dropped as late, and the open windows hold the rest.
    assert sum(model(runs).values()) < len(all_events)


def foreign_python_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose `python3`/`python` on PATH is not this interpreter, and no PYSPARK_PYTHON."""
    shims = tmp_path / "foreign-bin"
    shims.mkdir()
    other = (
        "/usr/bin/python3"
        if Path("/usr/bin/python3").resolve() != Path(sys.executable).resolve()
        else "/bin/false"
    )
    for name in ("python3", "python"):
        (shims / name).symlink_to(other)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=str(ROOT), PATH=f"{shims}:{env.get('PATH', '')}")
    return env


def no_repository(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """A machine that cannot fetch the connector: an empty cache, and the JVM's HTTP(S) goes to a closed port."""
    proxy = "-Dhttps.proxyHost=127.0.0.1 -Dhttps.proxyPort=9 -Dhttp.proxyHost=127.0.0.1 -Dhttp.proxyPort=9"
    return dict(env, KBROKER_CACHE=str(tmp_path / "empty-cache"), JAVA_TOOL_OPTIONS=proxy)


def test_cli_source_kafka_without_connector_says_what_is_missing_in_one_line(tmp_path) -> None:
    args = [sys.executable, "-m", "kbroker.spark_jobs.pageviews", "--bootstrap-servers", "127.0.0.1:1"]
    args += ["--input-topic", "in", "--output-topic", "out", "--checkpoint", str(tmp_path / "ckpt")]
    args += ["--source", "kafka", "--master", "local[1]"]
    env = no_repository(dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=str(ROOT)), tmp_path)
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("pageviews: ")]
    assert len(lines) == 1, proc.stderr[-4000:]
    assert "--source python" in lines[0] and "--jars" in lines[0] and "--packages" in lines[0]
    assert "could not be resolved" in lines[0] and "Connection refused" in lines[0]


def test_python_worker_env() -> None:
    assert pageviews.python_worker_env({}, "/venv/bin/python") == {
        "PYSPARK_PYTHON": "/venv/bin/python",
        "PYSPARK_DRIVER_PYTHON": "/venv/bin/python",
    }
    assert pageviews.python_worker_env({"PYSPARK_PYTHON": "/opt/py"}, "/venv/bin/python") == {
        "PYSPARK_DRIVER_PYTHON": "/venv/bin/python"
    }


def test_cli_auto_falls_back_to_python_source(broker, admin, topic_name, tmp_path) -> None:
    """`python -m kbroker.spark_jobs.pageviews --source auto` in its own process: picks the Python source here, says so.

    `python3` on PATH is another interpreter without pyspark (a virtualenv that is not activated): the job must
    still run its Spark workers with its own interpreter."""
    tin = create_topic(admin, topic_name + "-in")
    tout = create_topic(admin, topic_name + "-out")
    events = [ev(1, "/a"), ev(2, "/b"), ev(3, "/a"), ev(125, "/a")]
    produce(broker.bootstrap, tin, events)
    env = no_repository(foreign_python_env(tmp_path), tmp_path)
    args = [sys.executable, "-m", "kbroker.spark_jobs.pageviews", "--bootstrap-servers", broker.bootstrap]
    args += ["--input-topic", tin, "--output-topic", tout, "--checkpoint", str(tmp_path / "ckpt")]
    args += ["--trigger", "available-now", "--source", "auto", "--master", "local[2]"]
    args += ["--shuffle-partitions", "2"]
    # Three JVM starts (two connector look-ups that fail, then the job): minutes on a loaded 2-core machine.
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "auto chose the Python data source (format 'kbroker')" in proc.stderr
    assert "the connector cannot be had" in proc.stderr
    assert "KAFKA_DATA_SOURCE_NOT_ENABLED" in proc.stderr
    summary = proc.stdout.strip().splitlines()[-1]
    assert (
        summary.startswith("pageviews: done: 4 events in ") and "2 windows written (python source)" in summary
    )
    assert (
        output_windows(broker.bootstrap, tout)
        == model([[events]])
        == {("/a", iso(T0)): 2, ("/b", iso(T0)): 1}
    )


def test_choose_format(spark, caplog) -> None:
    """The test session loads the connector when it can be had (conftest); auto follows what is on the classpath."""
    with caplog.at_level(logging.INFO, logger="spark_jobs"):
        assert pageviews.choose_format(spark, "python") == "kbroker"
        if pageviews.kafka_connector_available(spark):
            assert pageviews.choose_format(spark, "auto") == "kafka"
            assert pageviews.choose_format(spark, "kafka") == "kafka"
            assert "auto chose Spark's Kafka connector" in caplog.text
        else:
            assert pageviews.choose_format(spark, "auto") == "kbroker"
            assert "auto chose the Python data source" in caplog.text
            with pytest.raises(pageviews.KafkaConnectorMissing, match="--source python"):
                pageviews.choose_format(spark, "kafka")
    with pytest.raises(ValueError):
        pageviews.choose_format(spark, "jdbc")


def test_parse_args() -> None:
    c, _ = pageviews.parse_args(
        ["--bootstrap-servers", "h:1", "--input-topic", "i", "--output-topic", "o", "--checkpoint", "/c"]
    )
    assert (c.trigger, c.source, c.fail_on_data_loss) == ("available-now", "auto", True)
    c, _ = pageviews.parse_args(
        ["--bootstrap-servers", "h:1", "--input-topic", "i", "--output-topic", "o", "--checkpoint", "/c"]
        + ["--trigger", "5", "--source", "python", "--no-fail-on-data-loss"]
    )
    assert (c.trigger, c.source, c.fail_on_data_loss) == ("5", "python", False)
    with pytest.raises(SystemExit):
        pageviews.parse_args(
            [
                "--bootstrap-servers",
                "h:1",
                "--input-topic",
                "i",
                "--output-topic",
                "o",
                "--checkpoint",
                "/c",
                "--trigger",
                "soon",
            ]
        )

"""The issue's "done when" for the page-view pipeline, at scale: 50,000 events through kbroker and Spark.

A real kbroker process and real confluent-kafka clients; the job is the function the CLI runs
(``pageviews.run``) with the Python source, Trigger.AvailableNow and a checkpoint directory. Every emitted window
is checked against the pure-Python model of event-time windows + watermark in ``test_pageviews`` (fed the exact
micro-batches Spark ran, taken from the query's progress), then the job is restarted from the same checkpoint
on more data and must process only the new records, emitting each window exactly once across both runs.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.2")
pytest.importorskip("pyarrow")

from confluent_kafka import Producer  # noqa: E402
from kbroker.spark_jobs import pageviews  # noqa: E402
from kbroker.spark_jobs.kbroker_source import from_json_offsets  # noqa: E402

from tests.spark_jobs.conftest import create_topic  # noqa: E402
from tests.spark_jobs.test_pageviews import MIN, T0, model, output_windows  # noqa: E402

PAGES = ["/home", "/cart", "/search", "/item/1", "/item/2"]
PARTITIONS = 3
N1 = 50_000  # run 1: event time over [0, 20) minutes
N2 = 10_000  # run 2: event time over [20, 25) minutes
BATCH = 10_000  # maxOffsetsPerTrigger, so run 1 is several micro-batches and the late filter has work to do


def event(ts_ms: int, i: int, page: str | None = None) -> str:
    return json.dumps({"ts": T0 + ts_ms, "user": f"u{i % 997}", "page": page or PAGES[i % len(PAGES)]})


def traffic(rng: random.Random, n: int, t_from: int, t_to: int) -> list[str]:
    """n events with event time rising from t_from to t_to (ms after T0), +-15 s of jitter."""
    span = t_to - t_from
    return [event(max(0, t_from + span * i // n + rng.randint(-15_000, 15_000)), i) for i in range(n)]


def produce_tracked(bootstrap: str, topic: str, values: list[str]) -> dict[tuple[int, int], str]:
    """Produce round-robin over the partitions; returns {(partition, offset): value} from the delivery reports."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", "enable.idempotence": True})
    placed: dict[tuple[int, int], str] = {}
    errors: list[Any] = []

    def on_delivery(err: Any, m: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            placed[(m.partition(), m.offset())] = m.value().decode()

    for i, v in enumerate(values):
        while True:
            try:
                p.produce(topic, value=v, partition=i % PARTITIONS, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    assert p.flush(60) == 0
    assert not errors, errors[:3]
    assert len(placed) == len(values)
    return placed


def data_batches(query: Any, topic: str) -> list[tuple[dict, dict, int]]:
    """(start offsets, end offsets, numInputRows) of each micro-batch of this run that read data, in order."""
    out = []
    for p in query.recentProgress:
        if not p["numInputRows"]:
            continue
        (src,) = p["sources"]
        start, end = (
            from_json_offsets(json.loads(src[k]) if src[k] else {}) for k in ("startOffset", "endOffset")
        )
        assert {t for t, _ in end} == {topic}
        out.append((start, end, p["numInputRows"]))
    return out


def batch_rows(placed: dict[tuple[int, int], str], start: dict, end: dict) -> list[str]:
    return [placed[(p, o)] for (t, p), hi in sorted(end.items()) for o in range(start.get((t, p), 0), hi)]


def checkpoint_offsets(ckpt: Path) -> tuple[int, dict]:
    """The newest committed batch id and its source end offsets, from the checkpoint's offset log."""
    last = max(int(f.name) for f in (ckpt / "commits").iterdir() if f.name.isdigit())
    lines = (ckpt / "offsets" / str(last)).read_text().splitlines()
    assert lines[0] == "v1"
    return last, from_json_offsets(json.loads(lines[2]))


def test_pipeline_50k_events_and_restart_from_checkpoint(spark, broker, admin, topic_name, tmp_path) -> None:
    rng = random.Random(20240101)
    tin = create_topic(admin, topic_name + "-in", partitions=PARTITIONS)
    tout = create_topic(admin, topic_name + "-out", partitions=1)
    ckpt = tmp_path / "ckpt"
    cfg = pageviews.JobConfig(
        broker.bootstrap, tin, tout, str(ckpt), source="python", max_offsets_per_trigger=BATCH
    )

    # ---- run 1: 50,000 events over ~20 one-minute windows, with a few far-too-late events in the second half.
    run1 = traffic(rng, N1, 0, 20 * MIN)
    late_positions = list(range(30_000, N1, 1_700))
    for k, pos in enumerate(late_positions):
        # 12+ minutes behind the traffic around it: the window closed batches ago.
        run1[pos] = event(json.loads(run1[pos])["ts"] - T0 - 12 * MIN, pos, PAGES[k % len(PAGES)])
    placed1 = produce_tracked(broker.bootstrap, tin, run1)

    q1 = pageviews.run(spark, cfg, timeout=120)
    b1 = data_batches(q1, tin)
    assert sum(n for _, _, n in b1) == N1
    assert len(b1) >= 5 and max(n for _, _, n in b1) <= BATCH
    batches1 = [batch_rows(placed1, s, e) for s, e, _ in b1]
    assert [len(rows) for rows in batches1] == [n for _, _, n in b1]
    # The batches tile the input: each record read once.
    assert sorted(r for rows in batches1 for r in rows) == sorted(run1)

    want1 = model([batches1])
    got1 = output_windows(broker.bootstrap, tout)
    assert got1 == want1
    assert len({start for _, start in want1}) >= 18, "about 20 windows should have closed"
    # The late events were beyond the watermark: the model drops them (the result is as if they never came) and
    # so did Spark.
    on_time = [[r for r in rows if r not in {run1[p] for p in late_positions}] for rows in batches1]
    assert model([on_time]) == want1
    dropped = sum(op["numRowsDroppedByWatermark"] for p in q1.recentProgress for op in p["stateOperators"])
    assert dropped >= 1
    batch_id1, committed1 = checkpoint_offsets(ckpt)
    assert committed1 == {(tin, p): hi for p, hi in enumerate(_ends(placed1))}

    # ---- run 2 from the same checkpoint: 10,000 new events that move event time on by 5 minutes, plus late
    # events for windows run 1 already emitted.
    run2 = traffic(rng, N2, 20 * MIN, 25 * MIN)
    run2 += [event(m * MIN + 30_000, m, PAGES[m % len(PAGES)]) for m in range(2, 7)]
    placed2 = produce_tracked(broker.bootstrap, tin, run2)
    placed_new = {k: v for k, v in placed2.items() if k not in placed1}
    assert len(placed_new) == len(run2)

    q2 = pageviews.run(spark, cfg, timeout=120)
    b2 = data_batches(q2, tin)
    # Only the new data: the input rows of run 2 are exactly the new events, starting where run 1 committed.
    assert sum(n for _, _, n in b2) == len(run2)
    assert b2[0][0] == committed1
    batches2 = [batch_rows(placed2, s, e) for s, e, _ in b2]
    assert sorted(r for rows in batches2 for r in rows) == sorted(run2)
    assert q2.lastProgress["batchId"] > batch_id1
    batch_id2, committed2 = checkpoint_offsets(ckpt)
    assert batch_id2 > batch_id1
    assert committed2 == {(tin, p): hi for p, hi in enumerate(_ends({**placed1, **placed2}))}

    want2 = model([batches1, batches2])
    got2 = output_windows(broker.bootstrap, tout)  # also asserts that no window was emitted twice
    assert got2 == want2
    assert {k: v for k, v in got2.items() if k in got1} == got1, "run 1's windows are unchanged"
    assert len(got2) > len(got1), "run 2 closed more windows"
    assert len({start for _, start in want2}) >= 23


def _ends(placed: dict[tuple[int, int], str]) -> list[int]:
    """The next offset of each partition after the records in placed."""
    return [max(o for (p, o) in placed if p == part) + 1 for part in range(PARTITIONS)]

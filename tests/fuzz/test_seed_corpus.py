"""Replays the seed corpus (tests/fuzz/corpus/*.bin, see seed_corpus.py) against the fuzz broker: each frame gets
Kafka's error codes, the partitions it names do not move, and the broker still serves a round trip. The frames on
disk are also checked against the builder, so a change to either shows up here. About 1 s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kbroker.protocol import codec

from tests.broker_process import BrokerProcess
from tests.clients import RawClient
from tests.fuzz.common import round_trip
from tests.fuzz.seed_corpus import CORPUS, cases, error_codes
from tests.txn_support import high_watermark_and_lso

FRAMES = sorted(CORPUS.glob("*.bin"))


def _positions(bootstrap: str, tps: list[list[object]]) -> dict[tuple[str, int], tuple[int, int]]:
    out = {}
    for topic, partition in tps:
        assert isinstance(topic, str) and isinstance(partition, int)
        out[(topic, partition)] = high_watermark_and_lso(bootstrap, topic, [partition])[partition]
    return out


def test_corpus_files_match_their_builder() -> None:
    built = cases()
    on_disk = {p.stem for p in FRAMES}
    assert set(built) <= on_disk, (
        f"run python -m tests.fuzz.seed_corpus: missing {sorted(set(built) - on_disk)}"
    )
    for name, (frame, expect) in built.items():
        assert (CORPUS / f"{name}.bin").read_bytes() == frame, name
        assert json.loads((CORPUS / f"{name}.json").read_text()) == expect, name


@pytest.mark.parametrize("path", FRAMES, ids=[p.stem for p in FRAMES])
def test_seed_frame_gets_kafkas_answer(fuzz_broker: BrokerProcess, path: Path) -> None:
    expect = json.loads(path.with_suffix(".json").read_text())
    unchanged = expect.get("unchanged", [])
    before = _positions(fuzz_broker.bootstrap, unchanged)
    frame = path.read_bytes()
    with RawClient(fuzz_broker.bootstrap) as raw:
        raw.send_bytes(frame)
        cid, resp = codec.decode_response(expect["api_key"], expect["version"], raw.recv_frame())
    assert cid == int.from_bytes(frame[8:12], "big")
    assert error_codes(resp) == expect["errors"], resp
    assert _positions(fuzz_broker.bootstrap, unchanged) == before
    round_trip(fuzz_broker.bootstrap)

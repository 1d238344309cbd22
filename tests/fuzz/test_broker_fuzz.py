"""Fuzzing the full request path of a real broker process over sockets.

Every advertised API at every advertised version: generated request bodies (some steered at real
topics, Produce carrying real or corrupted record batches), then mutated (bit flips, byte sets,
truncation with a fixed-up size, int16/int32 windows set to huge or negative values, random tails,
unsupported versions, unknown API keys, lying size prefixes), several per connection, pipelined.
After each example: the process is alive, every response decodes for its request's API and version,
the broker logged no traceback, and a raw Produce + Fetch round trip works."""

from __future__ import annotations

import re
import struct

from hypothesis import strategies as st

from tests.broker_process import BrokerProcess
from tests.fuzz.common import (
    Frame,
    budget,
    connection_script,
    exchange,
    round_trip,
    run_for,
)
from tests.fuzz.known_bugs import KNOWN_BUGS


class LogWatch:
    """New broker log lines since the last look."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.pos = len(broker.read_log())

    def new(self) -> str:
        text = self.broker.read_log()
        out, self.pos = text[self.pos:], len(text)
        return out

    def unexpected_tracebacks(self, text: str | None = None) -> list[str]:
        """Log entries with a traceback that is not one of the known, reported bugs."""
        entries = re.split(r"\n(?=\[\d{4}-)", self.new() if text is None else text)
        return [e for e in entries if "Traceback" in e and not any(k.search(e) for k in KNOWN_BUGS)]


def assert_healthy(broker: BrokerProcess, watch: LogWatch, what: str) -> None:
    assert broker.alive(), f"broker died after {what}:\n{broker.read_log()[-4000:]}"
    round_trip(broker.bootstrap)
    bad = watch.unexpected_tracebacks()
    assert not bad, f"broker logged a traceback after {what}:\n" + "\n".join(bad)[-6000:]


def describe(scripts: list[list[Frame]]) -> str:
    return "; ".join("[" + ", ".join(f.note for f in s) + "]" for s in scripts)


def test_request_frames(fuzz_broker: BrokerProcess) -> None:
    watch = LogWatch(fuzz_broker)

    def check(scripts: list[list[Frame]]) -> None:
        problems = []
        for frames in scripts:
            problems += exchange(fuzz_broker.bootstrap, frames)
        assert not problems, f"{problems} for {describe(scripts)}"
        assert_healthy(fuzz_broker, watch, describe(scripts))

    chunks = run_for(budget("requests"), st.lists(connection_script(), min_size=1, max_size=3), check,
                     chunk=25)
    print(f"request fuzz: {chunks} chunks of 25 examples")


def test_unsupported_and_unknown_frames_are_answered_or_closed(fuzz_broker: BrokerProcess) -> None:
    """A fixed sweep over every api key 0..70 at versions -1, 0, 1, max+1, 32767 with an empty body."""
    watch = LogWatch(fuzz_broker)
    for api_key in range(0, 71):
        frames = []
        for i, version in enumerate((-1, 0, 1, 5, 13, 18, 32767)):
            payload = struct.pack(">hhih", api_key, version, 5000 + i, 1) + b"x" + b"\x00" * 8
            frames.append(Frame(struct.pack(">i", len(payload)) + payload, note=f"key {api_key} v{version}"))
        problems = exchange(fuzz_broker.bootstrap, frames, idle=0.15)
        assert not problems, (api_key, problems)
    assert_healthy(fuzz_broker, watch, "api key sweep")

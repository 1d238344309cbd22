"""protocol/messages.py is what tools/gen_protocol.py makes of Kafka's specs (when they are beside the repo)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.gen_protocol import DEFAULT_SPECS, OUT, render


def test_committed_messages_match_the_specs() -> None:
    if not DEFAULT_SPECS.is_dir():
        pytest.skip(f"Kafka message specs not found at {DEFAULT_SPECS}")
    assert Path(OUT).read_text() == render(DEFAULT_SPECS), "protocol/messages.py is stale: run tools/gen_protocol.py"

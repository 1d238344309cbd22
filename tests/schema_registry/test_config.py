"""A schema.registry.listeners the broker cannot serve stops start-up with one line naming the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.broker_process import ROOT, free_port


@pytest.mark.parametrize(
    "value", ["ftp://127.0.0.1:8081", "http://127.0.0.1:99999", "127.0.0.1:8081", "https://127.0.0.1:0"]
)
def test_bad_listener_stops_startup_with_one_line(tmp_path: Path, value: str) -> None:
    # https needs an SSL listener's keystore: this broker has only PLAINTEXT.
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "kbroker.broker",
            str(ROOT / "configs" / "server.properties"),
            "--override",
            f"listeners=PLAINTEXT://127.0.0.1:{free_port()}",
            "--override",
            f"log.dirs={tmp_path}",
            "--override",
            f"schema.registry.listeners={value}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "schema.registry.listeners" in lines[0] and "Traceback" not in r.stderr, (
        r.stderr
    )

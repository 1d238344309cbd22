"""The tree's own standards, checked in CI: ruff clean everywhere, mypy clean on kbroker.protocol and kbroker.storage."""

from __future__ import annotations

import subprocess
import sys

from tests.broker_process import ROOT


def test_ruff_clean() -> None:
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_mypy_clean_on_protocol_and_storage() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "typecheck.py")], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "Success" in r.stdout

"""The compiled accelerators built with ASan/UBSan (tools/sanitize_build.py) through a short seeded differential
fuzz against their Python twins: no sanitizer report, and C and Python agree on every input (~30 s: the build,
then 15 s of fuzz; `python tools/sanitize_build.py --fuzz 3600` is the long run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import sanitize_build  # noqa: E402


def test_sanitized_accelerators_agree_with_python(tmp_path: Path) -> None:
    try:
        sanitize_build.runtime("libasan.so")
    except sanitize_build.SanitizerUnavailable as e:
        pytest.skip(f"no sanitizer build here: {e}")
    except subprocess.CalledProcessError as e:
        pytest.skip(f"no sanitizer build here: gcc failed ({e})")
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "sanitize_build.py"),
            "--out",
            str(tmp_path),
            "--fuzz",
            "15",
            "--seed",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    report = run.stdout + run.stderr
    assert run.returncode == 0, report[-6000:]
    assert "AddressSanitizer" not in report and "runtime error" not in report, report[-6000:]
    assert "differential fuzz:" in run.stdout, report[-3000:]
    print(run.stdout.strip().splitlines()[-1])

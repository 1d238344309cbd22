"""The compiled accelerators built with clang's ASan/UBSan and coverage through a short seeded libFuzzer run
(tools/coverage_fuzz.py, atheris) against their Python twins: no sanitizer report, no disagreement (~60 s: the build,
then 15 s; `python tools/coverage_fuzz.py --seconds 3600 --corpus DIR` is the long run)."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import coverage_fuzz  # noqa: E402


def _available() -> None:
    try:
        coverage_fuzz.clang()
        coverage_fuzz.atheris_runtime()
    except coverage_fuzz.Unavailable as e:
        pytest.skip(f"no coverage-guided fuzz here: {e}")


def test_coverage_guided_fuzz_finds_no_disagreement(tmp_path: Path) -> None:
    _available()
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "coverage_fuzz.py"),
            "--seconds",
            "15",
            "--seed",
            "0",
            "--out",
            str(tmp_path / "build"),
            "--corpus",
            str(tmp_path / "corpus"),
            "--artifacts",
            str(tmp_path / "crashes"),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
    )
    report = run.stdout + run.stderr
    assert run.returncode == 0, report[-6000:]
    assert "AddressSanitizer" not in report and "runtime error" not in report, report[-6000:]
    executed = [line for line in report.splitlines() if line.startswith("stat::number_of_executed_units")]
    assert executed and int(executed[0].split(":")[-1]) > 100, report[-3000:]
    # coverage grew from the seeds: the C modules' counters reached libFuzzer
    assert any(line.startswith("INFO: Loaded") and "PC tables" in line for line in report.splitlines()), (
        report[-3000:]
    )
    assert list((tmp_path / "corpus").iterdir()), "no corpus was written"


def test_a_planted_disagreement_fails_with_its_input(tmp_path: Path) -> None:
    """_frames.c built with a planted bug (a 300-byte frame refused as a bad size): the replay of the input
    that shows it fails, naming the comparison that disagreed (the real modules pass it: the fuzz above starts
    from such frames)."""
    _available()
    planted = tmp_path / "planted"
    shutil.copytree(ROOT / "protocol", planted, ignore=shutil.ignore_patterns("*.so", "*.py", "__pycache__"))
    source = (planted / "_frames.c").read_text()
    assert "if (size < 8 ||" in source
    (planted / "_frames.c").write_text(source.replace("if (size < 8 ||", "if (size < 8 || size == 300 ||"))
    saved = tmp_path / "input"
    saved.write_bytes(bytes([0, 2, 0]) + struct.pack(">i", 300) + bytes(300))  # raw framing target, one frame

    cmd = [sys.executable, str(ROOT / "tools" / "coverage_fuzz.py"), "--reproduce", str(saved)]
    cmd += ["--out", str(tmp_path / "build"), "--sources", str(planted)]
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=ROOT)
    said = bad.stdout + bad.stderr
    assert bad.returncode != 0 and "AssertionError" in said and "_split_both" in said, said[-4000:]

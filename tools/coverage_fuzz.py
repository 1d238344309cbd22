"""Coverage-guided fuzz of the compiled accelerators against their Python twins (libFuzzer through atheris).

    python tools/coverage_fuzz.py --seconds 20 --seed 0          # build with clang, then 20 s
    python tools/coverage_fuzz.py --seconds 3600 --corpus DIR    # the long run, its corpus kept in DIR
    python tools/coverage_fuzz.py --reproduce CRASH_FILE         # replay one input libFuzzer saved

protocol/*.c are built with clang's ASan, UBSan and SanitizerCoverage (`-fsanitize=fuzzer-no-link`) and loaded in a
child Python that preloads atheris's ASan runtime with libFuzzer in it; the Python references are instrumented by
atheris too. libFuzzer's input is read as the choice sequence of tests/protocol/differential_fuzz.py's rounds (every
randint, choice and randbytes of the generators and of their mutations takes its bits from the input), so the
rounds stay the one description of what is compared, and libFuzzer steers them by the branches they reach in the C
and in its twin. A round that finds C and Python disagreeing raises; a memory error aborts under ASan: either way
libFuzzer saves the input (`crash-*` in --artifacts) and the exit status is non-zero.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import sanitize_build  # noqa: E402

FLAGS = [
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-fsanitize=address,undefined,fuzzer-no-link",
    "-fno-sanitize-recover=all",
    "-fPIC",
]
DIR_ENV = "KBROKER_COVERAGE_FUZZ_DIR"
# The Python references whose branches count as coverage beside the C's.
TWINS = ["kbroker.protocol", "kbroker.broker.produce_codec", "kbroker.storage.leader_append"]


class Unavailable(RuntimeError):
    """No clang, or no atheris."""


def clang() -> str:
    for name in ("clang", "clang-19", "clang-18", "clang-17", "clang-16", "clang-15", "clang-14"):
        path = shutil.which(name)
        if path:
            return path
    raise Unavailable("clang not found (Debian: apt-get install clang-14)")


def atheris_runtime() -> str:
    """atheris's ASan runtime with libFuzzer linked in, which the clang-built modules resolve against."""
    try:
        import atheris
    except ImportError as e:
        raise Unavailable(f"atheris is not installed ({e})") from None
    path = os.path.join(atheris.path(), "asan_with_fuzzer.so")
    if not os.path.exists(path):
        raise Unavailable(f"atheris has no {path}")
    return path


class ChoiceRandom(random.Random):
    """A Random whose bits are the fuzzer's input, read in order; zeros once it is used up (every generator then
    takes its first choice, so any input is a finished round)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._at = 0
        super().__init__(0)

    def getrandbits(self, k: int) -> int:
        if k <= 0:
            return 0
        n = (k + 7) // 8
        chunk = self._data[self._at : self._at + n]
        self._at += n
        return int.from_bytes(chunk.ljust(n, b"\0"), "little") & ((1 << k) - 1)

    def random(self) -> float:
        return self.getrandbits(53) / (1 << 53)


def seeds(cases: list[Any], cls_of: Callable[[str, int], type]) -> list[bytes]:
    """Valid inputs for each raw target to start from (the rounds' own generators, a fixed seed): a frame, an
    encoding of each message case, a record body, a batch, a Produce body. The rounds start from nothing."""
    from kbroker.protocol import codec
    from kbroker.protocol import records as R

    from tests.protocol import differential_fuzz as D
    from tests.protocol.test_codec import filled

    rng = random.Random(0)
    batch = R.build_batch(
        [(b"k", b"value", (), D.NOW), (None, b"", (), D.NOW + 1)], producer_id=5, base_sequence=0
    )
    out = [bytes([0, 2, 0]) + struct.pack(">i", 12) + bytes(12) + struct.pack(">i", 8) + bytes(8)]
    for k in range(0, len(cases), max(1, len(cases) // 24)):  # a few: each target starts from as many seeds
        kind, api_key, version = cases[k].values
        buf = bytearray()
        cls = cls_of(kind, api_key)
        codec.plan(cls, version).encode(filled(cls, version, salt=k + 1), buf, None)
        out.append(bytes([2]) + k.to_bytes(2, "little") + bytes(buf))
    out.append(bytes([4, 2, 0]) + batch[R.BATCH_HEADER_SIZE :])
    out.append(bytes([6, 0, 0]) + batch)
    out.append(bytes([8, 0, 0]) + batch)
    for version in (3, 9, 11):
        frame, pos = D._produce_frame(rng, version)
        out.append(bytes([10, version - 3, 0]) + frame[pos:])
        out.append(bytes([12, 0, 0]) + frame)
    return out


def child(argv: list[str]) -> int:
    """In the sanitized child: load the clang-built modules, instrument the references, run libFuzzer."""
    import atheris

    sanitize_build.install(Path(os.environ[DIR_ENV]))
    with atheris.instrument_imports(include=TWINS):
        from tests.protocol import differential_fuzz
        from tests.protocol.test_codec import CASES, _cls
    D = differential_fuzz
    # Raw targets: the input's bytes after the first three (the target, a choice of two bytes) go to one decoder as they are, where libFuzzer's
    # comparison hints (a length checked against a bound, a magic byte) reach the checks directly.
    raw: list[Callable[[int, bytes], None]] = [
        lambda k, b: D._split_both(bytearray(b), 0, len(b), (8, 300, 2**31 - 1)[k % 3]),
        lambda k, b: D._decode_both(
            _cls(*CASES[k % len(CASES)].values[:2]), CASES[k % len(CASES)].values[2], b
        ),
        lambda k, b: D._walk_both(b, k % 6, k & 0x100 != 0),
        lambda k, b: D._scan_both(b),
        lambda k, b: D._plain_both(b),
        lambda k, b: D._produce_both(b, 0, 3 + k % 9),
        lambda k, b: D._produce_frame_both(b),
    ]
    schedule = [fn for _, fn, weight in D.ROUNDS for _ in range(weight)]
    corpus = Path(argv[0]) if argv and not argv[0].startswith("-") else None
    if corpus is not None and corpus.is_dir() and not any(corpus.iterdir()):
        for i, seed in enumerate(seeds(CASES, _cls)):
            (corpus / f"seed-{i}").write_bytes(seed)

    def one_input(data: bytes) -> None:
        # an even first byte: a raw target; odd: a round of differential_fuzz, its choices read from the input
        if len(data) >= 3 and data[0] % 2 == 0:
            raw[(data[0] >> 1) % len(raw)](int.from_bytes(data[1:3], "little"), data[3:])
            return
        rng = ChoiceRandom(data[1:])
        schedule[rng.randrange(len(schedule))](rng)

    atheris.Setup([sys.argv[0], *argv], one_input)
    atheris.Fuzz()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--corpus",
        type=Path,
        help="libFuzzer's corpus directory, kept across runs (default: a temporary one)",
    )
    ap.add_argument("--artifacts", type=Path, default=Path.cwd(), help="where a failing input is saved")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "coverage_fuzz", help="the clang build")
    ap.add_argument(
        "--sources",
        type=Path,
        default=ROOT / "protocol",
        help="the C sources (a patched copy: a planted bug)",
    )
    ap.add_argument("--reproduce", type=Path, metavar="FILE", help="run one saved input and stop")
    ap.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        return child(args.child)
    try:
        preload = atheris_runtime()
        sanitize_build.build(args.out, clang(), FLAGS, [], args.sources)
    except Unavailable as e:
        print(f"coverage_fuzz: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"coverage_fuzz: compiling failed: {' '.join(map(str, e.cmd))}", file=sys.stderr)
        return 1
    env = dict(os.environ)
    env.pop("KBROKER_PURE_PYTHON", None)
    env.update(
        {
            "LD_PRELOAD": preload,
            "PYTHONMALLOC": "malloc",
            # CPython leaks by design at exit; a report means a memory error, not a leak.
            "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:halt_on_error=1",
            "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
            DIR_ENV: str(args.out),
        }
    )
    with tempfile.TemporaryDirectory(prefix="kbroker-corpus-") as scratch:
        if args.reproduce is not None:
            fuzzer = [str(args.reproduce)]
        else:
            corpus = args.corpus or Path(scratch)
            corpus.mkdir(parents=True, exist_ok=True)
            args.artifacts.mkdir(parents=True, exist_ok=True)
            fuzzer = [
                str(corpus),
                f"-seed={args.seed}",
                f"-max_total_time={args.seconds}",
                "-max_len=4096",
                "-len_control=10",
                "-rss_limit_mb=6144",
                "-timeout=60",
                "-print_final_stats=1",
                f"-artifact_prefix={args.artifacts}{os.sep}",
            ]
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", *fuzzer]
        return subprocess.run(cmd, env=env, cwd=ROOT).returncode


if __name__ == "__main__":
    raise SystemExit(main())

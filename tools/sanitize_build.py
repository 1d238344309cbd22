"""Build protocol/*.c with AddressSanitizer and UBSan (gcc) and run the differential fuzz against the Python twins.

    python tools/sanitize_build.py                      # build into build/sanitize/ and say how to use it
    python tools/sanitize_build.py --fuzz 20 --seed 0   # build, then 20 s of tests/protocol/differential_fuzz.py
    python tools/sanitize_build.py --fuzz 3600          # the long run

The fuzz runs in a child Python with libasan preloaded (CPython itself is not instrumented), PYTHONMALLOC=malloc
(so ASan sees every list and buffer the C code touches, not pymalloc's arenas) and the sanitized modules
installed as kbroker.protocol._codec, _record_walk, _batch_scan, _produce and _frames before anything imports them. Any ASan or UBSan report
aborts the child: exit status non-zero, the report on stderr. The in-place build is left alone.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULES = ("_codec", "_record_walk", "_batch_scan", "_produce", "_frames")
FLAGS = [
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fPIC",
    "-Wall",
]
DIR_ENV = "KBROKER_SANITIZED_DIR"


class SanitizerUnavailable(RuntimeError):
    """No gcc, or gcc without the ASan/UBSan runtime."""


def runtime(name: str) -> str:
    """Path of gcc's sanitizer runtime library (libasan.so, libubsan.so)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise SanitizerUnavailable("gcc not found")
    path = subprocess.run(
        [gcc, f"-print-file-name={name}"], capture_output=True, text=True, check=True
    ).stdout
    path = path.strip()
    if not os.path.isabs(path) or not os.path.exists(path):
        raise SanitizerUnavailable(f"gcc has no {name} (install libasan/libubsan for gcc)")
    return path


def build(
    out: Path,
    compiler: str = "gcc",
    flags: list[str] = FLAGS,
    link: list[str] = FLAGS,
    sources: Path = ROOT / "protocol",
) -> list[Path]:
    """Compile each accelerator with the sanitizers into out/; the paths of the built modules. The process that
    loads them preloads the ASan runtime (gcc's libasan here; atheris's, which carries libFuzzer too, for
    tools/coverage_fuzz.py's clang build, linked without `link`'s sanitizer flags)."""
    if compiler == "gcc":
        runtime("libasan.so")
    out.mkdir(parents=True, exist_ok=True)
    include = sysconfig.get_paths()["include"]
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    built = []
    for name in MODULES:
        target = out / f"{name}{suffix}"
        obj = out / f"{name}.o"
        source = str(sources / f"{name}.c")
        subprocess.run([compiler, *flags, "-c", f"-I{include}", source, "-o", str(obj)], check=True)
        subprocess.run([compiler, "-shared", *link, str(obj), "-o", str(target)], check=True)
        built.append(target)
    return built


def install(out: Path) -> None:
    """Load the sanitized modules under the names protocol.accelerators imports (call before kbroker.protocol's
    codec, record_walk and records are imported)."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for name in MODULES:
        full = f"kbroker.protocol.{name}"
        spec = importlib.util.spec_from_file_location(full, out / f"{name}{suffix}")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[full] = module


def child_env(out: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("KBROKER_PURE_PYTHON", None)
    env.update(
        {
            "LD_PRELOAD": runtime("libasan.so"),
            "PYTHONMALLOC": "malloc",
            # CPython leaks by design at exit; a report means a memory error, not a leak.
            "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:halt_on_error=1",
            "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
            DIR_ENV: str(out),
        }
    )
    return env


def fuzz(out: Path, seconds: float, seed: int) -> int:
    """The differential fuzz in a sanitized child; its exit status."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--fuzz",
        str(seconds),
        "--seed",
        str(seed),
    ]
    return subprocess.run(cmd, env=child_env(out), cwd=ROOT).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "sanitize")
    ap.add_argument("--fuzz", type=float, metavar="SECONDS", help="run the differential fuzz this long")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        install(Path(os.environ[DIR_ENV]))
        from tests.protocol import differential_fuzz

        return differential_fuzz.main(["--seconds", str(args.fuzz or 0), "--seed", str(args.seed)])
    try:
        built = build(args.out)
    except SanitizerUnavailable as e:
        print(f"sanitize_build: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"sanitize_build: compiling failed: {' '.join(e.cmd)}", file=sys.stderr)
        return 1
    print("built " + ", ".join(str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p) for p in built))
    if args.fuzz is None:
        print(
            f"run with: LD_PRELOAD={runtime('libasan.so')} PYTHONMALLOC=malloc ASAN_OPTIONS=detect_leaks=0 and "
            f"tools.sanitize_build.install(Path('{args.out}')) before importing kbroker.protocol"
        )
        return 0
    return fuzz(args.out, args.fuzz, args.seed)


if __name__ == "__main__":
    raise SystemExit(main())

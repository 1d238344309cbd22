"""What the machine charges for writing into the page cache: new pages against pages already cached.

    python -m bench.page_cache [--dir DIR] [--mb N]

kbroker appends every produced byte to a segment file, so each new 4 KiB of log takes a page the page cache did not
have. On a virtual machine whose free memory goes back to the host (balloon free-page reporting, as on this project's
2-core VM) the first touch of such a page is a fault on the host side, paid inside `pwrite` (perf shows it as
`copy_folio_from_iter_atomic`). The C mock broker keeps its data in memory it recycles, so it hardly pays this. The
bench prints both figures with the machine so that broker CPU per message can be read against them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MB = 1 << 20


def _write(path: Path, mb: int, buf: bytes, *, rewrite: bool) -> float:
    """Thread CPU seconds to write mb MiB at the start of the file (new file, or over its cached pages)."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | (0 if rewrite else os.O_TRUNC), 0o644)
    try:
        t = time.thread_time()
        for i in range(mb):
            os.pwrite(fd, buf, i * MB)
        return time.thread_time() - t
    finally:
        os.close(fd)


def write_cost(directory: Path, mb: int = 128) -> tuple[float, float]:
    """(us of CPU per MiB written into new page-cache pages, us per MiB rewritten over cached pages)."""
    buf = os.urandom(MB)
    fd, name = tempfile.mkstemp(prefix="page-cache-", dir=directory)
    os.close(fd)
    path = Path(name)
    try:
        new = _write(path, mb, buf, rewrite=False)
        cached = _write(path, mb, buf, rewrite=True)
    finally:
        path.unlink(missing_ok=True)
    return new / mb * 1e6, cached / mb * 1e6


def resident_share(files: list[Path]) -> float | None:
    """The share of the files' bytes in the page cache now (util-linux fincore), None without fincore. This VM
    also runs DAMON proactive reclaim, which pages out what has not been touched for about a minute, so a large
    log written a while ago is partly read from disk again."""
    if not files or shutil.which("fincore") is None:
        return None
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES,SIZE", *map(str, files)],
                         capture_output=True, text=True, timeout=60)
    res = size = 0
    for line in out.stdout.splitlines():
        r, sz = line.split()
        res += int(r)
        size += int(sz)
    return res / size if size else None


def describe(directory: Path, mb: int = 128) -> str:
    new, cached = write_cost(directory, mb)
    return f"{new:.0f} us/MiB into new pages, {cached:.0f} us/MiB over cached pages ({mb} MiB, {directory})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.page_cache", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="a directory on the disk to test")
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    for rep in range(args.reps):
        print(f"rep {rep + 1}: page cache writes cost {describe(args.dir, args.mb)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

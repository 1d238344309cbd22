"""Replace a small file atomically: a crash leaves either the old or the new contents, never a mix."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    dfd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_atomically(path: Path, data: bytes, *, sync: bool = True) -> None:
    """tmp file + fsync + rename + directory fsync; sync=False leaves both fsyncs to a later sync (the file then
    holds the old or the new contents after a crash, or nothing if the crash came before the data reached disk)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync:
        fsync_dir(path.parent)

from __future__ import annotations

import os
from pathlib import Path

from kbroker.storage.file_handles import FileHandleCache, LazyFile


def _files(tmp_path: Path, cache: FileHandleCache, n: int) -> list[LazyFile]:
    out = []
    for i in range(n):
        path = tmp_path / f"f{i}"
        path.touch()
        out.append(LazyFile(path, os.O_RDONLY, cache))
    return out


def test_descriptors_stay_within_max_open_and_reopen_on_use(tmp_path: Path) -> None:
    cache = FileHandleCache(max_open=3)
    files = _files(tmp_path, cache, 10)
    for f in files:
        f.get()
        assert len(cache) <= 3
    assert sum(f.is_open for f in files) == 3
    assert not files[0].is_open
    fd = files[0].get().fd  # reopened on use
    assert files[0].is_open and os.fstat(fd)
    assert sum(f.is_open for f in files) == 3


def test_a_file_used_since_the_last_sweep_keeps_its_descriptor(tmp_path: Path) -> None:
    """CLOCK: opening past max_open passes over files used since the sweep last reached them (clearing their
    mark) and closes the first one that was not."""
    cache = FileHandleCache(max_open=3)
    a, b, c, d, e = _files(tmp_path, cache, 5)
    for f in (a, b, c):
        f.get()
    d.get()  # all three marked by their first use: each gets its second chance, then the oldest, a, goes
    assert [f.is_open for f in (a, b, c, d)] == [False, True, True, True]
    b.get()  # b used again since the sweep cleared its mark
    e.get()  # the sweep keeps b, closes c (unused since)
    assert [f.is_open for f in (b, c, d, e)] == [True, False, True, True]


def test_a_held_descriptor_outlives_its_eviction(tmp_path: Path) -> None:
    cache = FileHandleCache(max_open=1)
    a, b = _files(tmp_path, cache, 2)
    held = a.get()
    b.get()
    assert not a.is_open
    assert os.fstat(held.fd)  # still open: the holder's reference keeps it

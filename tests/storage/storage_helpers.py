"""Shared helpers for the storage tests."""

from __future__ import annotations

from pathlib import Path

from kbroker.protocol.records import (
    Record,
    build_batch,
    decode_records,
    iter_batch_headers,
    parse_batch_header,
    set_base_offset,
)
from kbroker.storage.log import Log

NOW = 1_700_000_000_000


def batch(n: int = 1, *, key: str = "k", ts: int = NOW, size: int = 10, **kw: object) -> bytes:
    """n records keyed f"{key}{i}" with `size`-byte values."""
    return build_batch([(f"{key}{i}".encode(), b"v" * size, [], ts) for i in range(n)], **kw)  # type: ignore[arg-type]


def kv_batch(pairs: list[tuple[bytes | None, bytes | None]], ts: int = NOW, **kw: object) -> bytes:
    return build_batch([(k, v, [], ts) for k, v in pairs], **kw)  # type: ignore[arg-type]


def read_all(log: Log, start: int | None = None) -> list[Record]:
    """Every record from start (default log start) to LEO, following fetch semantics."""
    out: list[Record] = []
    offset = log.log_start_offset if start is None else start
    while offset < log.log_end_offset:
        info = log.read(offset, 1 << 20)
        if info.records is None:
            break
        data = info.records.read_bytes()
        last = offset
        for pos, h in iter_batch_headers(data):
            out.extend(r for r in decode_records(data, pos) if r.offset >= offset)
            last = h.next_offset
        offset = last
    return out


def write_legacy_segment(log_dir: Path, batches: list[bytes], base_offset: int = 0) -> None:
    """A segment file as an older kbroker may have left it: the batches back to back, offsets assigned, no
    validation and no indexes (open the log with clean_shutdown=False to rebuild them)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    data = bytearray()
    offset = base_offset
    for raw in batches:
        buf = bytearray(raw)
        set_base_offset(buf, 0, offset)
        offset = parse_batch_header(buf).next_offset
        data += buf
    (log_dir / f"{base_offset:020d}.log").write_bytes(bytes(data))

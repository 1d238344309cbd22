"""Request framing: the complete int32-size-prefixed frames at the front of a connection's receive buffer.

protocol/_frames.c's split is the compiled form (one call per read); split_py is the reference and the fallback.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from kbroker.protocol import accelerators

__all__ = ["COMPILED", "IMPLEMENTATION", "MIN_FRAME", "split", "split_py"]

# A request frame holds at least a request header's api key, version and correlation id.
MIN_FRAME = 8
_SIZE = struct.Struct(">i")


def split_py(buf: Any, start: int, end: int, max_request: int) -> tuple[list[bytearray], int]:
    """The complete frames in buf[start:end], each a private, writable copy of the bytes after its int32 size,
    up to the first frame that is incomplete or whose size is outside [MIN_FRAME, max_request]; and where that
    one begins (end when there is none). The caller deals with that frame (waits for its bytes, gives a large
    one its own buffer, closes on a bad size, or reads a SASL token's shorter frame)."""
    if start < 0 or end < start or end > len(buf):
        raise ValueError(f"split: [{start}, {end}) is not within a buffer of {len(buf)} bytes")
    frames: list[bytearray] = []
    view = memoryview(buf)
    while end - start >= 4:
        (size,) = _SIZE.unpack_from(view, start)
        if size < MIN_FRAME or size > max_request or size > end - start - 4:
            break
        frames.append(bytearray(view[start + 4 : start + 4 + size]))
        start += 4 + size
    return frames, start


_compiled = accelerators.load("_frames")
COMPILED = _compiled is not None
IMPLEMENTATION = accelerators.describe("_frames", _compiled)
split: Callable[[Any, int, int, int], tuple[list[bytearray], int]] = (
    _compiled.split if _compiled is not None else split_py
)

"""Which storage errors fail a whole log dir (Kafka's LogDirFailureChannel) and which only the request."""

from __future__ import annotations

import errno

# A full disk or quota passes once space is freed: the request fails, the log dir stays online (kbroker keeps a
# single full log dir serving; Kafka would take it offline and, with no other dir left, halt).
_TRANSIENT = frozenset({errno.ENOSPC, errno.EDQUOT})


def dir_failure_cause(exc: BaseException | None) -> OSError | None:
    """The I/O error behind exc when it means the log dir itself is unusable (EIO, EROFS, a directory that is
    gone or replaced, permissions), else None: a full disk, a closed or replaced log, a bad offset."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError):
            return None if exc.errno in _TRANSIENT or exc.errno is None else exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None

"""The optional compiled accelerators (protocol/_codec.c, protocol/_record_walk.c): loaded when built, unless
KBROKER_PURE_PYTHON asks for the Python references, and named for the broker's startup line."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

# Set (to anything but "" or "0") to run the Python references although the C ones are built: how the tests run
# the request path both ways, and how a suspected accelerator bug is ruled out on a live broker.
PURE_PYTHON_ENV = "KBROKER_PURE_PYTHON"
FORCED_PURE = os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")


def load(name: str) -> ModuleType | None:
    """kbroker.protocol.<name> if it is built and not switched off, else None (its Python reference is used)."""
    if FORCED_PURE:
        return None
    try:
        return importlib.import_module(f"kbroker.protocol.{name}")
    except ImportError:  # not built (no compiler at install time)
        return None


def describe(name: str, module: ModuleType | None) -> str:
    """Which implementation runs, as the startup line says it."""
    if module is not None:
        return f"compiled (protocol/{name}.c)"
    return f"pure Python ({PURE_PYTHON_ENV} set)" if FORCED_PURE else f"pure Python (protocol/{name}.c not built)"

"""Compatibility levels and which earlier versions each checks, in which direction (the format decides the rules)."""

from __future__ import annotations

from kbroker.schema_registry.formats import ParsedSchema

LEVELS = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)


def check(level: str, new: ParsedSchema, previous: list[tuple[int, ParsedSchema]]) -> list[str]:
    """Why `new` may not follow `previous` (oldest first, with their versions) at `level`; empty when it may.

    BACKWARD: the new schema reads data written with the old; FORWARD: the old reads the new; FULL: both. A
    non-transitive level compares with the latest version only."""
    if level == "NONE" or not previous:
        return []
    against = previous if level.endswith("_TRANSITIVE") else previous[-1:]
    base = level.removesuffix("_TRANSITIVE")
    messages: list[str] = []
    for version, old in reversed(against):
        errors: list[str] = []
        if base in ("BACKWARD", "FULL"):
            errors += new.read_errors(old)
        if base in ("FORWARD", "FULL"):
            errors += old.read_errors(new)
        if errors:
            messages += errors + [
                f"{{oldSchemaVersion: {version}}}",
                f"{{oldSchema: '{old.canonical()}'}}",
                f"{{compatibility: '{level}'}}",
            ]
    return messages

"""Schema facts for one field of a Kafka protocol message, as emitted by tools/gen_protocol.py."""

from __future__ import annotations

from typing import Any, NamedTuple

ZERO_UUID = bytes(16)
# Marks a field that follows its message's flexibleVersions (only RequestHeader.ClientId overrides it).
INHERIT = "inherit"


class FieldSpec(NamedTuple):
    attr: str
    type: str
    versions: tuple[int, int] | None
    nullable_versions: tuple[int, int] | None
    tag: int | None
    tagged_versions: tuple[int, int] | None
    default: Any
    flexible_versions: tuple[int, int] | None | str

    def in_versions(self, version: int) -> bool:
        return _within(self.versions, version)

    def nullable_in(self, version: int) -> bool:
        return _within(self.nullable_versions, version)

    def tagged_in(self, version: int) -> bool:
        return self.tag is not None and _within(self.tagged_versions, version)


def _within(rng: tuple[int, int] | None, version: int) -> bool:
    return rng is not None and rng[0] <= version <= rng[1]


class _NewStruct:
    """Default of a non-nullable struct field: a fresh default instance of the struct."""

    def __repr__(self) -> str:
        return "NEW_STRUCT"


NEW_STRUCT = _NewStruct()

"""The `__consumer_offsets` entry of a modern group's record (consumer, share and streams groups): a key naming the
group, and the member for member records, behind its record type; a value behind its version, or a tombstone."""

from __future__ import annotations

from collections.abc import Container, Mapping
from enum import IntEnum
from typing import Any, TypeVar

from kbroker.protocol import codec
from kbroker.protocol.primitives import I16

E = TypeVar("E", bound=IntEnum)


def encode_entry(
    rtype: IntEnum,
    group_id: str,
    member_id: str | None,
    value: Any | None,
    key_classes: Mapping[Any, Any],
    member_records: Container[Any],
    key_version: int = 0,
    value_version: int = 0,
) -> tuple[bytes, bytes | None]:
    cls = key_classes[rtype]
    key = cls(group_id=group_id, member_id=member_id) if rtype in member_records else cls(group_id=group_id)
    k = bytearray(I16.pack(int(rtype)))
    codec.encode(key, key_version, k)
    if value is None:
        return bytes(k), None
    v = bytearray(I16.pack(value_version))
    codec.encode(value, value_version, v)
    return bytes(k), bytes(v)


def decode_entry(
    key: bytes,
    value: bytes | None,
    record_types: type[E],
    key_classes: Mapping[Any, Any],
    value_classes: Mapping[Any, Any],
    member_records: Container[Any],
    key_version_is_type: bool = False,
    value_version: int = 0,
) -> tuple[E, str, str | None, Any | None]:
    """(record type, group id, member id or None, the generated *Value object or None for a tombstone). Later
    value versions only add tagged fields: `value_version` reads them and skips what it does not know."""
    (kv,) = I16.unpack_from(key, 0)
    rtype = record_types(kv)
    k, _ = codec.decode(key_classes[rtype], kv if key_version_is_type else 0, key, 2)
    member_id = k.member_id if rtype in member_records else None
    if value is None:
        return rtype, k.group_id, member_id, None
    v, _ = codec.decode(value_classes[rtype], value_version, value, 2)
    return rtype, k.group_id, member_id, v

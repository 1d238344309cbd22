"""__share_group_state records: a ShareSnapshot (record type 0) per share-partition, Kafka's key and value schemas.

A snapshot holds the whole state of one share-partition (start offset, the in-flight batches that are not plainly
new), so the latest one for a key is all a reader needs; the topic is compacted.
"""

from __future__ import annotations

import base64
from typing import Any

from kbroker.protocol import codec
from kbroker.protocol.messages import ShareSnapshotKey, ShareSnapshotValue
from kbroker.protocol.primitives import I16
from kbroker.protocol.records import decode_records, iter_batch_headers

SHARE_STATE_TOPIC = "__share_group_state"
SHARE_SNAPSHOT = 0
_READ_BYTES = 1 << 20
# (first, last, delivery state, delivery count)
StateBatch = tuple[int, int, int, int]


def coordinator_key(group_id: str, topic_id: bytes, partition: int) -> str:
    """Kafka's SharePartitionKey.asCoordinatorKey: which __share_group_state partition holds the state."""
    return f"{group_id}:{base64.urlsafe_b64encode(topic_id).decode().rstrip('=')}:{partition}"


def snapshot_key(group_id: str, topic_id: bytes, partition: int) -> bytes:
    out = bytearray(I16.pack(SHARE_SNAPSHOT))
    codec.encode(ShareSnapshotKey(group_id=group_id, topic_id=topic_id, partition=partition), 0, out)
    return bytes(out)


def snapshot_value(
    snapshot_epoch: int, leader_epoch: int, start: int, batches: list[StateBatch], state_epoch: int = 0
) -> bytes:
    V = ShareSnapshotValue
    out = bytearray(I16.pack(0))
    codec.encode(
        V(
            snapshot_epoch=snapshot_epoch & 0xFFFF,
            state_epoch=state_epoch,
            leader_epoch=leader_epoch,
            start_offset=start,
            state_batches=[
                V.StateBatch(first_offset=f, last_offset=la, delivery_state=s, delivery_count=c)
                for f, la, s, c in batches
            ],
        ),
        0,
        out,
    )
    return bytes(out)


# (snapshot epoch, start offset, batches, state epoch)
Snapshot = tuple[int, int, list[StateBatch], int]


def load_snapshots(lg: Any) -> dict[bytes, Snapshot]:
    """The latest snapshot of every share-partition in lg: key -> (snapshot epoch, start offset, batches, state
    epoch). The state epoch is the one InitializeShareGroupState set: a writer with an older one is fenced."""
    out: dict[bytes, Snapshot] = {}
    offset = lg.log_start_offset
    # to the log end: a new leader's high watermark lags what its predecessor had replicated to it
    end = lg.log_end_offset
    while offset < end:
        info = lg.read(offset, _READ_BYTES, max_offset=end)
        if info.records is None or info.records.size == 0:
            break
        data = info.records.read_bytes()
        last = offset
        for pos, header in iter_batch_headers(data):
            last = header.next_offset
            if header.is_control:
                continue
            for rec in decode_records(data, pos):
                if rec.key is None or I16.unpack_from(rec.key, 0)[0] != SHARE_SNAPSHOT:
                    continue
                if rec.value is None:
                    out.pop(bytes(rec.key), None)
                    continue
                v, _ = codec.decode(ShareSnapshotValue, 0, rec.value, 2)
                out[bytes(rec.key)] = (
                    v.snapshot_epoch,
                    v.start_offset,
                    [
                        (b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                        for b in v.state_batches
                    ],
                    v.state_epoch,
                )
        if last <= offset:
            break
        offset = last
    return out

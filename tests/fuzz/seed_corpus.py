"""The fuzz suite's seed corpus: request frames that once got a wrong answer, each with Kafka's answer.

Every case is a whole request frame (size prefix included) in `corpus/<name>.bin` with its expectation in
`corpus/<name>.json`: the API key and version, the error codes of the response in the order they appear (every
`error_code` field, depth first), and the partitions whose log end, high watermark and last stable offset must not
move. The frames aim at the fuzz broker's topics (tests/fuzz/conftest.py). `python -m tests.fuzz.seed_corpus`
rewrites this module's cases (the frames are deterministic: fixed timestamps, producer ids and correlation ids).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from kbroker.protocol import codec
from kbroker.protocol import records as R
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import ProduceRequest, RequestHeader

from tests.fuzz.common import PLAIN_TOPIC

CORPUS = Path(__file__).with_name("corpus")
TIMESTAMP = 1_700_000_000_000
# A producer id no InitProducerId of the fuzz broker hands out early (they count up from 0).
PRODUCER_ID = 4_000_000


def plain_batch(n: int = 2, *, compression: int = R.COMPRESSION_NONE) -> bytes:
    return R.build_batch([(b"k%d" % i, b"v%d" % i, (), TIMESTAMP) for i in range(n)], compression=compression)


def transactional_batch(n: int = 3, producer_id: int = PRODUCER_ID) -> bytes:
    return R.build_batch(
        [(b"t%d" % i, b"x%d" % i, (), TIMESTAMP) for i in range(n)],
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=0,
        is_transactional=True,
    )


def produce_frame(
    version: int,
    records: bytes | None,
    *,
    topic: str = PLAIN_TOPIC,
    partition: int = 0,
    transactional_id: str | None = None,
    correlation_id: int = 7,
) -> bytes:
    P = ProduceRequest
    body = P(
        transactional_id=transactional_id,
        acks=-1,
        timeout_ms=5000,
        topic_data=[
            P.TopicProduceData(
                name=topic, partition_data=[P.PartitionProduceData(index=partition, records=records)]
            )
        ],
    )
    return bytes(codec.encode_request(RequestHeader(0, version, correlation_id, "seed-corpus"), body))


def _produce_cases() -> dict[str, tuple[bytes, dict[str, Any]]]:
    """Issue 39 items 1, 4 and 5: Kafka's ProduceRequest.validateRecords and the unverified transactional batch."""
    tp = [[PLAIN_TOPIC, 0]]
    cases: dict[str, tuple[bytes, dict[str, Any]]] = {}

    def add(name: str, version: int, records: bytes | None, code: ErrorCode, **kw: Any) -> None:
        cases[name] = (
            produce_frame(version, records, **kw),
            {"api_key": 0, "version": version, "errors": [int(code)], "unchanged": tp},
        )

    mixed = plain_batch() + transactional_batch()
    for v in (3, 9, 11):
        add(f"produce-v{v}-plain-then-transactional", v, mixed, ErrorCode.INVALID_RECORD)
    add("produce-v9-two-plain-batches", 9, plain_batch() + plain_batch(), ErrorCode.INVALID_RECORD)
    # Before v3 several batches are allowed, and each is checked: the transactional one was never verified.
    for v in (0, 2):
        add(f"produce-v{v}-plain-then-transactional", v, mixed, ErrorCode.INVALID_TXN_STATE)
    add(
        "produce-v9-transactional-without-transactional-id",
        9,
        transactional_batch(),
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    )
    for v in (3, 4, 5, 6):
        add(
            f"produce-v{v}-zstd",
            v,
            plain_batch(compression=R.COMPRESSION_ZSTD),
            ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
        )
    for v in (3, 9):
        add(f"produce-v{v}-empty-record-set", v, b"", ErrorCode.INVALID_RECORD)
    add("produce-v9-null-record-set", 9, None, ErrorCode.INVALID_RECORD)
    add("produce-v9-first-batch-cut-short", 9, plain_batch()[:-1], ErrorCode.INVALID_RECORD)
    tiny = bytearray(plain_batch())
    tiny[8:12] = (13).to_bytes(4, "big")  # smaller than any entry can be
    add("produce-v9-batch-length-13", 9, bytes(tiny), ErrorCode.CORRUPT_MESSAGE)
    magic = bytearray(plain_batch())
    magic[16] = 1
    add("produce-v9-magic-1", 9, bytes(magic), ErrorCode.INVALID_RECORD)
    return cases


def cases() -> dict[str, tuple[bytes, dict[str, Any]]]:
    return _produce_cases()


def error_codes(obj: Any) -> list[int]:
    """Every `error_code` of a decoded response, depth first in field order."""
    out: list[int] = []
    if isinstance(obj, list):
        for x in obj:
            out += error_codes(x)
    elif hasattr(obj, "__dataclass_fields__"):
        for name in obj.__dataclass_fields__:
            v = getattr(obj, name)
            if name == "error_code":
                out.append(int(v))
            else:
                out += error_codes(v)
    return out


def write(directory: Path = CORPUS) -> list[Path]:
    directory.mkdir(exist_ok=True)
    written = []
    for name, (frame, expect) in cases().items():
        (directory / f"{name}.bin").write_bytes(frame)
        (directory / f"{name}.json").write_text(json.dumps(expect, indent=1) + "\n")
        written.append(directory / f"{name}.bin")
    return written


if __name__ == "__main__":
    for p in write(Path(sys.argv[1]) if len(sys.argv) > 1 else CORPUS):
        print(p)

"""Message format conversion micro-benchmark: CPU per message for old clients (protocol/legacy_records.py).

    python -m bench.legacy_conversion [--messages N] [--reps R]

Up-conversion is what the log does to a produced magic 1 set (parse, CRC-32 check, inflate, build one v2 batch,
validate it); down-conversion is what a Fetch v2-v3 costs per partition read (decode the v2 batch, build magic 1
messages, recompress). In-process, single thread: the figures are the conversion alone, without the network path.
"""

from __future__ import annotations

import argparse
import statistics
import time

from kbroker.protocol.legacy_records import (
    build_message_set,
    down_convert,
    scan_shallow_entries,
    to_record_batch,
)
from kbroker.protocol.records import (
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    Record,
    build_batch,
    validate_batches,
)

TS0 = 1_700_000_000_000


def per_message_us(fn: object, n: int, reps: int) -> float:
    runs = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        runs.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    n = args.messages
    recs = [Record(i, TS0 + i, b"key-%d" % (i % 97), b"x" * 100) for i in range(n)]
    print(f"{n} messages of 100 B per set, median of {args.reps}")
    print("| conversion | codec | us/message |")
    print("| --- | --- | --- |")
    for codec, name in ((COMPRESSION_NONE, "none"), (COMPRESSION_LZ4, "lz4")):
        legacy = build_message_set(recs, magic=1, compression=codec)

        def up(legacy: bytes = legacy) -> None:
            validate_batches(to_record_batch(legacy, scan_shallow_entries(legacy)))

        stored = build_batch(recs, compression=codec)
        print(f"| magic 1 -> v2 (produce) | {name} | {per_message_us(up, n, args.reps):.2f} |")
        print(f"| v2 -> magic 1 (fetch) | {name} | "
              f"{per_message_us(lambda s=stored: down_convert(s, 1, 0, 1 << 30), n, args.reps):.2f} |")


if __name__ == "__main__":
    main()

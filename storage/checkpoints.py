"""Kafka offset checkpoint files: "0" version line, count line, then "topic partition offset" lines."""

from __future__ import annotations

import logging
from pathlib import Path

from kbroker.storage.atomic_file import write_atomically

logger = logging.getLogger("kbroker.storage")

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
# High watermarks of replicated partitions (ReplicaManager's highWatermarkCheckpoints in Kafka).
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
CLEAN_SHUTDOWN_MARKER = ".kafka_cleanshutdown"

_VERSION = 0


class OffsetCheckpointFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, offsets: dict[tuple[str, int], int]) -> None:
        """Atomically replace the file (tmp + fsync + rename + dir fsync): a crash leaves old or new."""
        lines = [str(_VERSION), str(len(offsets))]
        lines += [f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(offsets.items())]
        write_atomically(self.path, ("\n".join(lines) + "\n").encode())

    def read(self) -> dict[tuple[str, int], int]:
        """Missing file -> {}. A malformed file is logged and ignored (recovery then scans everything)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        try:
            lines = text.splitlines()
            if int(lines[0]) != _VERSION:
                raise ValueError(f"unsupported version {lines[0]}")
            count = int(lines[1])
            out: dict[tuple[str, int], int] = {}
            for line in lines[2 : 2 + count]:
                topic, partition, offset = line.split()
                out[(topic, int(partition))] = int(offset)
            if len(out) != count:
                raise ValueError(f"expected {count} entries, found {len(out)}")
            return out
        except (ValueError, IndexError) as e:
            logger.error("Ignoring malformed checkpoint file %s: %s", self.path, e)
            return {}

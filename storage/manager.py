"""LogManager: owns every partition log across the log dirs, checkpoints, and the background work."""

from __future__ import annotations

import logging
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from kbroker.storage.checkpoints import (
    CLEAN_SHUTDOWN_MARKER,
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from kbroker.storage.cleaner import LogCleaner, rewrite_empty_compressed_batches
from kbroker.storage.config import LogConfig
from kbroker.storage.errors import KafkaStorageError
from kbroker.storage.file_handles import SEGMENT_FILES
from kbroker.storage.log import Log

logger = logging.getLogger("kbroker.storage")

_LOG_DIR_RE = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")
_DELETE_DIR_RE = re.compile(r"^.+-\d+\.[0-9a-f]{32}-delete$")
# Shutdown spends at most this long removing deleted logs' directories; the next start removes the rest.
SHUTDOWN_DELETE_BUDGET_S = 5.0
# How often the scheduler wakes for delayed file deletes even when nothing else is due.
_DELETE_POLL_MS = 1000

TopicPartition = tuple[str, int]


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class _PendingDirDelete:
    due_ms: int
    path: Path
    log: Log


class LogManager:
    def __init__(self, log_dirs: list[str], default_config: LogConfig, *, retention_check_interval_ms: int = 300000,
                 flush_check_interval_ms: int = 2**63 - 1, flush_offset_checkpoint_interval_ms: int = 60000,
                 cleaner_enabled: bool = True, cleaner_backoff_ms: int = 15000,
                 topic_config: Callable[[str], LogConfig | None] | None = None,
                 producer_id_expiration_ms: int = 86400000,
                 producer_id_expiration_check_interval_ms: int = 600000,
                 high_watermark_checkpoint_interval_ms: int | None = None,
                 max_open_segment_files: int | None = None) -> None:
        """topic_config(topic) supplies a topic's config at startup (None -> default_config).

        producer_id_expiration_ms is Kafka's producer.id.expiration.ms: idempotent producer state
        whose last batch is older is dropped by a check every producer_id_expiration_check_interval_ms.

        high_watermark_checkpoint_interval_ms (replica.high.watermark.checkpoint.interval.ms) is set for
        replicated brokers: high watermarks are then kept in replication-offset-checkpoint and restored on
        start. Without it (the single-node default) a log's high watermark is its end, as before.

        max_open_segment_files bounds the descriptors segment files keep open (storage.file_handles).
        """
        if max_open_segment_files is not None:
            SEGMENT_FILES.max_open = max(1, max_open_segment_files)
        self.log_dirs = [Path(d) for d in log_dirs]
        self.default_config = default_config
        self.retention_check_interval_ms = retention_check_interval_ms
        self.flush_check_interval_ms = flush_check_interval_ms
        self.flush_offset_checkpoint_interval_ms = flush_offset_checkpoint_interval_ms
        self.cleaner_enabled = cleaner_enabled
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.producer_id_expiration_check_interval_ms = producer_id_expiration_check_interval_ms
        self.high_watermark_checkpoint_interval_ms = high_watermark_checkpoint_interval_ms
        self._topic_config = topic_config
        self._lock = threading.RLock()
        self._pending_lock = threading.Lock()
        self._logs_with_pending_deletes: set[Log] = set()
        self._logs: dict[TopicPartition, Log] = {}
        self._log_dir_of: dict[TopicPartition, Path] = {}
        self._topic_configs: dict[str, LogConfig] = {}
        self._pending_dir_deletes: list[_PendingDirDelete] = []
        self._stop = threading.Event()
        self._scheduler: threading.Thread | None = None
        self.cleaner = LogCleaner(self._compacted_logs, backoff_ms=cleaner_backoff_ms)
        self._started = False

    # -- startup -------------------------------------------------------------------------------

    def startup(self) -> None:
        for log_dir in self.log_dirs:
            log_dir.mkdir(parents=True, exist_ok=True)
            self._load_dir(log_dir)
        self._started = True

    def _load_dir(self, log_dir: Path) -> None:
        marker = log_dir / CLEAN_SHUTDOWN_MARKER
        clean = marker.exists()
        recovery_points = OffsetCheckpointFile(log_dir / RECOVERY_POINT_CHECKPOINT).read()
        start_offsets = OffsetCheckpointFile(log_dir / LOG_START_OFFSET_CHECKPOINT).read()
        cleaner_offsets = OffsetCheckpointFile(log_dir / CLEANER_OFFSET_CHECKPOINT).read()
        high_watermarks = (OffsetCheckpointFile(log_dir / REPLICATION_OFFSET_CHECKPOINT).read()
                           if self.high_watermark_checkpoint_interval_ms is not None else None)
        started = time.monotonic()
        loaded = 0
        for child in sorted(log_dir.iterdir()):
            if not child.is_dir():
                continue
            if _DELETE_DIR_RE.match(child.name):
                # A delete that did not finish before the last shutdown.
                shutil.rmtree(child, ignore_errors=True)
                continue
            m = _LOG_DIR_RE.match(child.name)
            if m is None:
                continue
            tp = (m.group("topic"), int(m.group("partition")))
            if tp in self._logs:
                logger.error("Duplicate log directories for %s-%d: %s and %s; ignoring the latter",
                             tp[0], tp[1], self._log_dir_of[tp], child)
                continue
            config = self._config_for(tp[0])
            log = Log.open(child, tp[0], tp[1], config, recovery_point=recovery_points.get(tp, 0),
                           log_start_offset=start_offsets.get(tp, 0), clean_shutdown=clean,
                           high_watermark=None if high_watermarks is None else high_watermarks.get(tp, 0))
            log.cleaner_checkpoint = max(cleaner_offsets.get(tp, 0), log.log_start_offset)
            if cleaner_offsets.get(tp, 0) > log.log_start_offset:
                # Older cleaners left empty compressed batches that make librdkafka abort: none may be served.
                rewrite_empty_compressed_batches(log, log.cleaner_checkpoint)
            self._logs[tp] = log
            self._log_dir_of[tp] = log_dir
            self._watch_pending_deletes(log)
            loaded += 1
        # Without logs there was nothing to recover, whatever the marker says (a new log dir has none).
        state = "clean shutdown" if clean else "unclean shutdown" if loaded else "nothing to recover"
        logger.info("Loaded %d logs from %s in %.3f s (%s)", loaded, log_dir, time.monotonic() - started, state)
        # Only now: a crash during loading must recover again.
        marker.unlink(missing_ok=True)

    def _watch_pending_deletes(self, log: Log) -> None:
        log.on_pending_delete = self._note_pending_delete
        if log.has_pending_deletes:  # queued while it was opened
            self._note_pending_delete(log)

    def _note_pending_delete(self, log: Log) -> None:
        with self._pending_lock:
            self._logs_with_pending_deletes.add(log)

    def _config_for(self, topic: str) -> LogConfig:
        cfg = self._topic_configs.get(topic)
        if cfg is None and self._topic_config is not None:
            cfg = self._topic_config(topic)
        return cfg if cfg is not None else self.default_config

    # -- lookup / create / delete ----------------------------------------------------------------

    def get_log(self, topic: str, partition: int) -> Log | None:
        return self._logs.get((topic, partition))

    def get_or_create_log(self, topic: str, partition: int, config: LogConfig | None = None, *,
                          announce: bool = True) -> Log:
        """announce=False: the caller logs one line for many logs (a topic's creation)."""
        tp = (topic, partition)
        log = self._logs.get(tp)
        if log is not None:
            return log
        with self._lock:
            log = self._logs.get(tp)
            if log is not None:
                return log
            if config is not None:
                self._topic_configs[topic] = config
            config = self._config_for(topic)
            log_dir = self._least_loaded_dir()
            try:
                log = Log.open(log_dir / f"{topic}-{partition}", topic, partition, config, clean_shutdown=True)
            except OSError as e:
                raise KafkaStorageError(f"cannot create log for {topic}-{partition} in {log_dir}: {e}") from e
            self._logs[tp] = log
            self._log_dir_of[tp] = log_dir
            self._watch_pending_deletes(log)
            if announce:
                logger.info("Created log for %s-%d in %s", topic, partition, log_dir)
            return log

    def _least_loaded_dir(self) -> Path:
        if len(self.log_dirs) == 1:
            return self.log_dirs[0]
        counts = dict.fromkeys(self.log_dirs, 0)
        for d in self._log_dir_of.values():
            counts[d] = counts.get(d, 0) + 1
        return min(self.log_dirs, key=lambda d: counts[d])

    def delete_log(self, topic: str, partition: int, *, announce: bool = True) -> None:
        """Forget the log now; rename its dir to <tp>.<uuid>-delete and remove it after file.delete.delay.ms
        (open fds, e.g. an in-flight sendfile, stay valid until then)."""
        tp = (topic, partition)
        with self._lock:
            log = self._logs.pop(tp, None)
            self._log_dir_of.pop(tp, None)
            if log is None:
                return
            target = log.dir.with_name(f"{log.dir.name}.{uuid.uuid4().hex}-delete")
            log.dir.rename(target)
            log.dir = target
            self._pending_dir_deletes.append(_PendingDirDelete(_now_ms() + log.config.file_delete_delay_ms,
                                                               target, log))
        if announce:
            logger.info("Scheduled deletion of log %s-%d (%s)", topic, partition, target)

    def discard_log(self, topic: str, partition: int) -> None:
        """Remove a log nobody has used yet (a topic whose creation failed) at once, files and all."""
        tp = (topic, partition)
        with self._lock:
            log = self._logs.pop(tp, None)
            self._log_dir_of.pop(tp, None)
        if log is not None:
            log.delete()

    def logs(self) -> list[Log]:
        return list(self._logs.values())

    def update_topic_config(self, topic: str, config: LogConfig) -> None:
        with self._lock:
            self._topic_configs[topic] = config
            for (t, _), log in self._logs.items():
                if t == topic:
                    log.update_config(config)

    def _compacted_logs(self) -> Iterable[Log]:
        return [log for log in self.logs() if log.config.compact]

    # -- periodic work (all sync; called by the scheduler thread, callable directly by tests) ----

    def cleanup_logs(self, now_ms: int | None = None) -> int:
        """Retention pass over every log; returns segments deleted."""
        now_ms = _now_ms() if now_ms is None else now_ms
        deleted = 0
        for log in self.logs():
            try:
                deleted += log.delete_old_segments(now_ms)
            except Exception:
                logger.exception("Retention failed for %s", log.name)
        return deleted

    def flush_dirty_logs(self, now_ms: int | None = None) -> None:
        """Time-based flush (flush.ms)."""
        now_ms = _now_ms() if now_ms is None else now_ms
        for log in self.logs():
            if log.unflushed_messages > 0 and now_ms - log.last_flush_ms >= log.config.flush_ms:
                try:
                    log.flush()
                except KafkaStorageError as e:  # a full or failing log dir: expected, retried next time
                    logger.error("Flush failed for %s: %s", log.name, e)
                except Exception:
                    logger.exception("Flush failed for %s", log.name)

    def remove_expired_producers(self, now_ms: int | None = None) -> int:
        """producer.id.expiration.ms pass over every log; returns producer ids removed."""
        now_ms = _now_ms() if now_ms is None else now_ms
        removed = 0
        for log in self.logs():
            if log.closed:
                continue
            try:
                removed += len(log.remove_expired_producers(now_ms, self.producer_id_expiration_ms))
            except Exception:
                logger.exception("Producer id expiration failed for %s", log.name)
        return removed

    def checkpoint(self) -> bool:
        """Write recovery-point, log-start-offset and cleaner-offset checkpoints in every log dir."""
        ok = True
        with self._lock:
            by_dir: dict[Path, dict[TopicPartition, Log]] = {d: {} for d in self.log_dirs}
            for tp, log in self._logs.items():
                by_dir.setdefault(self._log_dir_of[tp], {})[tp] = log
        for log_dir, logs in by_dir.items():
            try:
                OffsetCheckpointFile(log_dir / RECOVERY_POINT_CHECKPOINT).write(
                    {tp: log.recovery_point for tp, log in logs.items()})
                OffsetCheckpointFile(log_dir / LOG_START_OFFSET_CHECKPOINT).write(
                    {tp: log.log_start_offset for tp, log in logs.items()})
                OffsetCheckpointFile(log_dir / CLEANER_OFFSET_CHECKPOINT).write(
                    {tp: log.cleaner_checkpoint for tp, log in logs.items() if log.config.compact})
            except OSError as e:  # a full or failing log dir: retried at the next interval
                ok = False
                logger.error("Failed to write checkpoints in %s: %s", log_dir, e)
        return ok and self.checkpoint_high_watermarks()

    def checkpoint_high_watermarks(self) -> bool:
        """replication-offset-checkpoint in every log dir (replicated brokers only)."""
        if self.high_watermark_checkpoint_interval_ms is None:
            return True
        with self._lock:
            by_dir: dict[Path, dict[TopicPartition, int]] = {d: {} for d in self.log_dirs}
            for tp, log in self._logs.items():
                by_dir.setdefault(self._log_dir_of[tp], {})[tp] = log.high_watermark
        ok = True
        for log_dir, hws in by_dir.items():
            try:
                OffsetCheckpointFile(log_dir / REPLICATION_OFFSET_CHECKPOINT).write(hws)
            except OSError:
                ok = False
                logger.exception("Failed to write %s in %s", REPLICATION_OFFSET_CHECKPOINT, log_dir)
        return ok

    def delete_pending_files(self, now_ms: int | None = None, *, force: bool = False,
                             time_budget_s: float | None = None) -> None:
        """time_budget_s: stop removing directories after this long; the rest stay for the next start, which
        removes leftover -delete directories (a deleted topic of 10,000 partitions takes tens of seconds)."""
        now_ms = _now_ms() if now_ms is None else now_ms
        started = time.monotonic()
        # Only the logs that queued segments: touching every Log object every second costs an idle broker of
        # 1,000 partitions ~4% of a core here (cold pages faulted back in on each pass).
        with self._pending_lock:
            pending, self._logs_with_pending_deletes = self._logs_with_pending_deletes, set()
        for log in self.logs() if force else pending:
            if self._logs.get((log.topic, log.partition)) is not log:
                continue  # deleted or replaced meanwhile: its own deletion took its files
            log.delete_pending_files(now_ms, force=force)
            if log.has_pending_deletes:
                self._note_pending_delete(log)
        with self._lock:
            due: list[_PendingDirDelete] = []
            later: list[_PendingDirDelete] = []
            for p in self._pending_dir_deletes:
                (due if force or p.due_ms <= now_ms else later).append(p)
            self._pending_dir_deletes = later
        removed: list[_PendingDirDelete] = []
        for i, p in enumerate(due):
            if not force and self._stop.is_set():
                # Shutting down: its own pass (with a time budget) takes over the rest.
                with self._lock:
                    self._pending_dir_deletes.extend(due[i:])
                due = due[:i]
                break
            try:
                p.log.close(persist=False)
            except Exception:  # noqa: BLE001 - the directory goes all the same
                logger.warning("Closing deleted log %s failed; removing its directory anyway", p.path, exc_info=True)
            if time_budget_s is not None and time.monotonic() - started > time_budget_s:
                continue
            shutil.rmtree(p.path, ignore_errors=True)
            if p.path.exists():
                # Something in it could not be removed yet: the next pass tries again, so nothing stays behind.
                logger.warning("Could not remove all of %s; trying again later", p.path)
                with self._lock:
                    self._pending_dir_deletes.append(_PendingDirDelete(now_ms + p.log.config.file_delete_delay_ms,
                                                                       p.path, p.log))
                continue
            removed.append(p)
        if len(removed) < len(due):
            logger.info("Left %d deleted log directories for the next start to remove", len(due) - len(removed))
        due = removed
        if len(due) == 1:
            logger.info("Deleted log directory %s", due[0].path)
        elif due:
            # A deleted topic of thousands of partitions: one line, not thousands.
            logger.info("Deleted %d log directories (%s ... %s)", len(due), due[0].path.name, due[-1].path.name)

    # -- background ----------------------------------------------------------------------------

    def start_background(self) -> None:
        if self._scheduler is not None:
            return
        self._scheduler = threading.Thread(target=self._run_scheduler, name="kbroker-log-scheduler", daemon=True)
        self._scheduler.start()
        if self.cleaner_enabled:
            self.cleaner.start()

    def _run_scheduler(self) -> None:
        now = _now_ms()
        tasks: list[tuple[str, int, Callable[[], object]]] = [
            ("retention", self.retention_check_interval_ms, self.cleanup_logs),
            ("flush", self.flush_check_interval_ms, self.flush_dirty_logs),
            ("checkpoint", self.flush_offset_checkpoint_interval_ms, self.checkpoint),
            ("delete", _DELETE_POLL_MS, self.delete_pending_files),
            ("producer-expiration", self.producer_id_expiration_check_interval_ms, self.remove_expired_producers),
        ]
        if self.high_watermark_checkpoint_interval_ms is not None:
            tasks.append(("high-watermark-checkpoint", self.high_watermark_checkpoint_interval_ms,
                          self.checkpoint_high_watermarks))
        next_run = {name: now + min(interval, 2**62) for name, interval, _ in tasks}
        while not self._stop.is_set():
            now = _now_ms()
            for name, interval, fn in tasks:
                if now >= next_run[name]:
                    try:
                        fn()
                    except Exception:
                        logger.exception("Scheduled task %s failed", name)
                    next_run[name] = _now_ms() + interval
            wait_ms = max(0, min(next_run.values()) - _now_ms())
            self._stop.wait(min(wait_ms, _DELETE_POLL_MS) / 1000)

    def shutdown(self) -> None:
        self._stop.set()
        if self._scheduler is not None:
            self._scheduler.join()
            self._scheduler = None
        self.cleaner.shutdown()
        clean = True
        for log in self.logs():
            try:
                log.flush()
            except KafkaStorageError as e:  # a full or failing log dir: recovery replays the tail at startup
                clean = False
                logger.error("Final flush failed for %s: %s", log.name, e)
            except Exception:
                clean = False
                logger.exception("Final flush failed for %s", log.name)
        clean = self.checkpoint() and clean
        self.delete_pending_files(force=True, time_budget_s=SHUTDOWN_DELETE_BUDGET_S)
        for log in self.logs():
            log.close()
        if not clean:
            # Without the marker the next start recovers from the checkpoints instead of trusting them.
            logger.error("Log manager shut down with errors; next start will run recovery")
            return
        for log_dir in self.log_dirs:
            (log_dir / CLEAN_SHUTDOWN_MARKER).touch()
        logger.info("Log manager shut down cleanly")

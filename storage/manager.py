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

from kbroker.storage.atomic_file import fsync_dir
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
from kbroker.storage.errors import KafkaStorageError, LogDirNotFoundError, OffsetOutOfRangeError
from kbroker.storage.file_handles import SEGMENT_FILES
from kbroker.storage.log import Log
from kbroker.storage.log_dir_failure import dir_failure_cause
from kbroker.storage.log_replica import UnexpectedAppendOffsetError
from kbroker.storage.segment import FileRecordsSlice

logger = logging.getLogger("kbroker.storage")

_LOG_DIR_RE = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")
_DELETE_DIR_RE = re.compile(r"^.+-\d+\.[0-9a-f]{32}-delete$")
# A future log (AlterReplicaLogDirs): the copy of a partition's log being made in another log dir.
_FUTURE_DIR_RE = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)\.[0-9a-f]{32}-future$")
# Bytes a future log copies per read from its current log (Kafka's replica.fetch.max.bytes default).
FUTURE_COPY_BYTES = 1024 * 1024
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
        # Moves whenever a partition's Log object is added, replaced or removed: a reader that saw a value and a log
        # still has that log while the value is the same (the idle Fetch path's plan checks one int, not each log).
        self.logs_version = 0
        self._log_dir_of: dict[TopicPartition, Path] = {}
        self._topic_configs: dict[str, LogConfig] = {}
        self._pending_dir_deletes: list[_PendingDirDelete] = []
        # JBOD (several log.dirs): logs being copied to another dir, the dir a partition's log is to be created in,
        # and the dirs that failed (their partitions answer KAFKA_STORAGE_ERROR until a restart).
        self._future_logs: dict[TopicPartition, Log] = {}
        self._preferred_dirs: dict[TopicPartition, Path] = {}
        self.offline_dirs: set[Path] = set()
        self.offline_partitions: set[TopicPartition] = set()
        self._resume_moves: dict[TopicPartition, Path] = {}
        # Told (dir, its partitions) when a log dir fails, and (partition, old log, new log) after a move's swap.
        self.on_dir_offline: Callable[[Path, list[TopicPartition]], None] | None = None
        self.on_log_replaced: Callable[[TopicPartition, Log, Log], None] | None = None
        self._stop = threading.Event()
        self._scheduler: threading.Thread | None = None
        self.cleaner = LogCleaner(self._compacted_logs, backoff_ms=cleaner_backoff_ms)
        self._started = False

    # -- startup -------------------------------------------------------------------------------

    def startup(self) -> None:
        for log_dir in self.log_dirs:
            try:
                log_dir.mkdir(parents=True, exist_ok=True)
                self._load_dir(log_dir)
            except (OSError, KafkaStorageError) as e:
                if len(self.log_dirs) == 1 or dir_failure_cause(e) is None:
                    raise
                # Kafka starts without a log dir that cannot be read, as long as one is left.
                logger.error("Log dir %s failed to load and is offline: %s", log_dir, e)
                self._take_dir_offline(log_dir)
        if len(self.offline_dirs) == len(self.log_dirs):
            raise KafkaStorageError(f"all log dirs failed: {', '.join(map(str, self.log_dirs))}")
        for tp, dest in self._resume_moves.items():
            if tp in self._logs and self._log_dir_of[tp] != dest and dest not in self.offline_dirs:
                logger.info("Resuming the move of %s-%d to %s", tp[0], tp[1], dest)
                self.create_future_log(tp, dest)
        self._resume_moves.clear()
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
            future = _FUTURE_DIR_RE.match(child.name)
            if future is not None:
                # A move the last run did not finish: the current log still holds everything; the copy starts over.
                shutil.rmtree(child, ignore_errors=True)
                self._resume_moves[(future.group("topic"), int(future.group("partition")))] = log_dir
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
            self.logs_version += 1
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
        """None when there is no log; KafkaStorageError when it is in a failed log dir."""
        if self.offline_partitions and (topic, partition) in self.offline_partitions:
            raise KafkaStorageError(f"{topic}-{partition} is in an offline log dir")
        return self._logs.get((topic, partition))

    def get_or_create_log(self, topic: str, partition: int, config: LogConfig | None = None, *,
                          announce: bool = True, is_new: bool = True) -> Log:
        """announce=False: the caller logs one line for many logs (a topic's creation). is_new=False: a partition
        that existed before, whose log may be in a failed dir; as Kafka, none is created while a dir is offline."""
        tp = (topic, partition)
        log = self._logs.get(tp)
        if log is not None:
            return log
        with self._lock:
            log = self._logs.get(tp)
            if log is not None:
                return log
            if tp in self.offline_partitions:
                raise KafkaStorageError(f"{topic}-{partition} is in an offline log dir")
            if not is_new and self.offline_dirs:
                raise KafkaStorageError(f"Can not create log for {topic}-{partition} because log directories "
                                        f"{', '.join(map(str, sorted(self.offline_dirs)))} are offline")
            if config is not None:
                self._topic_configs[topic] = config
            config = self._config_for(topic)
            preferred = self._preferred_dirs.pop(tp, None)
            log_dir = preferred if preferred is not None and preferred not in self.offline_dirs else (
                self._least_loaded_dir())
            try:
                log = Log.open(log_dir / f"{topic}-{partition}", topic, partition, config, clean_shutdown=True)
            except OSError as e:
                raise KafkaStorageError(f"cannot create log for {topic}-{partition} in {log_dir}: {e}") from e
            self._logs[tp] = log
            self.logs_version += 1
            self._log_dir_of[tp] = log_dir
            self._watch_pending_deletes(log)
            if announce:
                logger.info("Created log for %s-%d in %s", topic, partition, log_dir)
            return log

    def _least_loaded_dir(self) -> Path:
        if len(self.log_dirs) == 1:
            return self.log_dirs[0]
        online = [d for d in self.log_dirs if d not in self.offline_dirs]
        if not online:
            raise KafkaStorageError("every log dir is offline")
        counts = dict.fromkeys(online, 0)
        for d in self._log_dir_of.values():
            counts[d] = counts.get(d, 0) + 1
        return min(online, key=lambda d: counts[d])

    def delete_log(self, topic: str, partition: int, *, announce: bool = True) -> None:
        """Forget the log now; rename its dir to <tp>.<uuid>-delete and remove it after file.delete.delay.ms
        (open fds, e.g. an in-flight sendfile, stay valid until then)."""
        tp = (topic, partition)
        with self._lock:
            self._abandon_future(tp)
            self._preferred_dirs.pop(tp, None)
            self.offline_partitions.discard(tp)
            log = self._logs.pop(tp, None)
            self.logs_version += 1
            self._log_dir_of.pop(tp, None)
            if log is None:
                return
            target = self._schedule_dir_delete(log)
        if announce:
            logger.info("Scheduled deletion of log %s-%d (%s)", topic, partition, target)

    def _schedule_dir_delete(self, log: Log) -> Path:
        target = log.dir.with_name(f"{log.dir.name}.{uuid.uuid4().hex}-delete")
        log.dir.rename(target)
        log.dir = target
        self._pending_dir_deletes.append(_PendingDirDelete(_now_ms() + log.config.file_delete_delay_ms, target, log))
        return target

    def discard_log(self, topic: str, partition: int) -> None:
        """Remove a log nobody has used yet (a topic whose creation failed) at once, files and all."""
        tp = (topic, partition)
        with self._lock:
            log = self._logs.pop(tp, None)
            self.logs_version += 1
            self._log_dir_of.pop(tp, None)
        if log is not None:
            log.delete()

    def logs(self) -> list[Log]:
        return list(self._logs.values())

    def log_dir_of(self, tp: TopicPartition) -> Path | None:
        return self._log_dir_of.get(tp)

    # -- JBOD: moving a log between log dirs (AlterReplicaLogDirs) and failed dirs ----------------

    def log_dir_named(self, path: str) -> Path:
        """The configured log dir a client names (as configured, absolute, or resolved), else LOG_DIR_NOT_FOUND;
        KAFKA_STORAGE_ERROR when it has failed (Kafka's isLogDirOnline)."""
        for d in self.log_dirs:
            if path in (str(d), str(d.absolute()), str(d.resolve())):
                if d in self.offline_dirs:
                    raise KafkaStorageError(f"Log directory {path} is offline")
                return d
        raise LogDirNotFoundError(f"Failed to find log dir {path}.")

    def future_logs(self) -> dict[TopicPartition, Log]:
        return dict(self._future_logs)

    def future_log_dir(self, tp: TopicPartition) -> Path | None:
        f = self._future_logs.get(tp)
        return None if f is None else f.dir.parent

    def maybe_update_preferred_dir(self, tp: TopicPartition, log_dir: Path) -> None:
        """Kafka's maybeUpdatePreferredLogDir: a log created later for tp goes to log_dir."""
        with self._lock:
            if self._log_dir_of.get(tp) != log_dir and self.future_log_dir(tp) != log_dir:
                self._preferred_dirs[tp] = log_dir

    def create_future_log(self, tp: TopicPartition, log_dir: Path) -> bool:
        """Start copying tp's log into log_dir (Kafka's maybeCreateFutureReplica); False when there is nothing to
        do (the log is already there, or already being copied there). A copy to another dir is dropped first."""
        with self._lock:
            current = self._logs.get(tp)
            if current is None:
                raise KafkaStorageError(f"no log for {tp[0]}-{tp[1]}")
            if self.future_log_dir(tp) is not None and self.future_log_dir(tp) != log_dir:
                self._abandon_future(tp)
            if self._log_dir_of[tp] == log_dir:
                self._preferred_dirs.pop(tp, None)
                return False
            if tp in self._future_logs:
                return False
            if self.offline_dirs:
                # Kafka creates no future log while a dir is offline: the same partition could get a copy in two.
                raise KafkaStorageError(f"Can not create the future log of {tp[0]}-{tp[1]} because log directories "
                                        f"{', '.join(map(str, sorted(self.offline_dirs)))} are offline")
            name = f"{tp[0]}-{tp[1]}.{uuid.uuid4().hex}-future"
            try:
                future = Log.open(log_dir / name, tp[0], tp[1], current.config, clean_shutdown=True,
                                  log_start_offset=current.log_start_offset)
            except OSError as e:
                self._maybe_fail(log_dir, e)
                raise KafkaStorageError(f"cannot create the future log of {tp[0]}-{tp[1]} in {log_dir}: {e}") from e
            future.become_follower(current.leader_epoch)
            future.set_hw_tracks_leo(False)
            self._future_logs[tp] = future
        logger.info("Moving %s-%d from %s to %s (future log %s)", tp[0], tp[1], self._log_dir_of.get(tp), log_dir,
                    name)
        return True

    def abandon_future_log(self, tp: TopicPartition) -> None:
        with self._lock:
            self._abandon_future(tp)

    def _abandon_future(self, tp: TopicPartition) -> None:
        future = self._future_logs.pop(tp, None)
        if future is not None:
            logger.info("Dropping the future log of %s-%d in %s", tp[0], tp[1], future.dir.parent)
            try:
                future.delete()
            except OSError as e:
                logger.warning("Removing future log %s failed: %s", future.dir, e)

    def copy_to_future(self, tp: TopicPartition, future: Log, max_bytes: int = FUTURE_COPY_BYTES) -> int:
        """One step of Kafka's ReplicaAlterLogDirsThread: append the current log's next batches to its future log.
        Returns bytes copied. Anything the future cannot follow (retention or truncation of the current log below
        it, compaction under it) starts the copy over at the current log start."""
        current = self._logs.get(tp)
        if current is None or self._future_logs.get(tp) is not future:
            return 0
        if (future.log_end_offset > current.log_end_offset or future.log_end_offset < current.log_start_offset
                or self._diverged(current, future)):
            future.truncate_fully_and_start_at(current.log_start_offset)
        try:
            info = current.read(future.log_end_offset, max_bytes)
        except OffsetOutOfRangeError:
            future.truncate_fully_and_start_at(current.log_start_offset)
            return 0
        except KafkaStorageError as e:
            self.maybe_fail_dir(current, e)
            raise
        records = info.records
        if records is None:
            return 0
        data = records.read_bytes() if isinstance(records, FileRecordsSlice) else bytes(records)
        try:
            future.append_as_follower(data)
        except UnexpectedAppendOffsetError:
            future.truncate_fully_and_start_at(current.log_start_offset)
            return 0
        except KafkaStorageError as e:
            self.maybe_fail_dir(future, e)
            raise
        return len(data)

    @staticmethod
    def _diverged(current: Log, future: Log) -> bool:
        """Whether the current log was truncated and written again below the future's end (a follower's truncation
        to its leader): the future's last leader epoch must end at or past the future's end in the current log."""
        epoch = future.latest_epoch
        if epoch < 0:
            return False
        # An epoch the current log does not know (-1) tells nothing: only a known end below the future's counts.
        _, end = current.end_offset_for_epoch(epoch)
        return 0 <= end < future.log_end_offset

    def replace_current_with_future(self, tp: TopicPartition) -> Log | None:
        """Kafka's replaceCurrentWithFutureLog, once the future log is close behind: with the current log's lock
        held (appends wait), copy the rest, make the future durable, rename it to <topic>-<p> in its dir, and
        rename the current one to -delete. Returns the new current log (None when the move is gone meanwhile).

        A kill -9 in between leaves a whole copy either way: before the first rename the -future directory is
        removed at the next start (and the move resumes), after it both directories hold the whole log."""
        with self._lock:
            current = self._logs.get(tp)
            future = self._future_logs.get(tp)
        if current is None or future is None:
            return None
        dest = future.dir.parent
        with current._lock:
            while future.log_end_offset < current.log_end_offset:
                if self.copy_to_future(tp, future) == 0 and future.log_end_offset < current.log_end_offset:
                    return None  # started over: the move goes on
            if future.log_end_offset != current.log_end_offset:
                return None
            future.update_high_watermark(current.high_watermark)
            if future.log_start_offset < current.log_start_offset:
                future.delete_records_before(min(current.log_start_offset, future.high_watermark))
            target = dest / f"{tp[0]}-{tp[1]}"
            try:
                future.flush()
                future.close()
                future.dir.rename(target)
                fsync_dir(dest)
                new = Log.open(target, tp[0], tp[1], current.config, recovery_point=future.log_end_offset,
                               log_start_offset=current.log_start_offset, clean_shutdown=True,
                               high_watermark=current.high_watermark)
            except (OSError, KafkaStorageError) as e:
                if not self._maybe_fail(dest, e) and target.exists() and not future.dir.exists():
                    # Renamed but not reopened: the next start finds two whole copies; drop this one now.
                    shutil.rmtree(target, ignore_errors=True)
                raise
            new.leader_epoch = current.leader_epoch
            new._leading = current._leading
            new._hw_tracks_leo = current._hw_tracks_leo
            new._hw = current.high_watermark
            new.validate_producer_state = current.validate_producer_state
            current.replaced_by = new
            with self._lock:
                self._logs[tp] = new
                self.logs_version += 1
                self._log_dir_of[tp] = dest
                self._future_logs.pop(tp, None)
                self._preferred_dirs.pop(tp, None)
                self._watch_pending_deletes(new)
                old_dir = current.dir
                self._schedule_dir_delete(current)
        logger.info("Moved %s-%d from %s to %s (log end %d)", tp[0], tp[1], old_dir.parent, dest, new.log_end_offset)
        if self.on_log_replaced is not None:
            self.on_log_replaced(tp, current, new)
        return new

    def maybe_fail_dir(self, log: Log, exc: BaseException) -> bool:
        """An I/O error on a log: when it means its log dir is unusable, take the whole dir offline (Kafka's
        LogDirFailureChannel.maybeAddOfflineLogDir). True when the dir went offline."""
        cause = dir_failure_cause(exc)
        if cause is None:
            return False
        tp = (log.topic, log.partition)
        with self._lock:
            if self._logs.get(tp) is log:
                log_dir = self._log_dir_of[tp]
            elif self._future_logs.get(tp) is log:
                log_dir = log.dir.parent
            else:
                return False  # a deleted or replaced log's old files
        return self._maybe_fail(log_dir, cause)

    def _maybe_fail(self, log_dir: Path, exc: BaseException) -> bool:
        if dir_failure_cause(exc) is None or log_dir in self.offline_dirs:
            return False
        logger.error("Error on log dir %s: %s. Stopping serving replicas in it", log_dir, exc)
        gone = self._take_dir_offline(log_dir)
        if self.on_dir_offline is not None:
            self.on_dir_offline(log_dir, gone)
        return True

    def _take_dir_offline(self, log_dir: Path) -> list[TopicPartition]:
        closing: list[Log] = []
        with self._lock:
            self.offline_dirs.add(log_dir)
            gone = [tp for tp, d in self._log_dir_of.items() if d == log_dir]
            for tp in gone:
                closing.append(self._logs.pop(tp))
                self.logs_version += 1
                del self._log_dir_of[tp]
                self.offline_partitions.add(tp)
            for tp, future in list(self._future_logs.items()):
                if tp in self.offline_partitions or future.dir.parent == log_dir:
                    closing.append(self._future_logs.pop(tp))
            for tp, d in list(self._preferred_dirs.items()):
                if d == log_dir:
                    del self._preferred_dirs[tp]
        for log in closing:
            try:
                log.close(persist=False)
            except Exception as e:  # noqa: BLE001 - the dir failed; its files are left as they are
                logger.debug("Closing %s in failed log dir %s: %s", log.name, log_dir, e)
        logger.error("Log dir %s is offline: %d partitions offline (%s)", log_dir, len(gone),
                     ", ".join(f"{t}-{p}" for t, p in gone[:8]) + ("..." if len(gone) > 8 else ""))
        return gone

    def update_topic_config(self, topic: str, config: LogConfig) -> None:
        with self._lock:
            self._topic_configs[topic] = config
            for (t, _), log in self._logs.items():
                if t == topic:
                    log.update_config(config)

    def _compacted_logs(self) -> Iterable[Log]:
        # Cleaning pauses while a log is copied to another dir (Kafka's abortAndPauseCleaning): the copy follows
        # the log's batches, which cleaning would rewrite under it.
        moving = self._future_logs
        return [log for log in self.logs() if log.config.compact and (log.topic, log.partition) not in moving]

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
                    self.maybe_fail_dir(log, e)
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
            by_dir: dict[Path, dict[TopicPartition, Log]] = {d: {} for d in self.log_dirs
                                                             if d not in self.offline_dirs}
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
            except OSError as e:  # a full log dir: retried at the next interval; a failed one goes offline
                ok = False
                logger.error("Failed to write checkpoints in %s: %s", log_dir, e)
                self._maybe_fail(log_dir, e)
        return ok and self.checkpoint_high_watermarks()

    def checkpoint_high_watermarks(self) -> bool:
        """replication-offset-checkpoint in every log dir (replicated brokers only)."""
        if self.high_watermark_checkpoint_interval_ms is None:
            return True
        with self._lock:
            by_dir: dict[Path, dict[TopicPartition, int]] = {d: {} for d in self.log_dirs
                                                            if d not in self.offline_dirs}
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
        for future in self.future_logs().values():
            # Its directory stays: the next start removes it and copies again.
            future.close(persist=False)
        if not clean:
            # Without the marker the next start recovers from the checkpoints instead of trusting them.
            logger.error("Log manager shut down with errors; next start will run recovery")
            return
        for log_dir in self.log_dirs:
            if log_dir not in self.offline_dirs:
                (log_dir / CLEAN_SHUTDOWN_MARKER).touch()
        logger.info("Log manager shut down cleanly")

"""kbroker-admin consumer-groups: kafka-consumer-groups.sh's flags and output columns."""

from __future__ import annotations

import argparse
import re
import sys
import time
from datetime import datetime
from typing import Any

from kbroker_tools.admin.common import CommandError, ToolParser, add_connection_args, admin_client, result

NO_ACTION = ("WARN: No action will be performed as the --execute option is missing. In a future major release, "
             "the default behavior of this command will be to prompt the user before executing the reset rather "
             "than doing a dry run. You should add the --dry-run option explicitly if you are scripting this "
             "command and want to keep the current default behavior without prompting.")


def parser() -> argparse.ArgumentParser:
    ap = ToolParser(prog="kbroker-admin consumer-groups",
                                 description="List, describe, reset the offsets of, or delete consumer groups.")
    add_connection_args(ap)
    action = ap.add_mutually_exclusive_group(required=True)
    for flag in ("--list", "--describe", "--reset-offsets", "--delete", "--delete-offsets"):
        action.add_argument(flag, action="store_true")
    ap.add_argument("--group", action="append", default=[], help="consumer group (repeatable)")
    ap.add_argument("--all-groups", action="store_true")
    view = ap.add_mutually_exclusive_group()
    view.add_argument("--offsets", action="store_true", help="--describe: offsets and lag (the default)")
    view.add_argument("--members", action="store_true", help="--describe: the group's members")
    view.add_argument("--state", nargs="?", const="", default=None, metavar="STATE[,STATE]",
                      help="--describe: the group's state and coordinator; --list: each group's state, or only the "
                           "groups in these states (Stable, Empty, PreparingRebalance, CompletingRebalance, Dead)")
    ap.add_argument("--topic", action="append", default=[], metavar="TOPIC[:P1,P2]",
                    help="--reset-offsets: a topic, optionally with partitions")
    ap.add_argument("--all-topics", action="store_true", help="--reset-offsets: every topic the group committed")
    spec = ap.add_mutually_exclusive_group()
    spec.add_argument("--to-earliest", action="store_true")
    spec.add_argument("--to-latest", action="store_true")
    spec.add_argument("--to-current", action="store_true")
    spec.add_argument("--to-offset", type=int)
    spec.add_argument("--shift-by", type=int)
    spec.add_argument("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS.sss[Z|+hh:mm]")
    spec.add_argument("--by-duration", metavar="PnDTnHnMn.nS", help="reset to the offsets of this long ago")
    spec.add_argument("--from-file", metavar="FILE",
                      help="reset to the offsets in a CSV file: topic,partition,offset lines (as --export writes "
                           "them), or group,topic,partition,offset for several groups")
    ap.add_argument("--export", action="store_true",
                    help="--reset-offsets: print the new offsets as CSV (topic,partition,offset)")
    run_mode = ap.add_mutually_exclusive_group()
    run_mode.add_argument("--execute", action="store_true")
    run_mode.add_argument("--dry-run", action="store_true")
    return ap


def run(_name: str, argv: list[str]) -> int:
    args = parser().parse_args(argv)
    admin = admin_client(args)
    if args.list:
        return list_groups(admin, args.state)
    groups = list(args.group)
    if args.all_groups:
        groups = sorted(x.group_id for x in result(admin.list_consumer_groups(request_timeout=30),
                                                   "listing groups").valid)
    if not groups:
        raise CommandError("--group or --all-groups is required")
    if args.describe:
        return max((describe(admin, g, args) for g in groups), default=0)
    if args.reset_offsets:
        if args.from_file:  # read and checked for every group before any group's offsets change
            args.reset_plan = read_reset_plan(args.from_file, single_group=len(args.group) == 1 and not args.all_groups,
                                               group=groups[0])
            for g in groups:
                if g not in args.reset_plan:
                    raise CommandError(f"No reset plan for group {g} found")
        if not args.execute and not args.dry_run and not args.export:
            print(NO_ACTION, file=sys.stderr)  # Kafka's tool warns on stderr, once, before anything is done
        plans = {g: reset_offsets(admin, g, args) for g in groups}
        if args.export:
            for g, new in plans.items():
                for (t, p), o in sorted(new.items()):
                    print(f"{g},{t},{p},{o}" if len(plans) > 1 else f"{t},{p},{o}")
        else:
            print_reset_plans(plans)
        return 0
    if args.delete_offsets:
        from kbroker_tools.admin.offset_delete import delete_offsets

        if len(groups) != 1:
            raise CommandError("--delete-offsets takes exactly one --group")
        return delete_offsets(admin, args, groups[0])
    return delete(admin, groups)


STATES = {"stable": "Stable", "empty": "Empty", "preparingrebalance": "PreparingRebalance",
          "completingrebalance": "CompletingRebalance", "dead": "Dead", "unknown": "Unknown"}


def list_groups(admin: Any, state: str | None) -> int:
    """--list, and with --state each group's state (kafka-consumer-groups' GROUP / STATE table), or only the
    groups in the given states."""
    wanted: set[str] = set()
    for item in (state or "").split(","):
        if item.strip():
            name = STATES.get(item.strip().lower())
            if name is None:
                raise CommandError(f"--state {item.strip()!r}: expected one of {', '.join(STATES.values())}")
            wanted.add(name)
    listing = result(admin.list_consumer_groups(request_timeout=30), "listing groups")
    if state is None:
        for g in sorted(x.group_id for x in listing.valid):
            print(g)
        return 0
    rows = [[x.group_id, _state_name(x.state.name)] for x in sorted(listing.valid, key=lambda x: x.group_id)]
    rows = [r for r in rows if not wanted or r[1] in wanted]
    _kafka_table(["GROUP", "STATE"], rows, fixed={})
    return 0


# ---------------------------------------------------------------- describe


def _describe_group(admin: Any, group: str) -> Any | None:
    """The group's description, or None when the broker cannot describe groups (DescribeGroups unsupported,
    as librdkafka's mock cluster): offsets and lag are still shown then."""
    fut = admin.describe_consumer_groups([group], request_timeout=30)[group]
    try:
        return result(fut, f"describing group {group}")
    except CommandError as e:
        if "UNSUPPORTED" in str(e).upper() or "not supported" in str(e):
            print(f"(the broker cannot describe groups: {e}; members are not shown)", file=sys.stderr)
            return None
        raise


def _committed(admin: Any, group: str, every_partition: bool = False) -> dict[tuple[str, int], int]:
    """The group's committed offsets. every_partition asks for each partition of each topic by name, for
    brokers that do not answer OffsetFetch for "all topics" (librdkafka's mock cluster)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    tps = None
    if every_partition:
        md = admin.list_topics(timeout=30)
        tps = [TopicPartition(t, p) for t, tm in sorted(md.topics.items()) if not t.startswith("__")
               for p in sorted(tm.partitions)]
    fut = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, tps)], request_timeout=30)[group]
    res = result(fut, f"fetching the offsets of group {group}")
    return {(tp.topic, tp.partition): tp.offset for tp in res.topic_partitions if tp.offset >= 0}


def _offsets(admin: Any, tps: list[tuple[str, int]], spec: Any) -> dict[tuple[str, int], int]:
    from confluent_kafka import TopicPartition

    if not tps:
        return {}
    futs = admin.list_offsets({TopicPartition(t, p): spec for t, p in tps}, request_timeout=30)
    return {(tp.topic, tp.partition): result(f, f"listing offsets of {tp.topic}-{tp.partition}").offset
            for tp, f in futs.items()}


def describe(admin: Any, group: str, args: argparse.Namespace) -> int:
    from confluent_kafka.admin import OffsetSpec

    desc = _describe_group(admin, group)
    state = desc.state.name if desc is not None else "UNKNOWN"
    if desc is not None and state == "DEAD":
        print(f"Error: Consumer group '{group}' does not exist.", file=sys.stderr)
        return 1
    members = list(desc.members) if desc is not None else []
    if args.state is not None:
        coordinator = f"{desc.coordinator.host}:{desc.coordinator.port} ({desc.coordinator.id})" if desc else "-"
        strategy = (desc.partition_assignor or "") if desc else ""
        print()
        _kafka_table(["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"],
                     [[group, coordinator, strategy, _state_name(state), len(members)]], fixed={})
        return 0
    if args.members:
        if not members:
            print(f"\nConsumer group '{group}' has no active members.")
        print()
        _kafka_table(["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"],
                     [[group, m.member_id, m.host, m.client_id,
                       len(m.assignment.topic_partitions) if m.assignment else 0] for m in members],
                     fixed={"#PARTITIONS": 12})
        return 0
    committed = _committed(admin, group, every_partition=desc is None)
    owner: dict[tuple[str, int], Any] = {}
    for m in members:
        for tp in m.assignment.topic_partitions if m.assignment else []:
            owner[(tp.topic, tp.partition)] = m
    tps = sorted(set(committed) | set(owner))
    end = _offsets(admin, tps, OffsetSpec.latest())
    if not members and desc is not None:
        print(f"\nConsumer group '{group}' has no active members.")
    rows = []
    for t, p in tps:
        cur = committed.get((t, p))
        leo = end.get((t, p))
        lag = leo - cur if cur is not None and leo is not None else None
        m = owner.get((t, p))
        rows.append([group, t, p, cur, leo, lag, m.member_id if m else None, f"/{m.host}" if m else None,
                     m.client_id if m else None])
    print()
    _kafka_table(["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST",
                  "CLIENT-ID"], rows, fixed={"PARTITION": 10, "CURRENT-OFFSET": 15, "LOG-END-OFFSET": 15, "LAG": 15})
    return 0


def _state_name(state: str) -> str:
    return {"PREPARING_REBALANCE": "PreparingRebalance", "COMPLETING_REBALANCE": "CompletingRebalance",
            "PREPARING_REBALANCING": "PreparingRebalance", "COMPLETING_REBALANCING": "CompletingRebalance"}.get(
        state, state.capitalize())


def _kafka_table(headers: list[str], rows: list[list[Any]], fixed: dict[str, int]) -> None:
    """ConsumerGroupCommand's printf layout: fixed-width numeric columns, the others as wide as their longest
    value and at least 15, the last column unpadded."""
    cells = [["-" if c is None else str(c) for c in r] for r in rows]
    widths = []
    for i, h in enumerate(headers):
        if h in fixed:
            widths.append(fixed[h])
        else:
            widths.append(max([len(h), 15, *(len(r[i]) for r in cells)]))
    for r in [headers, *cells]:
        print(" ".join(c.ljust(w) if i < len(r) - 1 else c for i, (c, w) in enumerate(zip(r, widths, strict=True))))


# ---------------------------------------------------------------- reset-offsets


def _reset_scope(admin: Any, group: str, args: argparse.Namespace) -> list[tuple[str, int]]:
    if args.all_topics:
        return sorted(_committed(admin, group, every_partition=True))
    if not args.topic:
        raise CommandError("--reset-offsets needs --topic or --all-topics")
    md = admin.list_topics(timeout=30)
    tps: list[tuple[str, int]] = []
    for spec in args.topic:
        topic, _, parts = spec.partition(":")
        tm = md.topics.get(topic)
        if tm is None or tm.error is not None:
            raise CommandError(f"Topic '{topic}' does not exist")
        try:
            ids = [int(x) for x in parts.split(",")] if parts else sorted(tm.partitions)
        except ValueError:
            raise CommandError(f"--topic {spec!r}: expected TOPIC or TOPIC:P1,P2 with partition numbers") from None
        missing = [p for p in ids if p not in tm.partitions]
        if missing:
            raise CommandError(f"Topic '{topic}' has no partition {missing[0]}")
        tps += [(topic, p) for p in ids]
    return tps


def _existing(admin: Any, tps: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The partitions of a reset plan, each checked to exist (one line naming the first that does not)."""
    md = admin.list_topics(timeout=30)
    for topic, p in tps:
        tm = md.topics.get(topic)
        if tm is None or tm.error is not None:
            raise CommandError(f"Topic '{topic}' does not exist")
        if p not in tm.partitions:
            raise CommandError(f"Topic '{topic}' has no partition {p}")
    return tps


def read_reset_plan(path: str, single_group: bool, group: str) -> dict[str, dict[tuple[str, int], int]]:
    """--from-file's CSV, read as kafka-consumer-groups reads it: `topic,partition,offset` lines when one --group
    is given and the first line has that form, else `group,topic,partition,offset` lines."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [(n, line.strip()) for n, line in enumerate(f.read().split("\n"), 1) if line.strip()]
    except OSError as e:
        raise CommandError(f"--from-file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise CommandError(f"--from-file {path}: not a UTF-8 text file") from None
    no_group = single_group and bool(lines) and _csv_row(lines[0][1], 3) is not None
    plan: dict[str, dict[tuple[str, int], int]] = {}
    for n, line in lines:
        row = _csv_row(line, 3 if no_group else 4)
        if row is None:
            expected = "topic,partition,offset" if no_group or single_group else "group,topic,partition,offset"
            raise CommandError(f"--from-file {path} line {n}: {line!r} is not {expected} (partition and offset "
                               "whole numbers)")
        g, topic, partition, offset = (group, *row) if no_group else row
        plan.setdefault(str(g), {})[(str(topic), int(partition))] = int(offset)
    return plan


def _csv_row(line: str, columns: int) -> tuple[str | int, ...] | None:
    """One CSV line of `columns` fields whose last two are a partition (>= 0) and an offset, or None."""
    fields = [f.strip() for f in line.split(",")]
    if len(fields) != columns or not all(fields[:-2]):
        return None
    try:
        partition, offset = int(fields[-2]), int(fields[-1])
    except ValueError:
        return None
    if partition < 0:
        return None
    return (*fields[:-2], partition, offset)


def _parse_datetime(text: str) -> int:
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(f"--to-datetime {text!r}: expected YYYY-MM-DDTHH:mm:SS.sss, optionally with a zone "
                           "(Z or +hh:mm)") from None
    if dt.tzinfo is None:
        dt = dt.astimezone()  # Kafka's tool reads a time without zone in the local zone
    return int(dt.timestamp() * 1000)


def _parse_duration(text: str) -> int:
    """java.time.Duration's ISO 8601 text (PnDTnHnMn.nS, as --by-duration takes it) in milliseconds."""
    m = re.fullmatch(r"([-+]?)P(?:([-+]?\d+)D)?(?:T(?:([-+]?\d+)H)?(?:([-+]?\d+)M)?(?:([-+]?\d+(?:\.\d+)?)S)?)?",
                     text.strip().upper())
    if not m or text.strip().upper() in ("P", "PT") or text.strip().upper().endswith("T"):
        raise CommandError(f"--by-duration {text!r}: expected an ISO 8601 duration such as PT1H30M or P1DT12H")
    sign, d, h, mi, sec = m.groups()
    ms = ((int(d or 0) * 24 + int(h or 0)) * 60 + int(mi or 0)) * 60_000 + round(float(sec or 0) * 1000)
    return -ms if sign == "-" else ms


def reset_offsets(admin: Any, group: str, args: argparse.Namespace) -> dict[tuple[str, int], int]:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    if not (args.to_earliest or args.to_latest or args.to_current or args.to_offset is not None
            or args.shift_by is not None or args.to_datetime or args.by_duration or args.from_file):
        raise CommandError("--reset-offsets needs one of --to-earliest, --to-latest, --to-current, --to-offset, "
                           "--shift-by, --to-datetime, --by-duration, --from-file")
    planned: dict[tuple[str, int], int] = args.reset_plan.get(group, {}) if args.from_file else {}
    when_ms = _parse_datetime(args.to_datetime) if args.to_datetime else None
    if args.by_duration:
        when_ms = int(time.time() * 1000) - _parse_duration(args.by_duration)
    desc = _describe_group(admin, group)
    if desc is not None and desc.state.name not in ("EMPTY", "DEAD", "UNKNOWN"):
        raise CommandError(f"Assignments can only be reset if the group '{group}' is inactive, but the current "
                           f"state is {_state_name(desc.state.name)}.")
    tps = _existing(admin, sorted(planned)) if args.from_file else _reset_scope(admin, group, args)
    earliest = _offsets(admin, tps, OffsetSpec.earliest())
    latest = _offsets(admin, tps, OffsetSpec.latest())
    committed = _committed(admin, group, every_partition=True) if args.to_current or args.shift_by is not None else {}
    by_time: dict[tuple[str, int], int] = {}
    if when_ms is not None:
        by_time = _offsets(admin, tps, OffsetSpec.for_timestamp(when_ms))
    new: dict[tuple[str, int], int] = {}
    for tp in tps:
        lo, hi = earliest[tp], latest[tp]
        if args.to_earliest:
            target = lo
        elif args.to_latest:
            target = hi
        elif args.to_current:
            target = committed.get(tp, hi)
        elif args.to_offset is not None:
            target = args.to_offset
        elif args.shift_by is not None:
            target = committed.get(tp, lo) + args.shift_by
        elif args.from_file:
            target = planned[tp]
        else:
            target = by_time[tp] if by_time.get(tp, -1) >= 0 else hi
        new[tp] = min(max(target, lo), hi)  # out of range is clamped, as Kafka's tool does, with its warning
        if target > hi:
            print(f"WARN: New offset ({target}) is higher than latest offset for topic partition {tp[0]}-{tp[1]}. "
                  f"Value will be set to {hi}", file=sys.stderr)
        elif target < lo:
            print(f"WARN: New offset ({target}) is lower than earliest offset for topic partition {tp[0]}-{tp[1]}. "
                  f"Value will be set to {lo}", file=sys.stderr)
    if args.execute:
        req = ConsumerGroupTopicPartitions(group, [TopicPartition(t, p, o) for (t, p), o in new.items()])
        res = result(admin.alter_consumer_group_offsets([req], request_timeout=30)[group],
                     f"resetting the offsets of group {group}")
        failed = [tp for tp in res.topic_partitions if tp.error is not None]
        if failed:
            raise CommandError(f"resetting {failed[0].topic}-{failed[0].partition}: {failed[0].error}")
    return new


def print_reset_plans(plans: dict[str, dict[tuple[str, int], int]]) -> None:
    """ConsumerGroupCommand's printOffsetsToReset: one table for every group, in its fixed-width format."""
    line = "{:<30} {:<30} {:<10} {:<15}"
    print()
    print(line.format("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"))
    for group, new in plans.items():
        for (t, p), o in sorted(new.items()):
            print(line.format(group, t, p, o))


# ---------------------------------------------------------------- delete


def delete(admin: Any, groups: list[str]) -> int:
    futures = admin.delete_consumer_groups(groups, request_timeout=30)
    failed = []
    for g, fut in futures.items():
        try:
            result(fut, f"deleting group {g}")
        except CommandError as e:
            failed.append((g, str(e)))
    if not failed:
        print(f"Deletion of requested consumer groups ({', '.join(repr(g) for g in groups)}) was successful.")
        return 0
    print("Deletion of some consumer groups failed:")
    for g, err in failed:
        print(f"* Group '{g}' could not be deleted due to: {err}")
    return 1

"""kbroker-admin share-groups: kafka-share-groups.sh's --list, --describe (--members, --state), --delete,
--reset-offsets (AlterShareGroupOffsets) and --delete-offsets (DeleteShareGroupOffsets)."""

from __future__ import annotations

import argparse

from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    AlterShareGroupOffsetsRequest,
    DeleteGroupsRequest,
    DeleteShareGroupOffsetsRequest,
    FindCoordinatorRequest,
    ListGroupsRequest,
    ListOffsetsRequest,
    MetadataRequest,
    ShareGroupDescribeRequest,
)

from kbroker_tools.admin.common import CommandError, add_connection_args
from kbroker_tools.wire import WireClient


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="kbroker-admin share-groups", description="List, describe or delete share groups (KIP-932)."
    )
    add_connection_args(ap)
    action = ap.add_mutually_exclusive_group(required=True)
    for flag in ("--list", "--describe", "--delete", "--reset-offsets", "--delete-offsets"):
        action.add_argument(flag, action="store_true")
    ap.add_argument("--group", action="append", default=[], help="share group (repeatable)")
    ap.add_argument("--topic", action="append", default=[], help="--reset-offsets/--delete-offsets: topic")
    to = ap.add_mutually_exclusive_group()
    to.add_argument("--to-earliest", action="store_true", help="--reset-offsets: to the log start offset")
    to.add_argument("--to-latest", action="store_true", help="--reset-offsets: to the log end offset")
    to.add_argument("--to-offset", type=int, help="--reset-offsets: to this offset")
    run_mode = ap.add_mutually_exclusive_group()
    run_mode.add_argument(
        "--dry-run", action="store_true", help="--reset-offsets: show, change nothing (default)"
    )
    run_mode.add_argument("--execute", action="store_true", help="--reset-offsets: apply")
    view = ap.add_mutually_exclusive_group()
    view.add_argument("--members", action="store_true", help="--describe: the group's members (the default)")
    view.add_argument("--state", action="store_true", help="--describe: the group's state")
    return ap


def _error(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error {code}"


def _table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print(" ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def run(_name: str, argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.command_config:
        raise CommandError("share-groups speaks PLAINTEXT only for now: --command-config is not supported")
    try:
        client = WireClient(args.bootstrap_server.split(",")[0])
    except OSError as e:
        raise CommandError(f"cannot connect to {args.bootstrap_server}: {e}") from None
    with client as w:
        if args.list:
            groups = w.request(16, 5, ListGroupsRequest(types_filter=["share"])).groups
            for g in sorted(x.group_id for x in groups):
                print(g)
            return 0
        if not args.group:
            raise CommandError("--group is required")
        if args.reset_offsets:
            return _reset_offsets(w, args)
        if args.delete_offsets:
            return _delete_offsets(w, args)
        if args.delete:
            results = w.request(42, 2, DeleteGroupsRequest(groups_names=args.group)).results
            failed = 0
            for r in results:
                if r.error_code:
                    failed += 1
                    print(f"Group '{r.group_id}' could not be deleted due to: {_error(r.error_code)}")
                else:
                    print(f"Deletion of requested share groups ('{r.group_id}') was successful.")
            return 1 if failed else 0
        described = w.request(77, 1, ShareGroupDescribeRequest(group_ids=args.group)).groups
        names: dict[bytes, str] = {}
        for d in described:
            if d.error_code:
                raise CommandError(f"Group '{d.group_id}': {_error(d.error_code)}")
            if args.state:
                _table([["GROUP", "STATE", "#MEMBERS"], [d.group_id, d.group_state, str(len(d.members))]])
                continue
            rows = [["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"]]
            for m in d.members:
                parts = [
                    (t.topic_name or names.get(t.topic_id, "?"), p)
                    for t in m.assignment.topic_partitions
                    for p in t.partitions
                ]
                rows.append(
                    [
                        d.group_id,
                        m.member_id,
                        m.client_host,
                        m.client_id,
                        str(len(parts)),
                        ",".join(f"{t}:{p}" for t, p in parts) or "-",
                    ]
                )
            _table(rows)
    return 0


def _one_group_and_topics(args: argparse.Namespace, action: str) -> str:
    if len(args.group) != 1:
        raise CommandError(f"{action} takes exactly one --group")
    if not args.topic:
        raise CommandError(f"{action} needs --topic")
    return str(args.group[0])


def _partitions(w: WireClient, topics: list[str]) -> dict[str, int]:
    md = w.request(
        3, 12, MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=t) for t in topics])
    )
    out = {}
    for t in md.topics:
        if t.error_code:
            raise CommandError(f"Topic '{t.name}': {_error(t.error_code)}")
        out[t.name] = len(t.partitions)
    return out


def _on_coordinator(w: WireClient, group: str) -> WireClient:
    """A connection to the group's coordinator (Alter/DeleteShareGroupOffsets go there, as Kafka's admin client
    sends them)."""
    fc = w.request(10, 4, FindCoordinatorRequest(key_type=0, coordinator_keys=[group])).coordinators[0]
    if fc.error_code:
        raise CommandError(f"Group '{group}': no coordinator: {_error(fc.error_code)}")
    try:
        return WireClient(f"{fc.host}:{fc.port}")
    except OSError as e:
        raise CommandError(f"cannot connect to the coordinator {fc.host}:{fc.port}: {e}") from None


def _reset_offsets(w: WireClient, args: argparse.Namespace) -> int:
    group = _one_group_and_topics(args, "--reset-offsets")
    if not (args.to_earliest or args.to_latest or args.to_offset is not None):
        raise CommandError("--reset-offsets needs one of --to-earliest, --to-latest, --to-offset")
    counts = _partitions(w, args.topic)
    if args.to_offset is not None:
        if args.to_offset < 0:
            raise CommandError("--to-offset must not be negative")
        new = {(t, p): args.to_offset for t, n in counts.items() for p in range(n)}
    else:
        L = ListOffsetsRequest
        ts = -2 if args.to_earliest else -1
        got = w.request(
            2,
            7,
            L(
                replica_id=-1,
                topics=[
                    L.ListOffsetsTopic(
                        name=t,
                        partitions=[
                            L.ListOffsetsPartition(partition_index=p, timestamp=ts) for p in range(n)
                        ],
                    )
                    for t, n in counts.items()
                ],
            ),
        )
        new = {}
        for t in got.topics:
            for p in t.partitions:
                if p.error_code:
                    raise CommandError(f"Partition {t.name}-{p.partition_index}: {_error(p.error_code)}")
                new[(t.name, p.partition_index)] = p.offset
    if args.execute:
        A = AlterShareGroupOffsetsRequest
        with _on_coordinator(w, group) as c:
            r = c.request(
                91,
                0,
                A(
                    group_id=group,
                    topics=[
                        A.AlterShareGroupOffsetsRequestTopic(
                            topic_name=t,
                            partitions=[
                                A.AlterShareGroupOffsetsRequestPartition(partition_index=p, start_offset=o)
                                for (tt, p), o in sorted(new.items())
                                if tt == t
                            ],
                        )
                        for t in counts
                    ],
                ),
            )
        if r.error_code:
            raise CommandError(f"Group '{group}': {r.error_message or _error(r.error_code)}")
        for t in r.responses:
            for p in t.partitions:
                if p.error_code:
                    raise CommandError(
                        f"Partition {t.topic_name}-{p.partition_index}: {_error(p.error_code)}"
                    )
    rows = [["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]]
    rows += [[group, t, str(p), str(o)] for (t, p), o in sorted(new.items())]
    _table(rows)
    return 0


def _delete_offsets(w: WireClient, args: argparse.Namespace) -> int:
    group = _one_group_and_topics(args, "--delete-offsets")
    D = DeleteShareGroupOffsetsRequest
    with _on_coordinator(w, group) as c:
        r = c.request(
            92,
            0,
            D(
                group_id=group,
                topics=[D.DeleteShareGroupOffsetsRequestTopic(topic_name=t) for t in args.topic],
            ),
        )
    if r.error_code:
        raise CommandError(f"Group '{group}': {r.error_message or _error(r.error_code)}")
    rows = [["TOPIC", "STATUS"]]
    failed = 0
    for t in r.responses:
        if t.error_code:
            failed += 1
        rows.append(
            [
                t.topic_name,
                f"Error: {t.error_message or _error(t.error_code)}" if t.error_code else "Successful",
            ]
        )
    _table(rows)
    return 1 if failed else 0

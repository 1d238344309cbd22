"""kbroker-admin share-groups: kafka-share-groups.sh's --list, --describe (--members, --state) and --delete."""

from __future__ import annotations

import argparse

from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import DeleteGroupsRequest, ListGroupsRequest, ShareGroupDescribeRequest

from kbroker_tools.admin.common import CommandError, add_connection_args
from kbroker_tools.wire import WireClient


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="kbroker-admin share-groups", description="List, describe or delete share groups (KIP-932)."
    )
    add_connection_args(ap)
    action = ap.add_mutually_exclusive_group(required=True)
    for flag in ("--list", "--describe", "--delete"):
        action.add_argument(flag, action="store_true")
    ap.add_argument("--group", action="append", default=[], help="share group (repeatable)")
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

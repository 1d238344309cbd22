"""kbroker-admin consumer-groups --delete-offsets: OffsetDelete sent to the group's coordinator (librdkafka has no
admin call for it), printed as kafka-consumer-groups prints it."""

from __future__ import annotations

import argparse
from typing import Any

from kbroker_tools.admin.common import CommandError, check_reachable
from kbroker_tools.wire import WireClient

FIND_COORDINATOR, OFFSET_DELETE = 10, 47


def _error_name(code: int) -> str:
    from kbroker.protocol.errors import ErrorCode

    return ErrorCode(code).name if code in ErrorCode._value2member_map_ else str(code)


def _coordinator(bootstrap: str, group: str) -> str:
    from kbroker.protocol.messages import FindCoordinatorRequest

    with WireClient(bootstrap, client_id="kbroker-admin") as c:
        resp: Any = c.request(FIND_COORDINATOR, 3, FindCoordinatorRequest(key=group, key_type=0))
    if resp.error_code:
        raise CommandError(f"finding the coordinator of group {group}: {_error_name(resp.error_code)}")
    host = f"[{resp.host}]" if ":" in resp.host else resp.host
    return f"{host}:{resp.port}"


def delete_offsets(admin: Any, args: argparse.Namespace, group: str) -> int:
    from kbroker.protocol.messages import OffsetDeleteRequest as Req

    if not args.topic:
        raise CommandError("--delete-offsets needs --topic TOPIC[:P1,P2]")
    md = admin.list_topics(timeout=30)
    wanted: dict[str, list[int]] = {}
    for spec in args.topic:
        topic, _, parts = spec.partition(":")
        tm = md.topics.get(topic)
        try:
            ids = [int(x) for x in parts.split(",")] if parts else sorted(tm.partitions) if tm else []
        except ValueError:
            raise CommandError(
                f"--topic {spec!r}: expected TOPIC or TOPIC:P1,P2 with partition numbers"
            ) from None
        wanted.setdefault(topic, []).extend(ids)
    bootstrap = args.bootstrap_server.split(",")[0].strip()
    check_reachable(args.bootstrap_server)
    req = Req(
        group_id=group,
        topics=[
            Req.OffsetDeleteRequestTopic(
                name=t, partitions=[Req.OffsetDeleteRequestPartition(partition_index=p) for p in ps]
            )
            for t, ps in wanted.items()
        ],
    )
    with WireClient(_coordinator(bootstrap, group), client_id="kbroker-admin") as c:
        resp: Any = c.request(OFFSET_DELETE, 0, req)
    if resp.error_code:
        raise CommandError(f"deleting offsets of group {group}: {_error_name(resp.error_code)}")
    print(f"\n{'TOPIC':<30} {'PARTITION':<15} {'STATUS':<15}".rstrip())
    failed = 0
    for t in resp.topics:
        for p in t.partitions:
            status = "Successful" if not p.error_code else f"Error: {_error_name(p.error_code)}"
            failed += bool(p.error_code)
            print(f"{t.name:<30} {p.partition_index:<15} {status}")
    # Topics unknown to the cluster: Kafka's tool reports them with UNKNOWN_TOPIC_OR_PARTITION as well.
    return 1 if failed else 0

"""kbroker-admin topics: kafka-topics.sh's flags and output."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from kbroker_tools.admin.common import (
    CommandError,
    ToolParser,
    add_connection_args,
    admin_client,
    parse_key_values,
    result,
)
from kbroker_tools.wire import WireClient


def parser() -> argparse.ArgumentParser:
    ap = ToolParser(prog="kbroker-admin topics",
                                 description="Create, delete, describe, or change a topic (kafka-topics).")
    add_connection_args(ap)
    action = ap.add_mutually_exclusive_group(required=True)
    for flag in ("--create", "--list", "--describe", "--alter", "--delete"):
        action.add_argument(flag, action="store_true")
    ap.add_argument("--topic", help="topic name; a regular expression for --list/--describe/--alter/--delete")
    ap.add_argument("--partitions", type=int, help="partitions of a new topic, or the new total for --alter")
    ap.add_argument("--replication-factor", type=int, default=None)
    ap.add_argument("--config", action="append", metavar="KEY=VALUE", help="topic config for --create")
    ap.add_argument("--if-exists", action="store_true", help="--alter/--delete/--describe: only if it exists")
    ap.add_argument("--if-not-exists", action="store_true", help="--create: only if it does not exist")
    ap.add_argument("--exclude-internal", action="store_true", help="leave out internal topics")
    health = ap.add_mutually_exclusive_group()
    health.add_argument("--under-replicated-partitions", action="store_true",
                        help="--describe: only partitions whose ISR is smaller than their replicas")
    health.add_argument("--unavailable-partitions", action="store_true",
                        help="--describe: only partitions without a leader")
    health.add_argument("--under-min-isr-partitions", action="store_true",
                        help="--describe: only partitions whose ISR is smaller than min.insync.replicas")
    health.add_argument("--at-min-isr-partitions", action="store_true",
                        help="--describe: only partitions whose ISR is exactly min.insync.replicas")
    return ap


def run(_name: str, argv: list[str]) -> int:
    args = parser().parse_args(argv)
    admin = admin_client(args)
    if args.create:
        return create(admin, args)
    if args.list:
        for t in matching_topics(admin, args.topic, args.exclude_internal):
            print(t)
        return 0
    topics = matching_topics(admin, args.topic, args.exclude_internal)
    if args.topic and not topics:
        if args.if_exists:
            return 0
        raise CommandError(f"Topic '{args.topic}' does not exist as expected")
    if args.describe:
        describe(admin, topics, args.bootstrap_server, _partition_filter(args))
    elif args.alter:
        alter(admin, args, topics)
    else:
        delete(admin, topics)
    return 0


def matching_topics(admin: Any, pattern: str | None, exclude_internal: bool) -> list[str]:
    md = admin.list_topics(timeout=30)
    names = sorted(md.topics)
    if exclude_internal:
        names = [n for n in names if not n.startswith("__")]
    if pattern is None:
        return names
    if pattern in md.topics:
        return [pattern]
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise CommandError(f"--topic {pattern!r} is neither a topic nor a valid regular expression: {e}") from None
    return [n for n in names if rx.fullmatch(n)]


def create(admin: Any, args: argparse.Namespace) -> int:
    from confluent_kafka.admin import NewTopic

    if not args.topic:
        raise CommandError("--topic is required with --create")
    configs = parse_key_values(args.config, "--config")
    new = NewTopic(args.topic, num_partitions=args.partitions if args.partitions is not None else -1,
                   replication_factor=args.replication_factor if args.replication_factor is not None else -1,
                   config=configs)
    fut = admin.create_topics([new], operation_timeout=30)[args.topic]
    try:
        result(fut, f"creating topic {args.topic}")
    except CommandError as e:
        if args.if_not_exists and "TOPIC_ALREADY_EXISTS" in str(e):
            return 0
        raise
    print(f"Created topic {args.topic}.")
    return 0


def _partition_filter(args: argparse.Namespace) -> Any:
    """kafka-topics' health filters: (partition metadata, min.insync.replicas) -> shown; None shows all."""
    if args.under_replicated_partitions:
        return lambda p, _min_isr: len(p.isr_nodes) < len(p.replica_nodes)
    if args.unavailable_partitions:
        return lambda p, _min_isr: p.leader_id < 0
    if args.under_min_isr_partitions:
        return lambda p, min_isr: len(p.isr_nodes) < min_isr
    if args.at_min_isr_partitions:
        return lambda p, min_isr: len(p.isr_nodes) == min_isr
    return None


def describe(admin: Any, topics: list[str], bootstrap: str, only: Any = None) -> None:
    import base64

    from confluent_kafka.admin import ConfigResource, ConfigSource

    if not topics:
        return
    # Metadata straight from the protocol: it carries the topic ids, and unlike librdkafka's describe_topics it
    # needs no controller (librdkafka's mock cluster names one that does not exist).
    with WireClient(bootstrap.split(",")[0].strip(), client_id="kbroker-admin") as c:
        md = {t.name: t for t in c.metadata(topics).topics}
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
    try:
        config_futures = admin.describe_configs(resources, request_timeout=10)
    except Exception:  # noqa: BLE001 - a broker without DescribeConfigs: show topics without their configs
        config_futures = {}
    for t, res in zip(topics, resources, strict=True):
        d = md.get(t)
        if d is None or d.error_code:
            raise CommandError(f"describing topic {t}: error {d.error_code if d else 'unknown topic'}")
        configs = ""
        min_isr = 1
        fut = config_futures.get(res)
        if fut is not None:
            try:
                entries = fut.result(15)
                if "min.insync.replicas" in entries:
                    min_isr = int(entries["min.insync.replicas"].value)
                configs = ",".join(f"{k}={e.value}" for k, e in sorted(entries.items())
                                   if e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
            except Exception as e:  # noqa: BLE001 - as above, per topic
                print(f"(configs of {t} unavailable: {e})", file=sys.stderr)
        parts = sorted(d.partitions, key=lambda p: p.partition_index)
        rf = len(parts[0].replica_nodes) if parts else 0
        tid = d.topic_id if isinstance(d.topic_id, bytes | bytearray) else None
        topic_id = base64.urlsafe_b64encode(tid).decode().rstrip("=") if tid and any(tid) else "N/A"
        if only is None:  # with a health filter, kafka-topics prints the matching partitions alone
            print(f"Topic: {t}\tTopicId: {topic_id}\tPartitionCount: {len(parts)}\t"
                  f"ReplicationFactor: {rf}\tConfigs: {configs}")
        for p in parts:
            if only is not None and not only(p, min_isr):
                continue
            leader = p.leader_id if p.leader_id >= 0 else "none"
            print(f"\tTopic: {t}\tPartition: {p.partition_index}\tLeader: {leader}\t"
                  f"Replicas: {','.join(map(str, p.replica_nodes))}\tIsr: {','.join(map(str, p.isr_nodes))}"
                  "\tElr: N/A\tLastKnownElr: N/A")


def alter(admin: Any, args: argparse.Namespace, topics: list[str]) -> None:
    from confluent_kafka.admin import NewPartitions

    if args.partitions is None:
        raise CommandError("--alter needs --partitions (change configs with `kbroker-admin configs --alter`)")
    futures = admin.create_partitions([NewPartitions(t, args.partitions) for t in topics], operation_timeout=30)
    for t, fut in futures.items():
        result(fut, f"increasing the partitions of {t}")


def delete(admin: Any, topics: list[str]) -> None:
    futures = admin.delete_topics(topics, operation_timeout=30)
    for t, fut in futures.items():
        result(fut, f"deleting topic {t}")

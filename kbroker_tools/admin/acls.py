"""kbroker-admin acls: kafka-acls.sh's flags and output (--add, --remove, --list), over CreateAcls, DeleteAcls and
DescribeAcls."""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from typing import Any

from kbroker_tools.admin.common import (
    CommandError,
    ToolParser,
    add_connection_args,
    admin_client,
    client_conf,
    require_client,
    result,
)

CLUSTER_NAME = "kafka-cluster"
OPERATIONS = ("All", "Read", "Write", "Create", "Delete", "Alter", "Describe", "ClusterAction", "DescribeConfigs",
              "AlterConfigs", "IdempotentWrite")
PATTERN_TYPES = ("ANY", "MATCH", "LITERAL", "PREFIXED")
# Kafka's AclEntry.supportedOperations, plus All, by librdkafka's resource type names.
SUPPORTED = {
    "TOPIC": ("Read", "Write", "Create", "Describe", "Delete", "Alter", "DescribeConfigs", "AlterConfigs", "All"),
    "GROUP": ("Read", "Describe", "Delete", "All"),
    "BROKER": ("Create", "ClusterAction", "DescribeConfigs", "AlterConfigs", "IdempotentWrite", "Alter", "Describe",
               "All"),
    "TRANSACTIONAL_ID": ("Describe", "Write", "All"),
}


def parser() -> argparse.ArgumentParser:
    ap = ToolParser(prog="kbroker-admin acls", description="Add, remove or list ACLs (kafka-acls).")
    add_connection_args(ap)
    action = ap.add_mutually_exclusive_group(required=True)
    for flag in ("--add", "--remove", "--list"):
        action.add_argument(flag, action="store_true")
    ap.add_argument("--topic", action="append", default=[], help="a topic (* = every topic); repeatable")
    ap.add_argument("--group", action="append", default=[], help="a consumer group (* = every group); repeatable")
    ap.add_argument("--transactional-id", action="append", default=[], help="a transactional id; repeatable")
    ap.add_argument("--cluster", action="store_true", help="the cluster resource (kafka-cluster)")
    ap.add_argument("--resource-pattern-type", type=str.upper, choices=PATTERN_TYPES, default=None,
                    help="LITERAL (the default for --add/--remove), PREFIXED; for --list and --remove also ANY "
                         "and MATCH (the default for --list is ANY)")
    ap.add_argument("--allow-principal", action="append", default=[], metavar="TYPE:NAME")
    ap.add_argument("--deny-principal", action="append", default=[], metavar="TYPE:NAME")
    ap.add_argument("--allow-host", action="append", default=[], help="host of --allow-principal (default *)")
    ap.add_argument("--deny-host", action="append", default=[], help="host of --deny-principal (default *)")
    ap.add_argument("--operation", action="append", default=[], type=_operation_name,
                    help=f"one of {', '.join(OPERATIONS)}; repeatable")
    ap.add_argument("--producer", action="store_true",
                    help="the ACLs of a producer: Write, Describe, Create on the topics (+ IdempotentWrite with "
                         "--idempotent, Write and Describe on --transactional-id)")
    ap.add_argument("--idempotent", action="store_true", help="with --producer: IdempotentWrite on the cluster")
    ap.add_argument("--consumer", action="store_true",
                    help="the ACLs of a consumer: Read and Describe on the topics, Read on the groups")
    ap.add_argument("--principal", action="append", default=[], help="--list: only the ACLs of this principal")
    ap.add_argument("--force", action="store_true", help="accepted for kafka-acls compatibility (no prompt here)")
    return ap


def _operation_name(text: str) -> str:
    for op in OPERATIONS:
        if op.lower() == text.replace("_", "").replace("-", "").lower():
            return op
    raise argparse.ArgumentTypeError(f"unknown operation {text!r} (one of {', '.join(OPERATIONS)})")


def run(_name: str, argv: list[str]) -> int:
    args = parser().parse_args(argv)
    require_client()
    admin = admin_client(args)
    if args.add:
        add(admin, args)
    elif args.remove:
        remove(admin, args)
    else:
        list_acls(admin, args)
    return 0


# ---------------------------------------------------------------- model


def _k() -> Any:
    from confluent_kafka import admin as k

    return k


def _resources(args: argparse.Namespace, pattern: str) -> list[tuple[Any, str, Any]]:
    """(resource type, name, pattern type) of the resource flags."""
    k = _k()
    ptype = k.ResourcePatternType[pattern]
    out = [(k.ResourceType.TOPIC, t, ptype) for t in args.topic]
    out += [(k.ResourceType.GROUP, g, ptype) for g in args.group]
    out += [(k.ResourceType.TRANSACTIONAL_ID, x, ptype) for x in args.transactional_id]
    if args.cluster:
        out.append((k.ResourceType.BROKER, CLUSTER_NAME, k.ResourcePatternType.LITERAL))
    return out


def _entries(args: argparse.Namespace) -> list[tuple[str, str, Any]]:
    """(principal, host, permission) of the principal flags."""
    k = _k()
    out = []
    for principals, hosts, perm in ((args.allow_principal, args.allow_host, k.AclPermissionType.ALLOW),
                                    (args.deny_principal, args.deny_host, k.AclPermissionType.DENY)):
        for p in principals:
            if ":" not in p:
                raise CommandError(f"principal {p!r}: expected TYPE:NAME, e.g. User:alice")
            out += [(p, h, perm) for h in (hosts or ["*"])]
    return out


def _operations_for(rtype: Any, args: argparse.Namespace) -> list[str]:
    k = _k()
    if not (args.producer or args.consumer):
        return args.operation or ["All"]
    ops: list[str] = []
    if rtype == k.ResourceType.TOPIC:
        if args.producer:
            ops += ["Write", "Describe", "Create"]
        if args.consumer:
            ops += ["Read", "Describe"]
    elif rtype == k.ResourceType.GROUP and args.consumer:
        ops.append("Read")
    elif rtype == k.ResourceType.TRANSACTIONAL_ID and args.producer:
        ops += ["Write", "Describe"]
    elif rtype == k.ResourceType.BROKER and args.producer and args.idempotent:
        ops.append("IdempotentWrite")
    return list(dict.fromkeys(ops))


def _op(name: str) -> Any:
    k = _k()
    return k.AclOperation[{"ClusterAction": "CLUSTER_ACTION", "DescribeConfigs": "DESCRIBE_CONFIGS",
                           "AlterConfigs": "ALTER_CONFIGS", "IdempotentWrite": "IDEMPOTENT_WRITE"}.get(
        name, name.upper())]


def _pattern_text(rtype: Any, name: str, ptype: Any) -> str:
    rname = "CLUSTER" if rtype.name == "BROKER" else rtype.name
    return f"ResourcePattern(resourceType={rname}, name={name}, patternType={ptype.name})"


def _entry_text(b: Any) -> str:
    return (f"(principal={b.principal}, host={b.host}, operation={b.operation.name}, "
            f"permissionType={b.permission_type.name})")


def _print_grouped(title: str, bindings: list[Any]) -> None:
    by_pattern: dict[tuple[Any, str, Any], list[Any]] = defaultdict(list)
    for b in bindings:
        by_pattern[(b.restype, b.name, b.resource_pattern_type)].append(b)
    for (rtype, name, ptype), items in sorted(by_pattern.items(), key=lambda kv: (kv[0][0].value, kv[0][1],
                                                                                  kv[0][2].value)):
        print(f"{title} `{_pattern_text(rtype, name, ptype)}`: ")
        for b in sorted(items, key=_entry_text):
            print(f" \t{_entry_text(b)} ")
        print()


def _current(admin: Any, args: argparse.Namespace, rtype: Any, name: str | None, ptype: Any,
             principal: str | None = None) -> list[Any]:
    k = _k()
    flt = k.AclBindingFilter(rtype, name, ptype, principal, None, k.AclOperation.ANY, k.AclPermissionType.ANY)
    found = list(result(admin.describe_acls(flt), "listing ACLs"))
    if not found:
        _check_empty_listing(args, flt)
    return found


def _check_empty_listing(args: argparse.Namespace, flt: Any) -> None:
    """librdkafka drops DescribeAcls' error code (a refusal reads as "no ACLs"): ask again over the wire
    protocol when the connection is plain, otherwise say that the empty answer may be a refusal."""
    conf = client_conf(args)
    if str(conf.get("security.protocol", "PLAINTEXT")).upper() != "PLAINTEXT":
        print("WARN: librdkafka does not report DescribeAcls errors: an empty list may also mean that this "
              "principal may not describe the cluster's ACLs", file=sys.stderr)
        return
    from kbroker.protocol.errors import ErrorCode
    from kbroker.protocol.messages import DescribeAclsRequest

    from kbroker_tools.wire import WireClient

    req = DescribeAclsRequest(resource_type_filter=flt.restype.value, resource_name_filter=flt.name,
                              pattern_type_filter=flt.resource_pattern_type.value, principal_filter=flt.principal,
                              host_filter=flt.host, operation=flt.operation.value,
                              permission_type=flt.permission_type.value)
    with WireClient(str(conf["bootstrap.servers"]).split(",")[0], client_id="kbroker-admin") as wire:
        resp = wire.request(29, 1, req)
    if resp.error_code:
        name = ErrorCode(resp.error_code).name if resp.error_code in ErrorCode._value2member_map_ \
            else str(resp.error_code)
        raise CommandError(f"listing ACLs: {name}: {resp.error_message or ''}".rstrip(": "))


# ---------------------------------------------------------------- actions


def add(admin: Any, args: argparse.Namespace) -> None:
    k = _k()
    pattern = args.resource_pattern_type or "LITERAL"
    if pattern not in ("LITERAL", "PREFIXED"):
        raise CommandError(f"A '--resource-pattern-type' value of '{pattern}' is not valid when adding acls.")
    if args.producer and args.idempotent:
        args.cluster = True
    resources = _resources(args, pattern)
    entries = _entries(args)
    if not resources:
        raise CommandError("You must specify one of: --topic, --cluster, --group, --transactional-id")
    if not entries:
        raise CommandError("You must specify one of: --allow-principal, --deny-principal when trying to add ACLs.")
    for rtype, _, _ in resources:
        supported = SUPPORTED[rtype.name]
        bad = [op for op in _operations_for(rtype, args) if op not in supported]
        if bad:
            # kafka-acls' own check: an operation that means nothing for the resource type is a mistake.
            kind = {"BROKER": "Cluster", "TRANSACTIONAL_ID": "TransactionalId"}.get(rtype.name, rtype.name.title())
            raise CommandError(f"ResourceType {kind} only supports operations {','.join(supported)}")
    for rtype, name, ptype in resources:
        bindings = [k.AclBinding(rtype, name, ptype, p, h, _op(op), perm)
                    for op in _operations_for(rtype, args) for p, h, perm in entries]
        if not bindings:
            continue
        _print_grouped("Adding ACLs for resource", bindings)
        for f in admin.create_acls(bindings).values():
            result(f, "adding ACLs")
    for rtype, name, ptype in resources:
        _print_grouped("Current ACLs for resource", _current(admin, args, rtype, name, ptype))


def remove(admin: Any, args: argparse.Namespace) -> None:
    k = _k()
    resources = _resources(args, args.resource_pattern_type or "LITERAL")
    if not resources:
        raise CommandError("You must specify one of: --topic, --cluster, --group, --transactional-id")
    entries = _entries(args)
    for rtype, name, ptype in resources:
        if entries:
            filters = [k.AclBindingFilter(rtype, name, ptype, p, h, _op(op), perm)
                       for op in _operations_for(rtype, args) for p, h, perm in entries]
        else:
            filters = [k.AclBindingFilter(rtype, name, ptype, None, None, k.AclOperation.ANY,
                                          k.AclPermissionType.ANY)]
        print(f"Removing ACLs for resource `{_pattern_text(rtype, name, ptype)}`: ")
        deleted = []
        for f in admin.delete_acls(filters).values():
            deleted += result(f, "removing ACLs")
        for b in sorted(deleted, key=_entry_text):
            print(f" \t{_entry_text(b)} ")
        print()


def list_acls(admin: Any, args: argparse.Namespace) -> None:
    k = _k()
    pattern = args.resource_pattern_type or "ANY"
    resources = _resources(args, pattern) or [(k.ResourceType.ANY, None, k.ResourcePatternType[pattern])]
    principals = args.principal or [None]
    for rtype, name, ptype in resources:
        found = []
        for p in principals:
            found += _current(admin, args, rtype, name, ptype, p)
        _print_grouped("Current ACLs for resource", found)

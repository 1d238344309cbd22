"""kbroker-admin configs: kafka-configs.sh's --describe / --alter for topics, brokers, groups and clients (quotas)."""

from __future__ import annotations

import argparse
from typing import Any

from kbroker_tools.admin.common import (
    CommandError,
    ToolParser,
    add_connection_args,
    admin_client,
    check_reachable,
    parse_key_values,
    result,
    split_config_list,
)
from kbroker_tools.wire import WireClient

DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS = 48, 49
MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2


def parser() -> argparse.ArgumentParser:
    ap = ToolParser(prog="kbroker-admin configs",
                                 description="Describe or change topic, broker, group and client configs (kafka-configs).")
    add_connection_args(ap)
    action = ap.add_mutually_exclusive_group(required=True)
    action.add_argument("--describe", action="store_true")
    action.add_argument("--alter", action="store_true")
    ap.add_argument("--entity-type", required=True, choices=("topics", "brokers", "groups", "clients", "users"))
    ap.add_argument("--entity-name", help="topic name, broker id, group id, client id or user (SCRAM credentials)")
    ap.add_argument("--entity-default", action="store_true", help="the cluster-wide default (brokers, clients)")
    ap.add_argument("--add-config", action="append", metavar="K1=V1,K2=[V3,V4]")
    ap.add_argument("--delete-config", action="append", metavar="K1,K2")
    ap.add_argument("--all", action="store_true", help="--describe: every config, not only the dynamic ones")
    return ap


def run(_name: str, argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.entity_type == "clients":
        return _client_quotas(args)
    admin = admin_client(args)
    if args.entity_type == "users":
        from kbroker_tools.admin.scram import user_credentials

        return user_credentials(admin, args)
    if args.entity_type == "brokers" and args.entity_default:
        # librdkafka refuses a broker resource without a name: the cluster default goes over the raw protocol.
        from kbroker_tools.admin.broker_defaults import alter_defaults, describe_defaults

        return describe_defaults(args) if args.describe else alter_defaults(args)
    if args.describe:
        describe(admin, args)
    else:
        alter(admin, args)
    return 0


def _resources(admin: Any, args: argparse.Namespace) -> list[tuple[Any, str]]:
    from confluent_kafka.admin import ConfigResource

    if args.entity_type == "topics":
        if args.entity_default:
            raise CommandError("--entity-default is not valid for topics")
        names = [args.entity_name] if args.entity_name else sorted(admin.list_topics(timeout=30).topics)
        return [(ConfigResource(ConfigResource.Type.TOPIC, n), f"topic {n}") for n in names]
    if args.entity_type == "groups":
        if args.entity_default:
            raise CommandError("--entity-default is not valid for groups")
        if args.entity_name:
            names = [args.entity_name]
        else:
            listed = result(admin.list_consumer_groups(request_timeout=30), "listing groups")
            names = sorted(g.group_id for g in listed.valid)
        return [(ConfigResource(ConfigResource.Type.GROUP, n), f"group {n}") for n in names]
    if args.entity_default:
        return [(ConfigResource(ConfigResource.Type.BROKER, ""), "brokers in the cluster")]
    ids = [args.entity_name] if args.entity_name else [str(b) for b in sorted(admin.list_topics(timeout=30).brokers)]
    return [(ConfigResource(ConfigResource.Type.BROKER, i), f"broker {i}") for i in ids]


def _entry_line(e: Any) -> str:
    from confluent_kafka.admin import ConfigSource

    synonyms = ", ".join(f"{ConfigSource(s.source).name}:{s.name}={s.value}" for s in (e.synonyms or {}).values())
    return f"  {e.name}={e.value if not e.is_sensitive else None} sensitive={str(e.is_sensitive).lower()} " \
           f"synonyms={{{synonyms}}}"


def describe(admin: Any, args: argparse.Namespace) -> None:
    from confluent_kafka.admin import ConfigSource

    dynamic = {ConfigSource.DYNAMIC_TOPIC_CONFIG.value, ConfigSource.DYNAMIC_BROKER_CONFIG.value,
               ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value, ConfigSource.GROUP_CONFIG.value}
    for res, label in _resources(admin, args):
        entries = result(admin.describe_configs([res], request_timeout=30)[res], f"describing configs of {label}")
        if args.entity_default:
            title = "Default configs for brokers in the cluster are:"
        else:
            title = f"{'All' if args.all else 'Dynamic'} configs for {label} are:"
        print(title)
        for name in sorted(entries):
            e = entries[name]
            if args.all or e.source in dynamic:
                print(_entry_line(e))


def alter(admin: Any, args: argparse.Namespace) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    if not args.entity_name and not args.entity_default:
        raise CommandError("--alter needs --entity-name or --entity-default")
    add = parse_key_values(args.add_config, "--add-config")
    remove = [k for item in args.delete_config or () for k in split_config_list(item)]
    if not add and not remove:
        raise CommandError("--alter needs --add-config and/or --delete-config")
    (res, label), = _resources(admin, args)
    ops = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in add.items()]
    ops += [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in remove]
    res = ConfigResource(res.restype, res.name, incremental_configs=ops)
    result(admin.incremental_alter_configs([res], request_timeout=30)[res], f"altering configs of {label}")
    if args.entity_default:
        print("Completed updating default config for brokers in the cluster.")
    else:
        print(f"Completed updating config for {label}.")


# ---------------------------------------------------------------- client quotas (no librdkafka API: raw protocol)


def _bootstrap(args: argparse.Namespace) -> str:
    return args.bootstrap_server.split(",")[0].strip()


def _client_quotas(args: argparse.Namespace) -> int:
    from kbroker.protocol.messages import (
        AlterClientQuotasRequest,
        AlterClientQuotasResponse,
        DescribeClientQuotasRequest,
        DescribeClientQuotasResponse,
    )

    name = None if args.entity_default else args.entity_name
    shown = "the default client-id" if name is None else f"client-id '{name}'"
    check_reachable(args.bootstrap_server)
    with WireClient(_bootstrap(args), client_id="kbroker-admin") as c:
        if args.describe:
            match = MATCH_ANY if name is None and not args.entity_default else \
                (MATCH_DEFAULT if name is None else MATCH_EXACT)
            req = DescribeClientQuotasRequest(components=[DescribeClientQuotasRequest.ComponentData(
                entity_type="client-id", match_type=match, match=name)], strict=True)
            resp: DescribeClientQuotasResponse = c.request(DESCRIBE_CLIENT_QUOTAS, 1, req)
            if resp.error_code:
                raise CommandError(f"describing quotas: error {resp.error_code} {resp.error_message or ''}")
            for entry in resp.entries:
                who = next((e.entity_name for e in entry.entity if e.entity_type == "client-id"), None)
                label = "the default client-id" if who is None else f"client-id '{who}'"
                values = ", ".join(f"{v.key}={float(v.value)}" for v in sorted(entry.values, key=lambda v: v.key))
                print(f"Quota configs for {label} are {values}")
            return 0
        if name is None and not args.entity_default:
            raise CommandError("--alter needs --entity-name or --entity-default")
        add = parse_key_values(args.add_config, "--add-config")
        remove = [k for item in args.delete_config or () for k in split_config_list(item)]
        try:
            ops = [AlterClientQuotasRequest.OpData(key=k, value=float(v), remove=False) for k, v in add.items()]
        except ValueError:
            raise CommandError("quota values must be numbers") from None
        ops += [AlterClientQuotasRequest.OpData(key=k, value=0.0, remove=True) for k in remove]
        entity = [AlterClientQuotasRequest.EntityData(entity_type="client-id", entity_name=name)]
        areq = AlterClientQuotasRequest(entries=[AlterClientQuotasRequest.EntryData(entity=entity, ops=ops)],
                                        validate_only=False)
        aresp: AlterClientQuotasResponse = c.request(ALTER_CLIENT_QUOTAS, 1, areq)
        for e in aresp.entries:
            if e.error_code:
                raise CommandError(f"altering quotas of {shown}: error {e.error_code} {e.error_message or ''}")
    print(f"Completed updating config for entity: {shown}.")
    return 0

"""kbroker-admin configs --entity-type brokers --entity-default: the cluster-wide broker defaults over the raw
protocol (librdkafka refuses the empty resource name that stands for them)."""

from __future__ import annotations

import argparse
from typing import Any

from kbroker_tools.admin.common import CommandError, check_reachable, parse_key_values, split_config_list
from kbroker_tools.wire import WireClient

DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 44
BROKER = 4
SET, DELETE = 0, 1
# Kafka's ConfigSource numbering, for the synonyms column.
SOURCES = {
    0: "UNKNOWN",
    1: "DYNAMIC_TOPIC_CONFIG",
    2: "DYNAMIC_BROKER_CONFIG",
    3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    4: "STATIC_BROKER_CONFIG",
    5: "DEFAULT_CONFIG",
    6: "DYNAMIC_BROKER_LOGGER_CONFIG",
}


def _error(code: int, message: str | None) -> str:
    from kbroker.protocol.errors import ErrorCode

    name = ErrorCode(code).name if code in ErrorCode._value2member_map_ else str(code)
    return f"{name}: {message}" if message else name


def _wire(args: argparse.Namespace) -> WireClient:
    check_reachable(args.bootstrap_server)
    return WireClient(args.bootstrap_server.split(",")[0].strip(), client_id="kbroker-admin")


def describe_defaults(args: argparse.Namespace) -> int:
    from kbroker.protocol.messages import DescribeConfigsRequest

    req = DescribeConfigsRequest(
        resources=[
            DescribeConfigsRequest.DescribeConfigsResource(
                resource_type=BROKER, resource_name="", configuration_keys=None
            )
        ],
        include_synonyms=True,
        include_documentation=False,
    )
    with _wire(args) as c:
        resp = c.request(DESCRIBE_CONFIGS, 4, req)
    res = resp.results[0]
    if res.error_code:
        raise CommandError(
            f"describing the default broker configs: {_error(res.error_code, res.error_message)}"
        )
    print("Default configs for brokers in the cluster are:")
    for e in sorted(res.configs, key=lambda e: e.name):
        if not args.all and e.config_source != 3:
            continue
        synonyms = ", ".join(f"{SOURCES.get(s.source, s.source)}:{s.name}={s.value}" for s in e.synonyms)
        print(
            f"  {e.name}={e.value if not e.is_sensitive else None} sensitive={str(e.is_sensitive).lower()} "
            f"synonyms={{{synonyms}}}"
        )
    return 0


def alter_defaults(args: argparse.Namespace) -> int:
    from kbroker.protocol.messages import IncrementalAlterConfigsRequest as Req

    add = parse_key_values(args.add_config, "--add-config")
    remove = [k for item in args.delete_config or () for k in split_config_list(item)]
    if not add and not remove:
        raise CommandError("--alter needs --add-config and/or --delete-config")
    configs = [Req.AlterableConfig(name=k, config_operation=SET, value=v) for k, v in add.items()]
    configs += [Req.AlterableConfig(name=k, config_operation=DELETE, value=None) for k in remove]
    req = Req(
        resources=[Req.AlterConfigsResource(resource_type=BROKER, resource_name="", configs=configs)],
        validate_only=False,
    )
    with _wire(args) as c:
        resp: Any = c.request(INCREMENTAL_ALTER_CONFIGS, 1, req)
    for r in resp.responses:
        if r.error_code:
            raise CommandError(
                f"altering the default broker configs: {_error(r.error_code, r.error_message)}"
            )
    print("Completed updating default config for brokers in the cluster.")
    return 0

"""kbroker-admin log-dirs: kafka-log-dirs.sh's --describe (DescribeLogDirs to each broker), printed as Kafka's tool."""

from __future__ import annotations

import json
from typing import Any

from kbroker_tools.admin.common import CommandError, ToolParser, add_connection_args, bootstrap_addresses
from kbroker_tools.wire import WireClient

DESCRIBE_LOG_DIRS = 35
# The exception class Kafka's admin client reports for a log dir's error code (the tool prints its class name).
_ERROR_CLASSES = {56: "KafkaStorageException", 31: "ClusterAuthorizationException"}


def parser() -> ToolParser:
    ap = ToolParser(
        prog="kbroker-admin log-dirs",
        description="Describe the log dirs of brokers and the replicas in them, as kafka-log-dirs.",
    )
    add_connection_args(ap)
    ap.add_argument("--describe", action="store_true", required=True, help="describe the log dirs")
    ap.add_argument("--broker-list", metavar="0,1", help="brokers to query (default: every broker)")
    ap.add_argument("--topic-list", metavar="T1,T2", help="topics whose replicas to list (default: all)")
    return ap


def _ids(text: str | None, flag: str) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CommandError(f"{flag} {text!r}: expected broker ids such as 0,1,2") from None


def _connect(host: str, port: int) -> WireClient:
    try:
        return WireClient(f"[{host}]:{port}" if ":" in host else f"{host}:{port}", client_id="kbroker-admin")
    except OSError as e:
        raise CommandError(f"cannot connect to {host}:{port}: {e.strerror or e}") from None


def _describe(client: WireClient, broker: int) -> list[dict[str, Any]]:
    from kbroker.protocol.messages import DescribeLogDirsRequest

    version = client.max_version(DESCRIBE_LOG_DIRS, 4)
    resp: Any = client.request(DESCRIBE_LOG_DIRS, version, DescribeLogDirsRequest(topics=None))
    if getattr(resp, "error_code", 0):
        raise CommandError(f"broker {broker} answered DescribeLogDirs with error {_error(resp.error_code)}")
    return [
        {
            "logDir": r.log_dir,
            "error": _error(r.error_code) if r.error_code else None,
            "partitions": [(t.name, p) for t in r.topics for p in t.partitions],
        }
        for r in resp.results
    ]


def _error(code: int) -> str:
    from kbroker.protocol.errors import ErrorCode

    name = _ERROR_CLASSES.get(code) or (
        ErrorCode(code).name if code in ErrorCode._value2member_map_ else str(code)
    )
    return f"org.apache.kafka.common.errors.{name}"


def run(_name: str, argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.command_config:
        raise CommandError("log-dirs speaks PLAINTEXT only for now: --command-config is not supported")
    wanted = _ids(args.broker_list, "--broker-list")
    topics = {t.strip() for t in args.topic_list.split(",") if t.strip()} if args.topic_list else set()
    host, port = bootstrap_addresses(args.bootstrap_server)[0]
    with _connect(host, port) as c:
        brokers = {b.node_id: (b.host, b.port) for b in c.metadata([]).brokers}
    ids = sorted(brokers) if wanted is None else wanted
    missing = [b for b in ids if b not in brokers]
    if missing:
        raise CommandError(
            f"The given brokers do not exist from --broker-list: {','.join(map(str, missing))}. "
            f"Current existent brokers: {','.join(map(str, sorted(brokers)))}"
        )
    print("Querying brokers for log directories information")
    described = {}
    for b in ids:
        with _connect(*brokers[b]) as c:
            described[b] = _describe(c, b)
    print(f"Received log directory information from brokers {','.join(map(str, ids))}")
    # Key order as Kafka's tool prints them (its Java HashMaps').
    out = {
        "brokers": [
            {
                "broker": b,
                "logDirs": [
                    {
                        "partitions": [
                            {
                                "partition": f"{t}-{p.partition_index}",
                                "size": p.partition_size,
                                "offsetLag": p.offset_lag,
                                "isFuture": p.is_future_key,
                            }
                            for t, p in d["partitions"]
                            if not topics or t in topics
                        ],
                        "error": d["error"],
                        "logDir": d["logDir"],
                    }
                    for d in dirs
                ],
            }
            for b, dirs in described.items()
        ],
        "version": 1,
    }
    print(json.dumps(out, separators=(",", ":")))
    return 0

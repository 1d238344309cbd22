"""Command line: `kbroker [--config] server.properties [--override key=value ...]`, like kafka-server-start."""

from __future__ import annotations

import argparse
import logging
import resource
import sys

import uvloop

from broker.config import ConfigError, KafkaConfig


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="kbroker", description="A Kafka-compatible broker.")
    ap.add_argument("config_file", nargs="?", help="server.properties file")
    ap.add_argument("--config", dest="config_opt", help="server.properties file (same as the positional argument)")
    ap.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE", help="override a property of the file"
    )
    ap.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return ap.parse_args(argv)


def _raise_open_files_limit() -> None:
    """Every connection and segment file is a descriptor: use the hard limit, as Kafka's service files do."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="[%(asctime)s] %(levelname)s %(message)s (%(name)s)",
        stream=sys.stderr,
    )
    path = args.config_opt or args.config_file
    if not path:
        print("kbroker: a config file is required (see configs/server.properties)", file=sys.stderr)
        return 2
    try:
        config = KafkaConfig.from_file(path, args.override)
    except ConfigError as e:
        print(f"kbroker: invalid configuration: {e}", file=sys.stderr)
        return 2
    _raise_open_files_limit()
    from broker.server import KafkaServer

    server = KafkaServer(config)
    try:
        uvloop.run(server.run_until_stopped())
    except OSError as e:
        logging.getLogger("kbroker.server").error("Fatal error during startup: %s", e)
        return 1
    return 0

"""Command line: `kbroker [--config] server.properties [--override key=value ...]`, like kafka-server-start.

Also `kbroker --version`, `kbroker --help` (every config key with its default) and `kbroker --print-config FILE`
(the effective configuration and where each value came from).
"""

from __future__ import annotations

import argparse
import logging
import resource
import sys

from kbroker.broker.config import KEYS, ConfigError, KafkaConfig, read_properties, render_value


def version() -> str:
    from importlib import metadata  # 60 ms to import: only when asked

    try:
        return metadata.version("kbroker")
    except metadata.PackageNotFoundError:  # a source checkout that was never pip-installed
        return "unknown (not installed)"


def _config_keys_help() -> str:
    width = max(len(k) for k in KEYS)
    lines = ["config keys (Kafka's server.properties names) and their defaults:"]
    for name in sorted(KEYS):
        default = render_value(KEYS[name].default)
        lines.append(f"  {name:<{width}}  {'(unset)' if default is None else default}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="kbroker", description="A Kafka-compatible broker.", epilog=_config_keys_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("config_file", nargs="?", help="server.properties file")
    ap.add_argument("--config", dest="config_opt", help="server.properties file (same as the positional argument)")
    ap.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE", help="override a property of the file"
    )
    ap.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    ap.add_argument("--version", action="store_true", help="print the version and exit")
    ap.add_argument("--print-config", action="store_true",
                    help="print the effective configuration with the source of each value, then exit")
    return ap.parse_args(argv)


def describe_config(path: str, overrides: list[str]) -> list[tuple[str, str, str]]:
    """(key, effective value, source) for every key: `--override`, the file, derived from another key, or
    the default. Raises ConfigError as startup would."""
    config = KafkaConfig.from_file(path, overrides)
    with open(path) as f:
        in_file = read_properties(f.read())
    overridden = {item.partition("=")[0].strip() for item in overrides}
    rows = []
    for name, value in sorted(config.items()):
        if name in overridden:
            source = "--override"
        elif name in in_file:
            source = path
        elif render_value(value) != render_value(KEYS[name].default):
            source = "derived"  # log.retention.ms from .hours, advertised.listeners from listeners, ...
        else:
            source = "default"
        shown = render_value(value)
        rows.append((name, "(unset)" if shown is None else shown, source))
    return rows


def _raise_open_files_limit() -> None:
    """Every connection and segment file is a descriptor: use the hard limit, as Kafka's service files do."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


SWITCH_INTERVAL_S = 0.001


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.version:
        print(f"kbroker {version()}")
        return 0
    # The processors, replica fetchers and coordinators are threads sharing the GIL: a thread woken by a socket
    # waits up to the switch interval for a busy one to let go (5 ms by default), which showed as the tail of
    # acks=all latency with replication.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
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
        if args.print_config:
            rows = describe_config(path, args.override)
            width = max(len(r[0]) for r in rows)
            for name, value, source in rows:
                print(f"{name:<{width}}  {value}  [{source}]")
            return 0
        config = KafkaConfig.from_file(path, args.override)
    except ConfigError as e:
        print(f"kbroker: invalid configuration: {e}", file=sys.stderr)
        return 2
    _raise_open_files_limit()
    import uvloop
    from kbroker.broker.gc_tuning import tune_after_startup
    from kbroker.broker.server import KafkaServer

    try:
        server = KafkaServer(config)
    except ConfigError as e:  # listener security (key material, JAAS configs) is checked when it is built
        print(f"kbroker: invalid configuration: {e}", file=sys.stderr)
        return 2
    try:
        uvloop.run(server.run_until_stopped(after_startup=tune_after_startup))
    except OSError as e:
        logging.getLogger("kbroker.server").error("Fatal error during startup: %s", e)
        return 1
    return 0

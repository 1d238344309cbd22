"""kbroker-admin COMMAND [flags]: Kafka's tools under one command, with their flags and output columns."""

from __future__ import annotations

import sys

from kbroker_tools.admin.common import CommandError

COMMANDS = {
    "topics": ("kbroker_tools.admin.topics", "kafka-topics: create, list, describe, alter, delete topics"),
    "consumer-groups": ("kbroker_tools.admin.groups", "kafka-consumer-groups: list, describe with lag, "
                        "reset offsets, delete"),
    "configs": ("kbroker_tools.admin.configs", "kafka-configs: describe and alter topic, broker, client configs"),
    "console-producer": ("kbroker_tools.admin.console", "kafka-console-producer: lines from stdin to a topic"),
    "console-consumer": ("kbroker_tools.admin.console", "kafka-console-consumer: records of a topic to stdout"),
    "get-offsets": ("kbroker_tools.admin.console", "kafka-get-offsets: offsets of partitions by time"),
    "acls": ("kbroker_tools.admin.acls", "kafka-acls: add, remove and list ACLs"),
    "share-groups": ("kbroker_tools.admin.share_groups", "kafka-share-groups: list, describe, delete share groups"),
    "log-dirs": ("kbroker_tools.admin.log_dirs", "kafka-log-dirs: describe brokers' log dirs and their replicas"),
}


def usage() -> str:
    lines = ["usage: kbroker-admin COMMAND [flags]  (COMMAND --help for its flags)", "", "commands:"]
    lines += [f"  {name:<18} {desc}" for name, (_, desc) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"kbroker-admin: unknown command {name!r}\n{usage()}", file=sys.stderr)
        return 2
    import importlib

    module = importlib.import_module(COMMANDS[name][0])
    try:
        return int(module.run(name, rest) or 0)
    except CommandError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `... | head`
        return 0
    except OSError as e:  # a broker that went away mid-command, an unreadable file
        print(f"Error: {e.strerror or e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - the last resort: a user sees one line, never a traceback
        print(f"Error: {one_line(e)}", file=sys.stderr)
        return 1


def one_line(e: BaseException) -> str:
    """An exception as one line: librdkafka's KafkaError by its name and text, anything else by its message."""
    err = e.args[0] if e.args else None
    if hasattr(err, "name") and hasattr(err, "str"):
        return f"{err.name()}: {err.str()}"
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__

"""What every kbroker-admin command shares: clients, --command-config, errors, Kafka's table layout."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

try:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
except ImportError:  # pragma: no cover - the message below is the whole story
    KafkaException = None  # type: ignore[assignment,misc]
    AdminClient = None  # type: ignore[assignment,misc]

TIMEOUT = 30.0


class CommandError(Exception):
    """A user-facing failure: printed as one line (`Error: ...`), exit status 1."""


def require_client() -> None:
    if AdminClient is None:
        raise CommandError("kbroker-admin needs confluent-kafka: pip install 'kbroker[tools]'")


def add_connection_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT",
                    help="the broker(s) to connect to, HOST:PORT[,HOST:PORT]")
    ap.add_argument("--command-config", metavar="FILE",
                    help="client properties (librdkafka / Kafka client keys) for the admin client")


def read_properties_file(path: str | None) -> dict[str, str]:
    if not path:
        return {}
    out: dict[str, str] = {}
    try:
        text = open(path).read()
    except OSError as e:
        raise CommandError(f"cannot read {path}: {e.strerror}") from None
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        k, sep, v = line.partition("=")
        if sep:
            out[k.strip()] = v.strip()
    return out


def client_conf(args: argparse.Namespace, extra: dict[str, str] | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": args.bootstrap_server, "log_level": 3,
                            "client.id": "kbroker-admin"}
    conf.update(read_properties_file(getattr(args, "command_config", None)))
    conf.update(extra or {})
    return conf


def admin_client(args: argparse.Namespace) -> Any:
    require_client()
    return AdminClient(client_conf(args))


def result(future: Any, what: str) -> Any:
    """The future's value, or a CommandError with Kafka's error name, as the Java tools print them."""
    try:
        return future.result(TIMEOUT)
    except KafkaException as e:
        err = e.args[0] if e.args else e
        name = err.name() if hasattr(err, "name") else type(err).__name__
        text = err.str() if hasattr(err, "str") else str(err)
        raise CommandError(f"{what}: {name}: {text}") from None
    except TimeoutError:
        raise CommandError(f"{what}: no answer within {TIMEOUT:.0f} s") from None


def parse_key_values(items: Sequence[str] | None, flag: str) -> dict[str, str]:
    """`k=v` entries, from repeated flags or comma-separated lists (Kafka accepts both)."""
    out: dict[str, str] = {}
    for item in items or ():
        for kv in split_config_list(item):
            k, sep, v = kv.partition("=")
            if not sep or not k.strip():
                raise CommandError(f"{flag} {kv!r}: expected key=value")
            out[k.strip()] = v.strip()
    return out


def split_config_list(text: str) -> list[str]:
    """kafka-configs' `k1=v1,k2=[a,b]`: square brackets group a list value that contains commas."""
    parts: list[str] = []
    depth, cur = 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
            continue
        if ch == "]":
            depth -= 1
            continue
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    if cur:
        parts.append(cur)
    return [p for p in (x.strip() for x in parts) if p]


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: Any = None) -> None:
    """Left-aligned columns, each as wide as its widest cell, one space apart (kafka-consumer-groups' layout)."""
    out = out or sys.stdout
    cells = [[str(c) for c in headers], *[["-" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for r in cells:
        out.write(" ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")

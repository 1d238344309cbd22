"""What every kbroker-admin command shares: clients, --command-config, errors, Kafka's table layout."""

from __future__ import annotations

import argparse
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

try:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
except ImportError:  # pragma: no cover - the message below is the whole story
    KafkaException = None  # type: ignore[assignment,misc]
    AdminClient = None  # type: ignore[assignment,misc]

TIMEOUT = 30.0
# How long the tool tries to reach a bootstrap address before it gives up (kcat gives up as quickly).
CONNECT_TIMEOUT = 3.0


class CommandError(Exception):
    """A user-facing failure: printed as one line (`Error: ...`), exit status 1."""


class ToolParser(argparse.ArgumentParser):
    """argparse with one-line errors: `Error: <what>` and a pointer to --help, never the multi-line usage."""

    def error(self, message: str) -> NoReturn:
        raise CommandError(f"{message} (see `{self.prog} --help`)")


def bootstrap_addresses(bootstrap: str) -> list[tuple[str, int]]:
    """`HOST:PORT[,HOST:PORT]` (IPv6 in brackets), or a CommandError naming the malformed entry."""
    out: list[tuple[str, int]] = []
    for item in (x.strip() for x in bootstrap.split(",")):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if "://" in item:
            host, sep, port = item.split("://", 1)[1].rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise CommandError(f"--bootstrap-server {item!r}: expected HOST:PORT")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise CommandError("--bootstrap-server is empty: expected HOST:PORT[,HOST:PORT]")
    return out


_reachable: set[str] = set()


def check_reachable(bootstrap: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """One TCP connect to some bootstrap address within `timeout`, or a CommandError naming the addresses:
    without it librdkafka retries for the whole request timeout and logs every failed attempt."""
    if bootstrap in _reachable:
        return
    addresses = bootstrap_addresses(bootstrap)
    deadline = time.monotonic() + timeout
    reasons: list[str] = []
    while True:
        for host, port in addresses:
            try:
                socket.create_connection((host, port), timeout=max(0.2, deadline - time.monotonic())).close()
            except OSError as e:
                reasons.append(f"{_address(host, port)} ({e.strerror or e})")
                continue
            _reachable.add(bootstrap)
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)  # a broker that is starting up gets the rest of the timeout
    shown = ", ".join(dict.fromkeys(reasons[-len(addresses):]))
    raise CommandError(f"cannot connect to the broker at {shown} within {timeout:.0f} s")


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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


def _librdkafka_version() -> tuple[int, int]:
    from confluent_kafka import libversion

    n = libversion()[1]
    return (n >> 24) & 0xFF, (n >> 16) & 0xFF


def client_conf(args: argparse.Namespace, extra: dict[str, str] | None = None) -> dict[str, Any]:
    check_reachable(args.bootstrap_server)
    # Quiet librdkafka: a broker that goes away is reported once by the tool, not as a log line per retry, and
    # metadata is not re-bootstrapped behind the tool's back.
    conf: dict[str, Any] = {"bootstrap.servers": args.bootstrap_server, "log_level": 0,
                            "client.id": "kbroker-admin"}
    if _librdkafka_version() >= (2, 5):  # the property appeared in librdkafka 2.5 (confluent-kafka>=2.4 allowed)
        conf["metadata.recovery.strategy"] = "none"
    conf["error_cb"] = _client_error
    conf.update(read_properties_file(getattr(args, "command_config", None)))
    conf.update(extra or {})
    return conf


# librdkafka's errors that end the command: every broker connection lost (the broker went away while the tool ran),
# or a fatal client error. Others (one broker of several down) librdkafka survives by itself.
_ALL_BROKERS_DOWN = -187
_stopping: list[str] = []


def _client_error(err: Any) -> None:
    if err.code() == _ALL_BROKERS_DOWN or err.fatal():
        _stopping.append(f"{err.name()}: {err.str()}")


def check_client() -> None:
    """A CommandError once librdkafka reported that the brokers are gone (see _client_error)."""
    if _stopping:
        raise CommandError(f"lost the connection to the brokers ({_stopping[0]})")


def admin_client(args: argparse.Namespace) -> Any:
    require_client()
    return AdminClient(client_conf(args))


def result(future: Any, what: str) -> Any:
    """The future's value, or a CommandError with Kafka's error name, as the Java tools print them."""
    deadline = time.monotonic() + TIMEOUT
    try:
        while True:
            try:
                return future.result(0.2)
            except TimeoutError:
                check_client()
                if time.monotonic() >= deadline:
                    raise
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

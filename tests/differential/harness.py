"""Send the same raw request to kbroker and to Apache Kafka, decode both answers and compare them field by field."""

from __future__ import annotations

import socket
import struct
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from kbroker.protocol import codec
from kbroker.protocol.messages import RequestHeader

from tests.differential.normalisation import FIELDS, MARK

TIMEOUT = "<no answer in time>"
CLOSED = "<connection closed>"
NO_RESPONSE = "<no response expected>"


class Target:
    """One broker under comparison: a single connection, reopened when the broker closes it."""

    def __init__(self, name: str, bootstrap: str, timeout: float = 8.0) -> None:
        self.name = name
        host, port = bootstrap.rsplit(":", 1)
        self.address = (host, int(port))
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.correlation_id = 0

    def _connect(self) -> socket.socket:
        if self.sock is None:
            self.sock = socket.create_connection(self.address, timeout=self.timeout)
        return self.sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _recv_exact(self, sock: socket.socket, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return bytes(buf)

    def send(self, api_key: int, version: int, body: Any, expect_response: bool = True) -> Any:
        """The decoded response body, or one of TIMEOUT / CLOSED / NO_RESPONSE."""
        self.correlation_id += 1
        header = RequestHeader(
            request_api_key=api_key,
            request_api_version=version,
            correlation_id=self.correlation_id,
            client_id="differential",
        )
        frame = codec.encode_request(header, body)
        try:
            sock = self._connect()
            sock.sendall(frame)
            if not expect_response:
                return NO_RESPONSE
            (size,) = struct.unpack(">i", self._recv_exact(sock, 4))
            cid, resp = codec.decode_response(api_key, version, self._recv_exact(sock, size))
        except TimeoutError:
            self.close()
            return TIMEOUT
        except (ConnectionError, OSError):
            self.close()
            return CLOSED
        if cid != self.correlation_id:
            self.close()
            return CLOSED
        return resp


def plain(value: Any, normalise: bool = True) -> Any:
    """A comparable tree of a decoded message: structs become dicts, normalised fields become MARK."""
    specs = getattr(type(value), "FIELDS", None)
    if specs is not None:
        out = {}
        for f in specs:
            v = getattr(value, f.attr)
            # error_message: present or absent alike (free text, Kafka sets it in fewer places); others when present.
            hidden = normalise and f.attr in FIELDS and (v is not None or f.attr == "error_message")
            out[f.attr] = MARK if hidden else plain(v, normalise)
        return out
    if isinstance(value, list):
        items = [plain(v, normalise) for v in value]
        if normalise and items and all(isinstance(i, dict) for i in items):
            items.sort(key=repr)  # the "<order of struct lists>" rule of normalisation.RULES
        return items
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    return value


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two plain trees differ, as `path: a != b` lines."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in a.keys() | b.keys():
            out += differences(a.get(k), b.get(k), f"{path}.{k}" if path else k)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            out += differences(x, y, f"{path}[{i}]")
        return out
    return [] if a == b else [f"{path or '<response>'}: kbroker {_short(a)} != kafka {_short(b)}"]


def _short(v: Any, limit: int = 160) -> str:
    text = repr(v)
    return text if len(text) < limit else text[: limit - 3] + "..."


# A row label for answers whose difference known.py explains: "API (known: reason)".
KNOWN = " (known: "


@dataclass
class Row:
    compared: int = 0
    identical: int = 0
    normalised: int = 0
    different: int = 0
    examples: list[str] = field(default_factory=list)


class Tally:
    """Counts per (API, version): identical, identical after normalisation, different (with the first examples)."""

    def __init__(self, keep: int = 3, dump: TextIO | None = None) -> None:
        self.rows: dict[tuple[str, int], Row] = defaultdict(Row)
        self.keep = keep
        self.dump = dump  # every difference in full, for analysis

    @staticmethod
    def same(ours: Any, theirs: Any) -> bool:
        """Identical, or identical after normalisation."""
        return not differences(plain(ours), plain(theirs))

    def record(self, api: str, version: int, ours: Any, theirs: Any, request: Any = None) -> list[str]:
        row = self.rows[(api, version)]
        row.compared += 1
        if plain(ours, normalise=False) == plain(theirs, normalise=False):
            row.identical += 1
            return []
        diff = differences(plain(ours), plain(theirs))
        if not diff:
            row.normalised += 1
            return []
        row.different += 1
        if self.dump is not None:
            self.dump.write(f"{api} v{version}: request {plain(request, normalise=False)!r}\n")
            for line in differences(plain(ours), plain(theirs)):
                self.dump.write(f"    {line}\n")
            self.dump.write(f"    kbroker {plain(ours)!r}\n    kafka   {plain(theirs)!r}\n")
            self.dump.flush()
        if len(row.examples) < self.keep:
            row.examples.append(
                f"request {_short(plain(request, normalise=False))}\n      " + "\n      ".join(diff[:6])
            )
        return diff

    def total_different(self) -> int:
        return sum(r.different for r in self.rows.values())

    def unexplained(self) -> int:
        """Differences outside the rows labelled with a reason of known.py."""
        return sum(r.different for (api, _), r in self.rows.items() if KNOWN not in api)

    def by_api(self) -> Tally:
        """The same counts with every version of an API (and of each known reason's row) in one row, version -1."""
        out = Tally(keep=0)
        for (api, _), r in self.rows.items():
            row = out.rows[(api, -1)]
            row.compared += r.compared
            row.identical += r.identical
            row.normalised += r.normalised
            row.different += r.different
        return out

    def table(self, examples: bool = True) -> str:
        w = max([34] + [len(api) + 2 for api, _ in self.rows])
        lines = [f"{'API':<{w}}{'v':>3}{'compared':>10}{'identical':>11}{'normalised':>12}{'different':>11}"]
        for (api, version), r in sorted(self.rows.items()):
            lines.append(
                f"{api:<{w}}{version:>3}{r.compared:>10}{r.identical:>11}{r.normalised:>12}{r.different:>11}"
            )
        total = Row()
        for r in self.rows.values():
            total.compared += r.compared
            total.identical += r.identical
            total.normalised += r.normalised
            total.different += r.different
        lines.append(
            f"{'total':<{w + 3}}{total.compared:>10}{total.identical:>11}{total.normalised:>12}{total.different:>11}"
        )
        if examples:
            for (api, version), r in sorted(self.rows.items()):
                for e in r.examples:
                    lines.append(f"- {api} v{version}: {e}")
        return "\n".join(lines)


Classifier = Callable[[int, int, Any, Any, Any], "str | None"]


class Pair:
    """kbroker and Kafka side by side: every request goes to both, every answer pair goes to the tally."""

    def __init__(
        self, kbroker: str, kafka: str, tally: Tally | None = None, classify: Classifier | None = None
    ) -> None:
        self.ours = Target("kbroker", kbroker)
        self.theirs = Target("kafka", kafka)
        self.tally = tally or Tally()
        # (api key, version, request, kbroker's answer, Kafka's) -> the known.py reason of a difference, or None
        self.classify = classify

    def _name(self, api_key: int, version: int, label: str | None, body: Any, ours: Any, theirs: Any) -> str:
        name = label or codec.REQUESTS[api_key].__name__.removesuffix("Request")
        classify = getattr(self, "classify", None)  # a Pair built with __new__ in the CI tests has none
        if classify is not None:
            # called for every answer pair: a classifier may remember what a deliberate difference left behind
            reason = classify(api_key, version, body, ours, theirs)
            if reason is not None and not Tally.same(ours, theirs):
                return f"{name}{KNOWN}{reason})"
        return name

    def both(
        self, api_key: int, version: int, body: Any, expect_response: bool = True, label: str | None = None
    ) -> tuple[Any, Any, list[str]]:
        ours = self.ours.send(api_key, version, body, expect_response)
        theirs = self.theirs.send(api_key, version, body, expect_response)
        name = self._name(api_key, version, label, body, ours, theirs)
        return ours, theirs, self.tally.record(name, version, ours, theirs, body)

    def each(
        self, api_key: int, version: int, ours_body: Any, theirs_body: Any, label: str | None = None
    ) -> tuple[Any, Any, list[str]]:
        """Like both(), with a body per side: for requests naming what each broker generated (member ids...)."""
        ours = self.ours.send(api_key, version, ours_body)
        theirs = self.theirs.send(api_key, version, theirs_body)
        name = self._name(api_key, version, label, ours_body, ours, theirs)
        return ours, theirs, self.tally.record(name, version, ours, theirs, ours_body)

    def close(self) -> None:
        self.ours.close()
        self.theirs.close()

"""`python -m tests.differential.replay [--sessions a,b | --seed N]`: record real client sessions (confluent-kafka,
kafka-python, aiokafka, the Java client) through a proxy in front of Apache Kafka 3.9, replay the same request bytes on the same connection layout against kbroker, and
print the normalised comparison per API and version (exit 1 when any answer differs)."""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import time
from typing import Any

import crc32c
from kbroker.protocol import codec

from tests.differential.harness import CLOSED, TIMEOUT, Tally
from tests.differential.proxy import Exchange, RecordingProxy, decode_answer
from tests.differential.sessions import CLIENTS, SESSIONS, SessionUnavailable, ordered, seeded_subset

FETCH, METADATA, API_VERSIONS, INIT_PRODUCER_ID = 1, 3, 18, 22
GENERATED_IDS = ("member_id", "leader")  # strings each coordinator generates; later requests name them


def record(kafka: str, names: list[str], tag: str, skipped: dict[str, str] | None = None) -> list[Exchange]:
    """The sessions run one after another through one proxy (a group reads what its producer session wrote). A
    session whose client cannot run here is left out, its reason put in `skipped`."""
    with RecordingProxy(kafka) as proxy:
        for name in ordered(names):
            first = len(proxy.exchanges)
            try:
                SESSIONS[name].run(proxy.bootstrap, tag)
            except SessionUnavailable as e:
                if skipped is None:
                    raise
                skipped[name] = str(e)
            for ex in proxy.exchanges[first:]:
                ex.session = name
        time.sleep(0.5)  # the last answers reach the proxy after the client has returned
        return list(proxy.exchanges)


class _Connection:
    def __init__(self, address: tuple[str, int], timeout: float) -> None:
        self.sock: socket.socket | None = socket.create_connection(address, timeout=timeout)

    def exchange(self, ex: Exchange, frame: bytes) -> Any:
        if self.sock is None:
            return CLOSED
        try:
            self.sock.sendall(struct.pack(">i", len(frame)) + frame)
            if not ex.expects_answer:
                return None
            size = struct.unpack(">i", self._exact(4))[0]
            frame = self._exact(size)
        except TimeoutError:
            self.close()
            return TIMEOUT
        except (ConnectionError, OSError):
            self.close()
            return CLOSED
        try:
            return decode_answer(ex.api_key, ex.version, frame)[1]
        except Exception as e:  # noqa: BLE001 - an answer kbroker's codec cannot read is itself a difference
            return f"<undecodable answer: {e}>"

    def _exact(self, n: int) -> bytes:
        assert self.sock is not None
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _generated(value: Any, out: dict[str, str]) -> None:
    for f in getattr(type(value), "FIELDS", ()):
        v = getattr(value, f.attr)
        if f.attr in GENERATED_IDS and isinstance(v, str):
            out.setdefault(f.attr, v)
        elif isinstance(v, list):
            for item in v:
                _generated(item, out)
        elif hasattr(type(v), "FIELDS"):
            _generated(v, out)


def replay(
    kbroker: str,
    exchanges: list[Exchange],
    tally: Tally | None = None,
    timeout: float = 15.0,
    by_client: dict[str, Tally] | None = None,
) -> Tally:
    """Send each recorded frame to kbroker in the recorded order, each on its own recorded connection, and compare
    kbroker's answer with Kafka's. What each broker generated and later requests name (member ids, topic ids,
    producer ids) is mapped from Kafka's value to kbroker's before the frame is sent. A request whose answer Kafka
    had not given when the client left is sent but not compared. `by_client` gets a tally per client as well."""
    tally = tally or Tally()
    host, port = kbroker.rsplit(":", 1)
    connections: dict[int, _Connection] = {}
    ids = Mapping()
    try:
        for ex in exchanges:
            conn = connections.get(ex.connection)
            if conn is None:
                conn = connections[ex.connection] = _Connection((host, int(port)), timeout)
            if ex.api_key == INIT_PRODUCER_ID and _errors(ex.answer, set()) & (TRANSIENT | COMPLETING):
                # each InitProducerId kbroker grants bumps the epoch: a retry that only Kafka's loading caused
                # would fence the producer's later requests, so it is not replayed
                tally.record("InitProducerId (Kafka transient, not replayed)", ex.version, None, None)
                continue
            frame = ids.rewrite(ex.frame)
            answer = conn.exchange(ex, frame)
            if not ex.expects_answer or ex.answer is None:
                continue
            if not isinstance(answer, str) and answer is not None:
                ids.learn(ex.answer, answer)
                if ex.api_key == FETCH:
                    ids.reverse()._walk(
                        answer
                    )  # the batches kbroker returns carry its producer ids (and CRCs)
            label, request = _label(ex, answer), _request(ex.api_key, frame)
            tally.record(label, ex.version, answer, ex.answer, request)
            if by_client is not None and ex.session in SESSIONS:
                client = by_client.setdefault(SESSIONS[ex.session].client, Tally(keep=0))
                client.record(label, ex.version, answer, ex.answer, request)
    finally:
        for c in connections.values():
            c.close()
    return tally


class Mapping:
    """Kafka's generated values -> kbroker's, learnt from answer pairs and applied to later request frames."""

    def __init__(self) -> None:
        self.strings: dict[str, str] = {}
        self.topic_ids: dict[Any, Any] = {}
        self.producer_ids: dict[int, int] = {}
        # incremental fetch sessions (KIP-227): the Java client and kafka-python name the one each broker created
        self.session_ids: dict[int, int] = {}

    def learn(self, theirs: Any, ours: Any) -> None:
        a: dict[str, str] = {}
        b: dict[str, str] = {}
        _generated(theirs, a)
        _generated(ours, b)
        for attr, value in a.items():
            if value and b.get(attr) and value != b[attr]:
                self.strings[value] = b[attr]
        their_pid, our_pid = getattr(theirs, "producer_id", None), getattr(ours, "producer_id", None)
        if isinstance(their_pid, int) and isinstance(our_pid, int) and their_pid >= 0 and our_pid >= 0:
            self.producer_ids[their_pid] = our_pid
        their_sid, our_sid = getattr(theirs, "session_id", None), getattr(ours, "session_id", None)
        if isinstance(their_sid, int) and isinstance(our_sid, int) and their_sid and our_sid:
            self.session_ids[their_sid] = our_sid
        ours_by_name = {
            t.name: t.topic_id for t in getattr(ours, "topics", None) or [] if hasattr(t, "topic_id")
        }
        for t in getattr(theirs, "topics", None) or []:
            # a topic Kafka has not created yet comes with the zero Uuid, which must not be mapped
            if (
                getattr(t, "name", None) in ours_by_name
                and getattr(t, "topic_id", None)
                and any(bytes(t.topic_id))
            ):
                self.topic_ids[t.topic_id] = ours_by_name[t.name]

    def reverse(self) -> Mapping:
        """kbroker's producer ids -> Kafka's, to compare the batches kbroker returns."""
        back = Mapping()
        back.producer_ids = {ours: theirs for theirs, ours in self.producer_ids.items()}
        return back

    def rewrite(self, frame: bytes) -> bytes:
        if not (
            self.strings
            or self.topic_ids
            or self.session_ids
            or any(a != b for a, b in self.producer_ids.items())
        ):
            return frame
        if struct.unpack_from(">h", frame)[0] == API_VERSIONS:
            return frame  # names nothing generated; a client may ask a version newer than the codec's
        header, pos = codec.decode_request_header(frame)
        body = codec.decode(codec.REQUESTS[header.request_api_key], header.request_api_version, frame, pos)[0]
        self._walk(body)
        return bytes(codec.encode_request(header, body))[4:]

    def _walk(self, value: Any) -> None:
        for f in getattr(type(value), "FIELDS", ()):
            v = getattr(value, f.attr)
            if isinstance(v, str) and v in self.strings:
                setattr(value, f.attr, self.strings[v])
            elif f.attr == "topic_id" and v in self.topic_ids:
                setattr(value, f.attr, self.topic_ids[v])
            elif "producer_id" in f.attr and isinstance(v, int) and v in self.producer_ids:
                setattr(value, f.attr, self.producer_ids[v])
            elif f.attr == "session_id" and isinstance(v, int) and v in self.session_ids:
                setattr(value, f.attr, self.session_ids[v])
            elif f.attr == "records" and v:
                setattr(value, f.attr, self._batches(bytes(v)))
            elif isinstance(v, list):
                for item in v:
                    self._walk(item)
            elif hasattr(type(v), "FIELDS"):
                self._walk(v)

    def _batches(self, records: bytes) -> bytes:
        """Record batches (magic 2) with their producer id mapped and their CRC-32C recomputed."""
        out, pos = bytearray(records), 0
        while pos + 61 <= len(out) and out[pos + 16] == 2:
            length = struct.unpack_from(">i", out, pos + 8)[0]
            (pid,) = struct.unpack_from(">q", out, pos + 43)
            if pid in self.producer_ids:
                struct.pack_into(">q", out, pos + 43, self.producer_ids[pid])
                end = pos + 12 + length
                struct.pack_into(">I", out, pos + 17, crc32c.crc32c(bytes(out[pos + 21 : end])))
            pos += 12 + length
        return bytes(out)


TRANSIENT = frozenset({5, 14, 15, 16})
COMPLETING = frozenset({51})  # CONCURRENT_TRANSACTIONS: known.REPLAY["Kafka completing a transaction"]
UNKNOWN_TOPIC_OR_PARTITION = (
    3  # in Metadata while Kafka creates the topic: known.REPLAY["Kafka auto-creating"]
)
# the labels of rows whose differences known.REPLAY explains
EXPLAINED = ("(known)", "transient)", "(Kafka completing a transaction)", "(Kafka auto-creating)")


def _errors(value: Any, out: set[int]) -> set[int]:
    for f in getattr(type(value), "FIELDS", ()):
        v = getattr(value, f.attr)
        if f.attr.endswith("error_code") and isinstance(
            v, int
        ):  # partition_error_code in AddPartitionsToTxn v0-3
            out.add(v)
        elif isinstance(v, list):
            for item in v:
                _errors(item, out)
        elif hasattr(type(v), "FIELDS"):
            _errors(v, out)
    return out


def _label(ex: Exchange, answer: Any) -> str:
    """The API's name, or the known.REPLAY label the answer pair falls under."""
    name = codec.REQUESTS[ex.api_key].__name__.removesuffix("Request")
    if ex.api_key == 18:
        return f"{name} (known)"  # known.REPLAY["ApiVersions"]
    if _errors(ex.answer, set()) & TRANSIENT and not _errors(answer, set()) & TRANSIENT:
        return f"{name} (Kafka transient)"
    if _errors(ex.answer, set()) & COMPLETING and not _errors(answer, set()) & COMPLETING:
        return f"{name} (Kafka completing a transaction)"
    if (
        ex.api_key == METADATA
        and UNKNOWN_TOPIC_OR_PARTITION in _errors(ex.answer, set())
        and UNKNOWN_TOPIC_OR_PARTITION not in _errors(answer, set())
        and getattr(_request(ex.api_key, ex.frame), "allow_auto_topic_creation", False)
    ):
        return f"{name} (Kafka auto-creating)"
    return name


def _request(api_key: int, frame: bytes) -> Any:
    try:
        header, pos = codec.decode_request_header(frame)
        return codec.decode(codec.REQUESTS[api_key], header.request_api_version, frame, pos)[0]
    except Exception:  # noqa: BLE001 - only shown with a difference
        return f"<{len(frame)} bytes the codec cannot read>"


def unexplained(tally: Tally) -> int:
    """Differences outside the rows labelled with a known.REPLAY reason."""
    return sum(r.different for (api, _), r in tally.rows.items() if not api.endswith(EXPLAINED))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.differential.replay", description=__doc__)
    parser.add_argument(
        "--sessions", default=",".join(SESSIONS), help="comma-separated: " + ", ".join(SESSIONS)
    )
    parser.add_argument(
        "--seed",
        type=int,
        help="instead of --sessions: one session per client picked with this seed (as CI does)",
    )
    parser.add_argument("--by-client", action="store_true", help="also a table per client")
    parser.add_argument("--examples-shown", type=int, default=3, help="differences shown per API and version")
    args = parser.parse_args(argv)
    names = [n for n in args.sessions.split(",") if n]
    if args.seed is not None:
        names = seeded_subset(args.seed, CLIENTS)
    unknown = [n for n in names if n not in SESSIONS]
    if unknown:
        print(f"unknown session(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    from bench.peers.maven import ArtifactUnavailable
    from tests.differential.session import brokers

    skipped: dict[str, str] = {}
    by_client: dict[str, Tally] = {}
    started = time.monotonic()
    try:
        with brokers() as (kbroker, kafka):
            exchanges = record(kafka, names, "cli", skipped)
            tally = replay(kbroker, exchanges, Tally(keep=args.examples_shown), by_client=by_client)
    except ArtifactUnavailable as e:
        print(f"Kafka 3.9 is unavailable here: {e}", file=sys.stderr)
        return 2
    recorded = [n for n in ordered(names) if n not in skipped]
    print(f"sessions: {', '.join(recorded)}")
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    print(
        f"recorded {len(exchanges)} requests on {len({e.connection for e in exchanges})} connections "
        f"in {time.monotonic() - started:.0f} s (both brokers' start included)"
    )
    print(tally.table())
    if args.by_client:
        for client, t in sorted(by_client.items()):
            print(f"\n{client}:")
            print(t.table(examples=False))
    return 1 if unexplained(tally) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

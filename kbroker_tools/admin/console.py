"""kbroker-admin console-producer / console-consumer / get-offsets: Kafka's console tools and GetOffsetShell."""

from __future__ import annotations

import random
import re
import signal
import sys
import time
from typing import Any

from kbroker_tools.admin.common import (
    CommandError,
    ToolParser,
    add_connection_args,
    admin_client,
    check_client,
    client_conf,
    parse_key_values,
    read_properties_file,
    require_client,
    result,
)


def run(name: str, argv: list[str]) -> int:
    if name == "console-producer":
        return producer(argv)
    if name == "console-consumer":
        return consumer(argv)
    return get_offsets(argv)


def _unescape(s: str) -> str:
    """`--property key.separator=\\t` arrives as backslash-t from a shell: mean the tab, as Kafka does."""
    return s.encode("latin-1", "backslashreplace").decode("unicode_escape")


def _props(items: list[str] | None) -> dict[str, str]:
    return {k: _unescape(v) for k, v in parse_key_values_raw(items).items()}


def parse_key_values_raw(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or ():
        k, sep, v = item.partition("=")
        if not sep:
            raise CommandError(f"--property {item!r}: expected key=value")
        out[k.strip()] = v
    return out


def _true(props: dict[str, str], key: str, default: bool = False) -> bool:
    v = props.get(key)
    return default if v is None else v.strip().lower() == "true"


# ---------------------------------------------------------------- console-producer


def producer_parser() -> ToolParser:
    ap = ToolParser(prog="kbroker-admin console-producer",
                                 description="Read records from standard input, one per line, and produce them.")
    ap.add_argument("--bootstrap-server", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--property", action="append", metavar="KEY=VALUE",
                    help="parse.key, key.separator (default tab), parse.headers, headers.delimiter, "
                         "headers.separator, headers.key.separator, null.marker, ignore.error")
    ap.add_argument("--producer-property", action="append", metavar="KEY=VALUE")
    ap.add_argument("--producer.config", dest="producer_config", metavar="FILE")
    ap.add_argument("--request-required-acks", default="-1")
    ap.add_argument("--compression-codec", nargs="?", const="gzip", default=None)
    ap.add_argument("--sync", action="store_true", help="wait for each record's acknowledgement")
    return ap


def producer(argv: list[str]) -> int:
    args = producer_parser().parse_args(argv)
    require_client()
    from confluent_kafka import Producer

    props = _props(args.property)
    conf = client_conf(args, {"acks": args.request_required_acks})
    conf.update(read_properties_file(args.producer_config))
    conf.update(parse_key_values(args.producer_property, "--producer-property"))
    if args.compression_codec:
        conf["compression.type"] = args.compression_codec
    parse_key, key_sep = _true(props, "parse.key"), props.get("key.separator", "\t")
    parse_headers = _true(props, "parse.headers")
    h_delim, h_sep, h_kv = (props.get("headers.delimiter", "\t"), props.get("headers.separator", ","),
                            props.get("headers.key.separator", ":"))
    null_marker, ignore_error = props.get("null.marker"), _true(props, "ignore.error")
    errors: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    p = Producer(conf)
    # A malformed line ends the input, as in Kafka's console producer: what was read before it is still delivered.
    bad: str | None = None
    sent = 0
    for lineno, raw in enumerate(sys.stdin, 1):
        line = raw.rstrip("\n")
        headers: list[tuple[str, bytes | None]] = []
        if parse_headers:
            hdr, sep, line = line.partition(h_delim)
            if not sep:
                if not ignore_error:
                    bad = f"No headers delimiter found on line number {lineno}: '{raw.rstrip(chr(10))}'"
                    break
                line = hdr
            else:
                for item in hdr.split(h_sep) if hdr else []:
                    hk, _, hv = item.partition(h_kv)
                    headers.append((hk, None if hv == null_marker else hv.encode()))
        key: str | None = None
        if parse_key:
            key, sep, value = line.partition(key_sep)
            if not sep:
                if not ignore_error:
                    bad = f"No key separator found on line number {lineno}: '{raw.rstrip(chr(10))}'"
                    break
                key, value = None, line
        else:
            value = line
        if null_marker is not None:
            key = None if key == null_marker else key
        record = {"value": None if value == null_marker else value.encode(),
                  "key": None if key is None else key.encode(), "headers": headers or None}
        while True:
            try:
                p.produce(args.topic, on_delivery=delivered, **record)
                break
            except BufferError:  # librdkafka's queue is full: wait for acknowledgements, as Kafka's send blocks
                p.poll(0.2)
                check_client()
        sent += 1
        if args.sync:
            _flush(p, 30)
        else:
            p.poll(0)
    if _flush(p, 30):
        raise CommandError("some records were not acknowledged within 30 s")
    if errors:
        raise CommandError(f"{len(errors)} records failed, the first: {errors[0]}")
    if bad is not None:
        raise CommandError(f"{bad} (the {sent} records before it were sent)")
    return 0


def _flush(p: Any, timeout: float) -> int:
    """Producer.flush in slices, so that a broker that goes away ends the wait (check_client) within a second."""
    deadline = time.monotonic() + timeout
    while (left := p.flush(0.5)) and time.monotonic() < deadline:
        check_client()
    return int(left)


# ---------------------------------------------------------------- console-consumer


def consumer_parser() -> ToolParser:
    ap = ToolParser(prog="kbroker-admin console-consumer",
                                 description="Print the records of a topic to standard output.")
    ap.add_argument("--bootstrap-server", required=True)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--topic")
    src.add_argument("--include", metavar="REGEX", help="every topic matching the regular expression")
    ap.add_argument("--group", help="consumer group (default: a new console-consumer-NNNNN group)")
    ap.add_argument("--from-beginning", action="store_true")
    ap.add_argument("--partition", type=int, help="read only this partition (no group)")
    ap.add_argument("--offset", default=None, help="with --partition: earliest, latest or an offset")
    ap.add_argument("--max-messages", type=int)
    ap.add_argument("--timeout-ms", type=int, help="exit when no record arrives for this long")
    ap.add_argument("--property", action="append", metavar="KEY=VALUE",
                    help="print.key, print.value, print.timestamp, print.partition, print.offset, print.headers, "
                         "key.separator, line.separator, headers.separator, null.literal")
    ap.add_argument("--consumer-property", action="append", metavar="KEY=VALUE")
    ap.add_argument("--consumer.config", dest="consumer_config", metavar="FILE")
    ap.add_argument("--isolation-level", choices=("read_uncommitted", "read_committed"))
    return ap


def consumer(argv: list[str]) -> int:
    args = consumer_parser().parse_args(argv)
    require_client()
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

    props = _props(args.property)
    generated = args.group is None
    group = args.group or f"console-consumer-{random.randint(10000, 99999)}"
    conf = client_conf(args, {"group.id": group, "enable.auto.commit": not generated,
                              "auto.offset.reset": "earliest" if args.from_beginning else "latest"})
    conf.pop("client.id", None)
    conf.update(read_properties_file(args.consumer_config))
    conf.update(parse_key_values(args.consumer_property, "--consumer-property"))
    if args.isolation_level:
        conf["isolation.level"] = args.isolation_level
    c = Consumer(conf)
    if args.partition is not None:
        if not args.topic:
            raise CommandError("--partition needs --topic")
        where = args.offset or ("earliest" if args.from_beginning else "latest")
        offset = {"earliest": OFFSET_BEGINNING, "latest": OFFSET_END}.get(where)
        if offset is None and not where.lstrip("-").isdigit():
            raise CommandError(f"--offset {where!r}: expected earliest, latest or an offset")
        c.assign([TopicPartition(args.topic, args.partition, offset if offset is not None else int(where))])
    elif args.offset is not None:
        raise CommandError("--offset needs --partition")
    else:
        if args.include:
            _topic_pattern(args.include, "--include")
        c.subscribe([args.topic] if args.topic else [f"^{args.include}"])
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    count, last = 0, time.monotonic()
    out = sys.stdout.buffer
    try:
        while not stop and (args.max_messages is None or count < args.max_messages):
            msg = c.poll(0.2)
            check_client()  # without --timeout-ms, a broker that goes away ends the tool rather than a hang
            if msg is None:
                if args.timeout_ms is not None and (time.monotonic() - last) * 1000 >= args.timeout_ms:
                    break
                continue
            if msg.error() is not None:
                if msg.error().code() == -191:  # _PARTITION_EOF
                    continue
                raise CommandError(str(msg.error()))
            last = time.monotonic()
            out.write(format_record(msg, props))
            out.flush()
            count += 1
    except KeyboardInterrupt:
        pass
    finally:
        c.close()
        print(f"Processed a total of {count} messages", file=sys.stderr)
    return 0


def format_record(msg: Any, props: dict[str, str]) -> bytes:
    """Kafka's DefaultMessageFormatter: timestamp, partition, offset, headers, key, value, in that order."""
    sep = props.get("key.separator", "\t").encode()
    line_sep = props.get("line.separator", "\n").encode()
    null = props.get("null.literal", "null").encode()
    parts: list[bytes] = []
    if _true(props, "print.timestamp"):
        ts_type, ts = msg.timestamp()
        name = {1: "CreateTime", 2: "LogAppendTime"}.get(ts_type)
        parts.append(f"{name}:{ts}".encode() if name else b"NO_TIMESTAMP")
    if _true(props, "print.partition"):
        parts.append(f"Partition:{msg.partition()}".encode())
    if _true(props, "print.offset"):
        parts.append(f"Offset:{msg.offset()}".encode())
    if _true(props, "print.headers"):
        hs = msg.headers() or []
        hsep = props.get("headers.separator", ",").encode()
        parts.append(hsep.join(k.encode() + b":" + (null if v is None else v) for k, v in hs) if hs
                     else b"NO_HEADERS")
    if _true(props, "print.key"):
        parts.append(null if msg.key() is None else msg.key())
    if _true(props, "print.value", True):
        parts.append(null if msg.value() is None else msg.value())
    return sep.join(parts) + line_sep


# ---------------------------------------------------------------- get-offsets


TIME_NAMES = {"latest": -1, "earliest": -2, "max-timestamp": -3}


def _partition_ranges(spec: str, flag: str, exclusive: bool = False) -> list[tuple[int, int | None]]:
    """Partition lists: `0,2-4`, with open ranges `3-` and `-2`; inclusive bounds, or for --topic-partitions
    Kafka's `lower inclusive, upper exclusive`."""
    out: list[tuple[int, int | None]] = []
    for item in (x.strip() for x in spec.split(",")):
        lo, sep, hi = item.partition("-")
        try:
            if not sep:
                out.append((int(lo), int(lo)))
            else:
                out.append((int(lo) if lo else 0, (int(hi) - exclusive) if hi else None))
        except ValueError:
            raise CommandError(f"{flag} {spec!r}: expected partition ids or ranges, e.g. 0,2-4") from None
    return out


def _in_ranges(p: int, ranges: list[tuple[int, int | None]] | None) -> bool:
    return ranges is None or any(lo <= p and (hi is None or p <= hi) for lo, hi in ranges)


def _topic_pattern(text: str, flag: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as e:
        raise CommandError(f"{flag} {text!r} is not a valid regular expression: {e}") from None


def _topic_partition_filters(args: Any) -> list[tuple[re.Pattern[str] | None, str | None, Any]]:
    """(topic regex, literal name, partition ranges) filters: --topic-partitions `t1:0-2,t2,:0` (GetOffsetShell's
    `TOPIC_REGEX[:N|N-M|N-|-M]` entries, upper bounds exclusive), else --topic and --partitions."""
    if args.topic_partitions:
        if args.topic or args.partitions:
            raise CommandError("--topic-partitions cannot be used with --topic or --partitions")
        filters: list[tuple[re.Pattern[str] | None, str | None, Any]] = []
        for entry in args.topic_partitions.split(","):
            topic, sep, parts = entry.strip().partition(":")
            pattern = _topic_pattern(topic, "--topic-partitions") if topic else None
            ranges = _partition_ranges(parts, "--topic-partitions", exclusive=True) if sep and parts else None
            filters.append((pattern, topic or None, ranges))
        return filters
    pattern = _topic_pattern(args.topic, "--topic") if args.topic else None
    ranges = _partition_ranges(args.partitions, "--partitions") if args.partitions else None
    return [(pattern, args.topic, ranges)]


def get_offsets_parser() -> ToolParser:
    ap = ToolParser(prog="kbroker-admin get-offsets",
                                 description="Offsets of topic partitions: latest, earliest, max-timestamp or by time.")
    add_connection_args(ap)
    ap.add_argument("--topic", help="topic name or regular expression (default: all topics)")
    ap.add_argument("--partitions", help="comma-separated partition ids or ranges, e.g. 0,2-4")
    ap.add_argument("--topic-partitions", metavar="TOPIC_REGEX:PARTITIONS,...",
                    help="TOPIC_REGEX[:N|N-M|N-|-M] entries (M exclusive), e.g. orders:0-2,clicks,:0; "
                         "instead of --topic/--partitions")
    ap.add_argument("--time", default="-1",
                    help="-1 or latest (default), -2 or earliest, -3 or max-timestamp, or a timestamp in ms")
    ap.add_argument("--exclude-internal-topics", action="store_true")
    return ap


def get_offsets(argv: list[str]) -> int:
    args = get_offsets_parser().parse_args(argv)
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    try:
        when = TIME_NAMES[args.time] if args.time in TIME_NAMES else int(args.time)
    except ValueError:
        raise CommandError(f"--time {args.time!r}: expected -1, -2, -3, latest, earliest, max-timestamp or ms") from None
    spec = {-1: OffsetSpec.latest(), -2: OffsetSpec.earliest(), -3: OffsetSpec.max_timestamp()}.get(when)
    if spec is None:
        if when < 0:
            raise CommandError(f"--time {when}: not supported")
        spec = OffsetSpec.for_timestamp(when)
    admin = admin_client(args)
    filters = _topic_partition_filters(args)
    md = admin.list_topics(timeout=30)
    tps = sorted({(t, p) for t, tm in md.topics.items() if not (args.exclude_internal_topics and t.startswith("__"))
                  for p in tm.partitions
                  for rx, name, ranges in filters
                  if (rx is None or t == name or rx.fullmatch(t)) and _in_ranges(p, ranges)})
    tps = [TopicPartition(t, p) for t, p in tps]
    if not tps:
        return 0
    futures = admin.list_offsets({tp: spec for tp in tps}, request_timeout=30)
    rows = []
    for tp, fut in futures.items():
        info = result(fut, f"listing offsets of {tp.topic}-{tp.partition}")
        rows.append((tp.topic, tp.partition, info.offset))
    for t, p, o in sorted(rows):
        print(f"{t}:{p}:{o if o >= 0 else ''}")
    return 0

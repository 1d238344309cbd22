"""Workload: the schema registry inside the broker. Two rows, one kbroker with `schema.registry.listeners`:

- 1,000 subject registrations over HTTP, one at a time (POST /subjects/{s}/versions, each a write to `_schemas`
  with acks=all read back before the answer): registrations per second and broker CPU per registration.
- Avro serializer round trips with cached ids: confluent-kafka's AvroSerializer produces records and
  AvroDeserializer reads them back; after the first record both sides use their cached schema id, so the broker's
  CPU per record stays near that of plain produce + consume of the same bytes (measured alongside as the baseline;
  what remains is batching: the serializing client fills smaller batches).

Apache Kafka has no schema registry (Confluent Schema Registry and Karapace are separate services, neither part of
Apache Kafka nor run here), so the registration and Avro rows have no Kafka column. What is measurable on Kafka is
the transport under the registry: the baseline row (the same bytes produced and consumed, no registry) runs on each
Apache Kafka of --peers after kbroker's repetitions, one broker at a time (Tansu is left out), so kbroker's Avro
CPU per record can be read against Kafka's for the same records.
"""

from __future__ import annotations

import json
import time
import urllib.request

from bench.harness import Ctx, KafkaTarget, KBroker, Row, Target, free_port, med, start_peer

SCHEMA = {
    "type": "record",
    "name": "PageView",
    "namespace": "bench",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "url", "type": "string"},
        {"name": "ms", "type": "long"},
    ],
}


def _register(url: str, subject: str, schema: str) -> int:
    req = urllib.request.Request(
        f"{url}/subjects/{subject}/versions",
        method="POST",
        data=json.dumps({"schema": schema}).encode(),
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return int(json.loads(resp.read())["id"])


def _wait_registry(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/subjects", timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _round_trip(kb: Target, url: str | None, topic: str, n: int) -> tuple[float, float]:
    """Produce n PageViews (Avro through the registry when url is given, else the same bytes plain) and consume
    them back; (records per second, broker CPU us per record)."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    ctx = SerializationContext(topic, MessageField.VALUE)
    records = [{"user": f"u{i % 97}", "url": f"/page/{i % 1013}", "ms": i} for i in range(n)]
    serialize = deserialize = None
    if url is not None:
        client = SchemaRegistryClient({"url": url})
        serialize, deserialize = AvroSerializer(client, json.dumps(SCHEMA)), AvroDeserializer(client)
        plain_values = None
    else:
        # The same bytes without the registry: Confluent's framing (magic 0, schema id) around fastavro's encoding,
        # made up front.
        import io

        import fastavro

        parsed = fastavro.parse_schema(SCHEMA)
        plain_values = []
        for r in records:
            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, parsed, r)
            plain_values.append(b"\x00" + (1).to_bytes(4, "big") + buf.getvalue())
    p = Producer({"bootstrap.servers": kb.bootstrap, "linger.ms": 50, "log_level": 3})
    p.list_topics(topic, timeout=10)
    c0, t0 = kb.cpu(), time.perf_counter()
    for i, r in enumerate(records):
        value = serialize(r, ctx) if serialize is not None else plain_values[i]  # type: ignore[index]
        while True:
            try:
                p.produce(topic, value=value)
                break
            except BufferError:
                p.poll(0.01)
    if p.flush(120):
        raise RuntimeError("undelivered records")
    c = Consumer(
        {
            "bootstrap.servers": kb.bootstrap,
            "group.id": f"bench-{topic}",
            "auto.offset.reset": "earliest",
            "log_level": 3,
        }
    )
    c.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 120
    try:
        while got < n and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                if m.error() is None:
                    if deserialize is not None:
                        deserialize(m.value(), ctx)
                    got += 1
    finally:
        c.close()
    secs, cpu = time.perf_counter() - t0, kb.cpu() - c0
    if got < n:
        raise RuntimeError(f"consumed {got} of {n}")
    return n / secs, cpu * 1e6 / n


def run(ctx: Ctx) -> list[Row]:
    registrations = ctx.n(1000, 200)
    records = ctx.n(20_000, 2_000)
    reg = Row(
        f"schema registry: {registrations} subject registrations, one at a time",
        "req/s",
        target="(reported: broker CPU per registration)",
    )
    plain = Row(f"produce + consume {records} records, no registry (baseline)", "msg/s", target="(baseline)")
    avro = Row(
        f"Avro serializer round trips, {records} records, cached ids",
        "msg/s",
        target="CPU/record <= 1.2x baseline (no registry request per record)",
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    kb = KBroker(ctx.base, {"schema.registry.listeners": url})
    try:
        kb.start()
        _wait_registry(url)
        _round_trip(kb, None, "bench-sr-warm-up", 100)  # __consumer_offsets and the first group: not measured
        for rep in range(ctx.reps):
            if ctx.out_of_time(f"schema_registry rep {rep + 1}"):
                break
            c0, t0 = kb.cpu(), time.perf_counter()
            for i in range(registrations):
                _register(url, f"bench-r{rep}-s{i}", json.dumps({**SCHEMA, "name": f"R{rep}x{i}"}))
            secs, cpu = time.perf_counter() - t0, kb.cpu() - c0
            reg.kb.append(registrations / secs)
            reg.kb_cpu_us.append(cpu * 1e6 / registrations)
            for row, registry in ((plain, None), (avro, url)):
                rate, cpu_us = _round_trip(
                    kb, registry, f"bench-sr-{'avro' if registry else 'plain'}-{rep}", records
                )
                row.kb.append(rate)
                row.kb_cpu_us.append(cpu_us)
            ctx.log(
                f"  schema registry rep {rep + 1}: {reg.kb[-1]:,.0f} registrations/s ({reg.kb_cpu_us[-1]:.0f} us "
                f"CPU each); round trips {plain.kb[-1]:,.0f} msg/s plain, {avro.kb[-1]:,.0f} msg/s Avro "
                f"({plain.kb_cpu_us[-1]:.1f} vs {avro.kb_cpu_us[-1]:.1f} us CPU/record)"
            )
        for r in (reg, plain, avro):
            r.kb_rss_mb.append(kb.hwm_mb())
    finally:
        kb.stop()

    def within(r: Row) -> bool | None:
        # A registry request costs the broker ~1 ms of CPU: one per record would show as hundreds of us per
        # record. The rest of the difference is batching (the serializing client fills smaller batches).
        a, b = med(r.kb_cpu_us), med(plain.kb_cpu_us)
        return None if a is None or b is None else a <= b + 5

    avro.check = within
    _peers_baseline(ctx, plain, records)
    if ctx.extra.get("peers"):
        for r in (reg, avro):
            r.note += (" no Apache Kafka column: Kafka has no schema registry (Confluent's and Karapace are separate "
                       "services); the baseline row has Kafka's produce + consume of the same bytes;")
    return [reg, plain, avro]


def _apache_kafka_only(t: Target) -> None:
    # The rows compare with what users run beside a registry; Tansu's consumer read none of the 100 warm-up records
    # within its two minutes in the first run (2026-11-29), a wait the full run need not pay.
    if not isinstance(t, KafkaTarget):
        raise RuntimeError("the registry rows are compared with Apache Kafka only")


def _peers_baseline(ctx: Ctx, plain: Row, records: int) -> None:
    """The no-registry round trips on each --peers broker, one at a time, warmed up as kbroker was."""
    for key in ctx.extra.get("peers", []):
        if ctx.out_of_time(f"schema_registry {key}"):
            break
        t = start_peer(ctx, key, _apache_kafka_only, " (schema_registry baseline)")
        if t is None:
            continue
        try:
            _round_trip(t, None, "bench-sr-warm-up", 100)
            for rep in range(ctx.reps):
                if ctx.out_of_time(f"schema_registry {t.name} rep {rep + 1}"):
                    break
                rate, cpu_us = _round_trip(t, None, f"bench-sr-plain-{rep}", records)
                plain.add(t, rate, cpu_us)
                ctx.log(f"  schema registry baseline rep {rep + 1} {t.name}: {rate:,.0f} msg/s plain round trips "
                        f"({cpu_us:.1f} us CPU/record)")
            plain.add_rss(t)
        except Exception as e:  # noqa: BLE001 - a peer's failure is its cell's note
            plain.note += f" {t.name}: {type(e).__name__}: {str(e)[:200]};"
            ctx.log(f"  schema registry baseline {t.name}: failed: {type(e).__name__}: {e}")
        finally:
            t.stop()

"""The real client sessions the replay records (confluent-kafka, kafka-python, aiokafka, the Java client): each
runs against a bootstrap address (the recording proxy) and a tag that keeps its topics and groups apart."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass


class SessionUnavailable(RuntimeError):
    """The session's client cannot run here (library, JDK or jars missing); the message says why."""


@dataclass(frozen=True)
class Session:
    client: str
    run: Callable[[str, str], None]
    after: str | None = None  # the session whose records this one reads: recorded first


def idempotent_produce(bootstrap: str, tag: str) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "client.id": "replay-producer"})
    for i in range(20):
        p.produce(f"replay-{tag}", key=b"k%d" % (i % 3), value=b"v%d" % i)
    if p.flush(30) != 0:
        raise RuntimeError("idempotent produce did not complete")


def group_consume(bootstrap: str, tag: str) -> None:
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"replay-group-{tag}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "client.id": "replay-consumer",
        }
    )
    c.subscribe([f"replay-{tag}"])
    seen, deadline = 0, time.monotonic() + 30
    while seen < 20 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            seen += 1
    c.commit(asynchronous=False)
    c.close()
    if seen < 20:
        raise RuntimeError(f"the group consumed {seen} of 20 records")


def transaction(bootstrap: str, tag: str) -> None:
    from confluent_kafka import Producer

    p = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"replay-txn-{tag}", "client.id": "replay-txn"}
    )
    p.init_transactions(60)
    p.begin_transaction()
    for i in range(5):
        p.produce(f"replay-txn-{tag}", value=b"t%d" % i)
    p.commit_transaction(60)


def _registry() -> dict[str, Session]:
    from tests.differential import sessions_java as java
    from tests.differential import sessions_python as py

    return {
        "idempotent-produce": Session("confluent-kafka", idempotent_produce),
        "group-consume": Session("confluent-kafka", group_consume, after="idempotent-produce"),
        "transaction": Session("confluent-kafka", transaction),
        "kp-produce": Session("kafka-python", py.kp_produce),
        "kp-group": Session("kafka-python", py.kp_group, after="kp-produce"),
        "kp-transaction": Session("kafka-python", py.kp_transaction),
        "kp-admin": Session("kafka-python", py.kp_admin),
        "aio-produce": Session("aiokafka", py.aio_produce),
        "aio-group": Session("aiokafka", py.aio_group, after="aio-produce"),
        "aio-transaction": Session("aiokafka", py.aio_transaction),
        "aio-admin": Session("aiokafka", py.aio_admin),
        "java-idempotent": Session("java", java.idempotent),
        "java-group": Session("java", java.group, after="java-idempotent"),
        "java-transaction": Session("java", java.transaction),
        "java-admin": Session("java", java.admin),
    }


SESSIONS: dict[str, Session] = _registry()
CLIENTS = ("confluent-kafka", "kafka-python", "aiokafka", "java")
CONFLUENT = [n for n, s in SESSIONS.items() if s.client == "confluent-kafka"]


def ordered(names: list[str]) -> list[str]:
    """The sessions named with the ones they read from, each once, a producer before its readers."""
    out: list[str] = []
    for name in names:
        chain = []
        while name is not None and name not in out and name not in chain:
            chain.append(name)
            name = SESSIONS[name].after
        out += reversed(chain)
    return out


def seeded_subset(seed: int, clients: tuple[str, ...]) -> list[str]:
    """One session per client, picked with `seed` (the CI pass: the long run records them all)."""
    picked = [
        random.Random(f"{seed}/{c}").choice(sorted(n for n, s in SESSIONS.items() if s.client == c))
        for c in clients
    ]
    return ordered(picked)

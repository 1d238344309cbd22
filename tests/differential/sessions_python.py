"""kafka-python and aiokafka replay sessions: an idempotent producer, a group consuming its records and committing,
a committed and an aborted transaction, and an admin client creating, describing, altering and deleting a topic."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tests.differential.sessions import SessionUnavailable

RECORDS = 20


def _kafka_python() -> Any:
    try:
        import kafka
    except ImportError:
        raise SessionUnavailable("kafka-python is not installed (the `test` extra)") from None
    return kafka


def _aiokafka() -> Any:
    try:
        import aiokafka
    except ImportError:
        raise SessionUnavailable("aiokafka is not installed (the `test` extra)") from None
    return aiokafka


def _check(seen: int, what: str) -> None:
    if seen != RECORDS:
        raise RuntimeError(f"{what} consumed {seen} of {RECORDS} records")


# ---------------------------------------------------------------- kafka-python


def kp_produce(bootstrap: str, tag: str) -> None:
    kafka = _kafka_python()
    p = kafka.KafkaProducer(
        bootstrap_servers=bootstrap,
        client_id="replay-kp-producer",
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
    )
    try:
        sent = [p.send(f"replay-kp-{tag}", key=b"k%d" % (i % 3), value=b"v%d" % i) for i in range(RECORDS)]
        p.flush(30)
        for f in sent:
            f.get(30)
    finally:
        p.close(10)


def kp_group(bootstrap: str, tag: str) -> None:
    kafka = _kafka_python()
    topic = f"replay-kp-{tag}"
    c = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id="replay-kp-consumer",
        group_id=f"replay-kp-group-{tag}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    seen, deadline = 0, time.monotonic() + 60  # generous: CI shares 2 cores
    try:
        # Subscribed only once the topic's partitions are known: a group joined while the broker still answers
        # LEADER_NOT_AVAILABLE for it (Kafka 3.9 on a loaded CI machine) was assigned nothing and read nothing.
        while not c.partitions_for_topic(topic) and time.monotonic() < deadline:
            time.sleep(0.2)
        c.subscribe([topic])
        while seen < RECORDS and time.monotonic() < deadline:
            seen += sum(len(batch) for batch in c.poll(timeout_ms=200).values())
        c.commit()
    finally:
        c.close()
    _check(seen, "the kafka-python group")


def kp_transaction(bootstrap: str, tag: str) -> None:
    kafka = _kafka_python()
    p = kafka.KafkaProducer(
        bootstrap_servers=bootstrap,
        client_id="replay-kp-txn",
        transactional_id=f"replay-kp-txn-{tag}",
        linger_ms=5,
    )
    try:
        p.init_transactions()
        p.begin_transaction()
        for i in range(5):
            p.send(f"replay-kp-txn-{tag}", value=b"t%d" % i)
        p.commit_transaction()
        p.begin_transaction()
        for i in range(2):
            p.send(f"replay-kp-txn-{tag}", value=b"a%d" % i)
        p.flush(30)
        p.abort_transaction()
    finally:
        p.close(10)


def kp_admin(bootstrap: str, tag: str) -> None:
    kafka = _kafka_python()
    from kafka.admin import ConfigResource, ConfigResourceType
    from kafka.errors import TopicAlreadyExistsError

    topic = f"replay-kp-admin-{tag}"
    a = kafka.KafkaAdminClient(bootstrap_servers=bootstrap, client_id="replay-kp-admin")
    try:
        a.describe_cluster()
        a.create_topics(
            {
                topic: {
                    "num_partitions": 3,
                    "replication_factor": 1,
                    "configs": {"cleanup.policy": "compact"},
                }
            }
        )
        try:
            a.create_topics({topic: {"num_partitions": 3, "replication_factor": 1}})
        except TopicAlreadyExistsError:
            pass
        else:
            raise RuntimeError("creating an existing topic succeeded")
        a.describe_topics([topic])
        resource = ConfigResource(ConfigResourceType.TOPIC, topic)
        a.describe_configs([resource], config_filter="all")
        a.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, configs={"retention.ms": "7200000"})],
            raise_on_unknown=False,
        )
        a.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
        if topic not in a.list_topics():
            raise RuntimeError(f"list_topics misses {topic}")
        a.delete_topics([topic])
    finally:
        a.close()


# ---------------------------------------------------------------- aiokafka


def _error_codes(value: Any) -> list[int]:
    """Every error code in an aiokafka response (its to_object() tree)."""
    if isinstance(value, dict):
        return [c for k, v in value.items() for c in ([v] if k == "error_code" else _error_codes(v))]
    if isinstance(value, list | tuple):
        return [c for v in value for c in _error_codes(v)]
    return []


def aio_produce(bootstrap: str, tag: str) -> None:
    aiokafka = _aiokafka()

    async def run() -> None:
        p = aiokafka.AIOKafkaProducer(
            bootstrap_servers=bootstrap, client_id="replay-aio-producer", enable_idempotence=True, linger_ms=5
        )
        await p.start()
        try:
            sent = [
                await p.send(f"replay-aio-{tag}", key=b"k%d" % (i % 3), value=b"v%d" % i)
                for i in range(RECORDS)
            ]
            await asyncio.gather(*sent)
        finally:
            await p.stop()

    asyncio.run(run())


def aio_group(bootstrap: str, tag: str) -> None:
    aiokafka = _aiokafka()

    async def run() -> int:
        c = aiokafka.AIOKafkaConsumer(
            f"replay-aio-{tag}",
            bootstrap_servers=bootstrap,
            client_id="replay-aio-consumer",
            group_id=f"replay-aio-group-{tag}",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await c.start()
        seen, deadline = 0, time.monotonic() + 60  # generous: CI shares 2 cores
        try:
            while seen < RECORDS and time.monotonic() < deadline:
                seen += sum(len(b) for b in (await c.getmany(timeout_ms=200)).values())
            await c.commit()
        finally:
            await c.stop()
        return seen

    _check(asyncio.run(run()), "the aiokafka group")


def aio_transaction(bootstrap: str, tag: str) -> None:
    aiokafka = _aiokafka()

    async def run() -> None:
        p = aiokafka.AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            client_id="replay-aio-txn",
            transactional_id=f"replay-aio-txn-{tag}",
            linger_ms=5,
        )
        await p.start()
        try:
            async with p.transaction():
                for i in range(5):
                    await p.send(f"replay-aio-txn-{tag}", value=b"t%d" % i)
            await p.begin_transaction()
            sent = [await p.send(f"replay-aio-txn-{tag}", value=b"a%d" % i) for i in range(2)]
            await asyncio.gather(*sent)
            await p.abort_transaction()
        finally:
            await p.stop()

    asyncio.run(run())


def aio_admin(bootstrap: str, tag: str) -> None:
    _aiokafka()
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    topic = f"replay-aio-admin-{tag}"

    async def run() -> None:
        a = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="replay-aio-admin")
        await a.start()
        try:
            await a.describe_cluster()
            created = await a.create_topics(
                [NewTopic(topic, 3, 1, topic_configs={"cleanup.policy": "compact"})]
            )
            if set(_error_codes(created.to_object())) != {0}:
                raise RuntimeError(f"create_topics: {created}")
            again = await a.create_topics([NewTopic(topic, 3, 1)])
            if 36 not in _error_codes(again.to_object()):  # TOPIC_ALREADY_EXISTS
                raise RuntimeError(f"creating an existing topic: {again}")
            await a.describe_topics([topic])
            resource = ConfigResource(ConfigResourceType.TOPIC, topic)
            await a.describe_configs([resource])
            await a.alter_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic, {"retention.ms": "7200000"})]
            )
            await a.describe_configs([resource])
            if topic not in await a.list_topics():
                raise RuntimeError(f"list_topics misses {topic}")
            await a.delete_topics([topic])
        finally:
            await a.close()

    asyncio.run(run())

"""Transactional client applications that tests run as separate processes (so that they can be kill -9'd).

    python -m tests.txn_apps hang BOOTSTRAP TOPIC PARTITION TRANSACTIONAL_ID TIMEOUT_MS COUNT
        begins a transaction, sends COUNT records to TOPIC-PARTITION, waits until they are acknowledged, prints
        `READY <producer id>` and sleeps until killed: a producer that dies mid-transaction.

    python -m tests.txn_apps eos BOOTSTRAP INPUT OUTPUT GROUP TRANSACTIONAL_ID
        an exactly-once consume-transform-produce loop with confluent-kafka (KIP-447: one transactional producer,
        the consumer group's metadata sent with the offsets): each input record `<i>` becomes the output record
        `out-<i>`, keyed like the input, committed together with the input offsets. It runs until killed. Prints
        `COMMITTED <records>` after each commit and `ABORTED <reason>` after each abort; a fatal error exits 3
        (the test starts a new instance, which fences the old transactional id).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

BATCH = 500


def _say(line: str) -> None:
    print(line, flush=True)


def hang(bootstrap: str, topic: str, partition: int, transactional_id: str, timeout_ms: int, count: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                  "transaction.timeout.ms": timeout_ms, "socket.timeout.ms": min(timeout_ms, 10000),
                  "linger.ms": 0})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(count):
        p.produce(topic, value=f"{transactional_id}-{i}".encode(), partition=partition)
    assert p.flush(30) == 0
    _say("READY")
    while True:
        time.sleep(1)


def _rewind(consumer: Consumer) -> None:
    """After an abort: back to the group's committed offsets (the aborted output is gone, so is its progress)."""
    parts = consumer.assignment()
    if not parts:
        return
    for tp in consumer.committed(parts, timeout=30):
        consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING))


def eos(bootstrap: str, input_topic: str, output_topic: str, group: str, transactional_id: str) -> None:
    # metadata.recovery.strategy=none: with librdkafka 2.16's default (rebootstrap) the producer starts a
    # re-bootstrap the moment its only broker disconnects (the kill -9), decommissions the learned broker 0 and sets
    # the transaction coordinator to none; that broker handle then never finishes terminating ("Handle is
    # terminating in state TRY_CONNECT: 3 refcnts" thousands of times a second in its debug log) and
    # send_offsets_to_transaction(..., 30) neither proceeds nor times out: 3 runs of 6 hung on 2026-11-26
    # (TXN_APP_DEBUG=eos,broker,protocol). The broker it reconnects to answers every request it sends; the client
    # stops sending. Any single-broker cluster restarted under the producer triggers it, so it is the client's.
    common: dict[str, Any] = {"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000,
                              "reconnect.backoff.max.ms": 500, "metadata.recovery.strategy": "none"}
    consumer = Consumer({**common, "group.id": group, "isolation.level": "read_committed",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "session.timeout.ms": 6000, "heartbeat.interval.ms": 500, "max.poll.interval.ms": 20000,
                         "fetch.wait.max.ms": 100})
    # TXN_APP_DEBUG=eos,protocol turns on librdkafka's debug log (on stdout with the rest)
    debug = {"debug": os.environ["TXN_APP_DEBUG"]} if os.environ.get("TXN_APP_DEBUG") else {}
    producer = Producer({**common, "transactional.id": transactional_id, "transaction.timeout.ms": 20000,
                         "linger.ms": 5, **debug})
    producer.init_transactions(60)
    consumer.subscribe([input_topic])
    while True:
        msgs = consumer.consume(BATCH, 0.5)
        msgs = [m for m in msgs if m.error() is None]
        if not msgs:
            continue
        try:
            producer.begin_transaction()
            for m in msgs:
                while True:
                    try:
                        producer.produce(output_topic, key=m.key(), value=b"out-" + m.value())
                        break
                    except BufferError:
                        producer.poll(0.05)
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(60)
            _say(f"COMMITTED {len(msgs)}")
        except KafkaException as e:
            err: KafkaError = e.args[0]
            if err.fatal():
                _say(f"FATAL {err}")
                sys.exit(3)
            if err.txn_requires_abort():
                producer.abort_transaction(60)
                _rewind(consumer)
                _say(f"ABORTED {err}")
            elif err.retriable():
                # commit_transaction may be retried as it is (librdkafka's documented contract); to keep this loop
                # simple the transaction is aborted instead, which is always allowed after a retriable error.
                producer.abort_transaction(60)
                _rewind(consumer)
                _say(f"ABORTED retriable {err}")
            else:
                _say(f"FATAL {err}")
                sys.exit(3)


def main(argv: list[str]) -> None:
    # kill -USR1 prints every thread's Python stack: what a stuck application waits for
    faulthandler.register(signal.SIGUSR1, file=sys.stdout, all_threads=True)
    mode, args = argv[0], argv[1:]
    if mode == "hang":
        hang(args[0], args[1], int(args[2]), args[3], int(args[4]), int(args[5]))
    elif mode == "eos":
        eos(*args[:5])
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])

"""Transactions back to back, as a streaming producer runs them: EndTxn is answered once Prepare* is written and
the markers follow (Kafka's order), so the producer's next AddPartitionsToTxn and first Produce requests arrive
while the previous transaction's markers may still be on their way. With real clients (confluent-kafka, which
sends the next transaction's records without a flush between, and kafka-python), on a broker with the compiled
accelerators and on one with KBROKER_PURE_PYTHON=1:

- every commit and abort returns without an error (no CONCURRENT_TRANSACTIONS surfacing, no fencing);
- read_committed consumers of both libraries see exactly the committed records at the offsets Kafka gives them
  (each transaction's records, then its marker), read_uncommitted ones every record;
- once the last markers are written, every partition's last stable offset is its high watermark.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kbroker.protocol.accelerators import PURE_PYTHON_ENV

from tests.broker.test_produce_consume import create_topic
from tests.broker_process import BrokerProcess
from tests.txn_support import (
    TXN_BROKER_OVERRIDES,
    Planned,
    ck_txn_producer,
    end_offsets,
    expected_reads,
    high_watermark_and_lso,
    plan_transactions,
    read_ck,
    read_kp,
    run_kp,
)

READERS = {"confluent": read_ck, "kafka-python": read_kp}
LAYOUT_PARTITIONS = 4


@pytest.fixture(scope="module", params=["compiled", "pure-python"])
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    env = {PURE_PYTHON_ENV: "1"} if request.param == "pure-python" else None
    b = BrokerProcess(tmp_path_factory.mktemp(request.param), TXN_BROKER_OVERRIDES, env=env)
    b.start()
    yield b
    b.stop()


def _run_ck_streaming(
    bootstrap: str, transactional_id: str, txns: list[list[Planned]], outcomes: list[bool]
) -> None:
    """The bench's loop: begin, produce, commit (which flushes), at once again; an abort flushes first so that
    it has records to abort."""
    p = ck_txn_producer(bootstrap, transactional_id)
    for recs, commit in zip(txns, outcomes, strict=True):
        p.begin_transaction()
        for r in recs:
            p.produce(r.topic, value=r.value, partition=r.partition)
        if commit:
            p.commit_transaction(30)
        else:
            assert p.flush(30) == 0
            p.abort_transaction(30)


def _check(
    broker: BrokerProcess, layout: dict[str, int], txns: list[list[Planned]], outcomes: list[bool]
) -> None:
    tps = [(t, part) for t, parts in layout.items() for part in range(parts)]
    for committed in (True, False):
        expected = expected_reads(txns, outcomes, committed)
        for name, read in READERS.items():
            assert read(broker.bootstrap, tps, len(expected), committed, timeout=30) == expected, (
                name,
                committed,
            )
    ends = end_offsets(txns)
    want = {t: {p: (ends[(t, p)], ends[(t, p)]) for p in range(parts)} for t, parts in layout.items()}
    deadline = time.monotonic() + 10
    while True:  # the last transaction's markers follow its EndTxn answer
        got = {t: high_watermark_and_lso(broker.bootstrap, t, range(parts)) for t, parts in layout.items()}
        if got == want or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert got == want


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_back_to_back_transactions(broker: BrokerProcess, topic_name: str, client: str) -> None:
    """40 transactions (confluent-kafka; 15 with kafka-python) of 3 records per partition over 2 topics x 4
    partitions, every fifth one aborted."""
    layout = {f"{topic_name}-a": LAYOUT_PARTITIONS, f"{topic_name}-b": LAYOUT_PARTITIONS}
    for t, n in layout.items():
        create_topic(broker.bootstrap, t, partitions=n)
    count = 40 if client == "confluent" else 15
    outcomes = [n % 5 != 4 for n in range(count)]
    txns = plan_transactions(topic_name, layout, 3, outcomes)
    run = _run_ck_streaming if client == "confluent" else run_kp
    run(broker.bootstrap, f"{topic_name}-txn", txns, outcomes)
    _check(broker, layout, txns, outcomes)

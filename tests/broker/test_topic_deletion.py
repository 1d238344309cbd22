"""Topic deletion finishes whatever is left (issue 39 item 17): with few descriptors for segment files, a deleted
log's index files were reopened under the directory's old name when the delayed delete closed them
(FileNotFoundError), and `<topic>-<p>.<id>-delete` directories stayed behind. A few seconds."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kbroker.protocol import records as R
from kbroker.protocol.messages import ProduceRequest

from tests.broker_process import BrokerProcess
from tests.clients import RawClient, wait_until

T = 15
PARTITIONS = 30


@pytest.fixture
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    # 128 descriptors: 64 for segment files (the least), fewer than the partitions' files written here.
    b = BrokerProcess(
        tmp_path_factory.mktemp("broker"),
        {
            "log.index.interval.bytes": "1",  # an index entry per batch, written to the .index lazily
            "log.segment.delete.delay.ms": "300",
        },
        open_files_limit=128,
    ).start()
    yield b
    b.stop()


def _produce_everywhere(bootstrap: str, topic: str, rounds: int) -> None:
    P = ProduceRequest
    with RawClient(bootstrap) as raw:
        for r in range(rounds):
            req = P(
                acks=1,
                timeout_ms=5000,
                topic_data=[
                    P.TopicProduceData(
                        name=topic,
                        partition_data=[
                            P.PartitionProduceData(
                                index=p,
                                records=R.build_batch([(b"k", b"v%d" % r, (), int(time.time() * 1000))]),
                            )
                            for p in range(PARTITIONS)
                        ],
                    )
                ],
            )
            resp = raw.request(0, 9, req)
            assert {p.error_code for p in resp.responses[0].partition_responses} == {0}


def _leftovers(broker: BrokerProcess) -> list[str]:
    return sorted(p.name for p in (broker.data_dir / "logs").iterdir() if p.name.endswith("-delete"))


def test_deleted_topics_leave_no_directories(broker: BrokerProcess, topic_name: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    doomed, busy = f"{topic_name}-doomed", f"{topic_name}-busy"
    for f in admin.create_topics([NewTopic(doomed, PARTITIONS, 1), NewTopic(busy, PARTITIONS, 1)]).values():
        f.result(T)
    _produce_everywhere(broker.bootstrap, doomed, 3)
    # Another topic's files take the descriptors: the doomed logs' files are closed, their index entries pending.
    _produce_everywhere(broker.bootstrap, busy, 3)
    admin.delete_topics([doomed], operation_timeout=10)[doomed].result(T)
    _produce_everywhere(broker.bootstrap, busy, 1)
    wait_until(
        lambda: (
            not _leftovers(broker)
            and f"{doomed}-" not in " ".join(p.name for p in (broker.data_dir / "logs").iterdir())
        ),
        timeout=T,
        what="the deleted topic's directories gone",
    )
    assert "Traceback" not in broker.read_log()
    _produce_everywhere(broker.bootstrap, busy, 1)
    assert _leftovers(broker) == []

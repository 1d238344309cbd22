"""The direct Produce path (broker/produce_codec.py, protocol/_produce.c) answers byte for byte as the general one:
the same Produce frames, sent in the same order to a broker that has it and to one on the Python references
(KBROKER_PURE_PYTHON=1: handle_produce and the generated codec for every request), get identical response frames,
for the common requests the direct path takes and for the ones it hands back (~5 s: two brokers)."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest
from kbroker.broker import produce_codec
from kbroker.protocol import codec
from kbroker.protocol import records as R
from kbroker.protocol.accelerators import PURE_PYTHON_ENV
from kbroker.protocol.messages import CreateTopicsRequest, ProduceRequest, RequestHeader

from tests.broker_process import BrokerProcess
from tests.clients import RawClient

P = ProduceRequest
C = CreateTopicsRequest
NOW = 1_700_000_000_000


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    if not produce_codec.COMPILED:
        pytest.skip(
            f"protocol/_produce.c not built (python setup.py build_ext --inplace), or {PURE_PYTHON_ENV} is set"
        )
    direct = BrokerProcess(tmp_path_factory.mktemp("direct")).start()
    general = BrokerProcess(tmp_path_factory.mktemp("general"), env={PURE_PYTHON_ENV: "1"}).start()
    try:
        yield direct, general
    finally:
        direct.stop()
        general.stop()


def _frame(api_key: int, version: int, correlation_id: int, body: object) -> bytes:
    header = RequestHeader(
        request_api_key=api_key, request_api_version=version, correlation_id=correlation_id, client_id="t"
    )
    return bytes(codec.encode_request(header, body))


def _produce(version: int, acks: int, *topics: tuple[str, list[tuple[int, bytes | None]]]) -> P:
    return P(
        transactional_id=None,
        acks=acks,
        timeout_ms=5000,
        topic_data=[
            P.TopicProduceData(
                name=n, partition_data=[P.PartitionProduceData(index=i, records=r) for i, r in parts]
            )
            for n, parts in topics
        ],
    )


def _batch(n: int = 3, key: bytes | None = b"k", **producer: int) -> bytes:
    return R.build_batch([(key, b"v%d" % i, (), NOW + i) for i in range(n)], **producer)


def _idempotent(seq: int, n: int = 2) -> bytes:
    return _batch(n, producer_id=4242, producer_epoch=0, base_sequence=seq)


def _requests() -> list[tuple[int, P]]:
    """(version, request): the common case at every version, then what the direct path answers with errors, then
    what it hands to handle_produce."""
    plain = [(v, _produce(v, 1, ("t", [(0, _batch())]))) for v in range(3, 12)]
    return plain + [
        (9, _produce(9, -1, ("t", [(1, _batch()), (0, _batch(1))]), ("t", [(2, _batch())]))),
        (9, _produce(9, 0, ("t", [(0, _batch())]))),  # acks=0: no answer; the next one shows it was appended
        (7, _produce(7, 1, ("t", [(0, _batch())]), ("empty", []))),
        (9, _produce(9, 2, ("t", [(0, _batch())]))),  # INVALID_REQUIRED_ACKS
        (9, _produce(9, 1, ("nope", [(0, _batch())]), ("t", [(99, _batch())]))),  # unknown topic, partition
        (9, _produce(9, 1, ("__consumer_offsets", [(0, _batch())]))),  # an internal topic
        (
            11,
            _produce(11, 1, ("c", [(0, _batch(3, None))])),
        ),  # keyless records in a compacted topic: record errors
        (5, _produce(5, 1, ("c", [(0, _batch(2, None))]))),
        (9, _produce(9, 1, ("t", [(0, _idempotent(0))]))),
        (9, _produce(9, 1, ("t", [(0, _idempotent(2))]))),
        (9, _produce(9, 1, ("t", [(0, _idempotent(0))]))),  # a retry: the first offsets again
        (9, _produce(9, 1, ("t", [(0, _idempotent(9))]))),  # OUT_OF_ORDER_SEQUENCE_NUMBER
        # The general path's cases: two batches, a transactional batch without a transactional id, null and
        # empty records, zstd before v7.
        (9, _produce(9, 1, ("t", [(0, _batch() + _batch())]))),
        (
            9,
            _produce(
                9,
                1,
                (
                    "t",
                    [(0, _batch(producer_id=77, producer_epoch=0, base_sequence=0, is_transactional=True))],
                ),
            ),
        ),
        (9, _produce(9, 1, ("t", [(0, None), (1, b"")]))),
        (3, _produce(3, 1, ("t", [(0, _batch(compression=R.COMPRESSION_ZSTD))]))),
        (11, _produce(11, 1, ("t", [(0, _batch())]))),
    ]


def test_direct_and_general_paths_answer_the_same_bytes(brokers: tuple[BrokerProcess, BrokerProcess]) -> None:
    conns = [RawClient(b.bootstrap, timeout=15) for b in brokers]
    create = C(
        topics=[
            C.CreatableTopic(name="t", num_partitions=3, replication_factor=1),
            C.CreatableTopic(
                name="c",
                num_partitions=1,
                replication_factor=1,
                configs=[C.CreatableTopicConfig(name="cleanup.policy", value="compact")],
            ),
        ],
        timeout_ms=15000,
    )
    for conn in conns:
        conn.send_bytes(_frame(19, 7, 1, create))
        assert codec.decode_response(19, 7, conn.recv_frame())[1].topics[0].error_code == 0
    answered = 0
    for correlation_id, (version, req) in enumerate(_requests(), start=2):
        frame = _frame(0, version, correlation_id, req)
        for conn in conns:
            conn.send_bytes(frame)
        if req.acks == 0:
            continue
        direct, general = (conn.recv_frame() for conn in conns)
        assert direct == general, (version, req.acks, codec.decode_response(0, version, general)[1])
        assert struct.unpack_from(">i", direct)[0] == correlation_id
        answered += 1
    assert answered == len(_requests()) - 1
    assert "produce path compiled" in brokers[0].read_log()
    assert "produce path pure Python" in brokers[1].read_log()

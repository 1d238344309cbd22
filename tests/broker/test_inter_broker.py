"""The inter-broker channel against a real broker: requests of different purposes travel on connections of their
own, so one that the other broker holds (a long-polling fetch, a marker write waiting for its replicas) never
delays a controller request behind it. A broker answers the requests of one connection in order, as Kafka does;
with one shared connection a LeaderAndIsr waited for whatever was ahead of it (16 s seen after a leader died)."""

from __future__ import annotations

import asyncio
import time

from kbroker.broker.inter_broker import CONTROLLER, InterBrokerChannel
from kbroker.protocol.messages import FetchRequest, MetadataRequest

from tests.broker.test_produce_consume import create_topic
from tests.broker_process import BrokerProcess

LONG_POLL_MS = 4000


def test_a_held_request_does_not_delay_other_purposes(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, partitions=1)
    channel = InterBrokerChannel(1000, lambda _b: ("127.0.0.1", broker.port), request_timeout_ms=10000)
    channel.start()
    try:
        async def scenario() -> tuple[float, float, int]:
            # A consumer-style fetch at the log end: the broker holds it for max_wait_ms.
            fetch = FetchRequest(replica_id=-1, max_wait_ms=LONG_POLL_MS, min_bytes=1, max_bytes=1 << 20,
                                 isolation_level=0, session_id=0, session_epoch=-1, topics=[
                                     FetchRequest.FetchTopic(topic=topic_name, partitions=[
                                         FetchRequest.FetchPartition(partition=0, fetch_offset=0,
                                                                     partition_max_bytes=1 << 20)])])
            t0 = time.monotonic()
            held = asyncio.ensure_future(channel.send(0, 1, 12, fetch, "ReplicaFetcherThread-0-0"))
            await asyncio.sleep(0.3)
            # The same connection would answer this only after the fetch; the controller's own answers at once.
            md = await channel.send(0, 3, 12, MetadataRequest(topics=None), CONTROLLER)
            metadata_s = time.monotonic() - t0
            resp = await held
            assert any(t.name == topic_name for t in md.topics)
            return metadata_s, time.monotonic() - t0, resp.responses[0].partitions[0].error_code

        metadata_s, fetch_s, fetch_error = asyncio.run(scenario())
    finally:
        channel.stop()
    assert fetch_error == 0
    assert fetch_s >= LONG_POLL_MS / 1000 * 0.9, "the fetch was not held: the test proves nothing"
    assert metadata_s < 2.0, f"metadata waited {metadata_s:.1f} s behind the held fetch"


def _frames_read(chunks: list[bytes], ids: list[int]) -> tuple[list[object], bool]:
    """Feed `chunks` to a _Connection awaiting raw answers for `ids`: each answer (its frame, or its exception's
    type name) and whether the connection failed."""
    from kbroker.broker.inter_broker import _Connection

    async def run() -> tuple[list[object], bool]:
        loop = asyncio.get_running_loop()
        conn = _Connection(7)
        futures = {cid: loop.create_future() for cid in ids}
        for cid, fut in futures.items():
            conn.pending[cid] = (1, None, fut)
        for chunk in chunks:
            conn.data_received(chunk)
        out: list[object] = []
        for fut in futures.values():
            if not fut.done():
                out.append(None)
            elif fut.exception() is not None:
                out.append(type(fut.exception()).__name__)
            else:
                out.append(bytes(fut.result()))
        return out, conn.closed

    return asyncio.run(run())


def test_answers_are_framed_alike_however_the_reads_cut_them() -> None:
    """An answer whole in one read (taken without the buffer), several in one read, and answers cut anywhere give
    the same frames in order; a part of one stays buffered; an unknown correlation id fails the connection."""
    bodies = [
        (1).to_bytes(4, "big") + b"first answer",
        (2).to_bytes(4, "big") + b"",
        (3).to_bytes(4, "big") + b"x" * 300,
    ]
    stream = b"".join(len(b).to_bytes(4, "big") + b for b in bodies)
    ids = [1, 2, 3]
    assert _frames_read([stream], ids) == (bodies, False)
    assert _frames_read([len(b).to_bytes(4, "big") + b for b in bodies], ids) == (bodies, False)
    for cut in range(1, len(stream)):
        for second in (cut, min(len(stream), cut + 17)):
            chunks = [stream[:cut], stream[cut:second], stream[second:]]
            assert _frames_read([c for c in chunks if c], ids) == (bodies, False), (cut, second)
    assert _frames_read([stream[:10]], ids) == ([None, None, None], False)
    unknown = (99).to_bytes(4, "big") + b"?"
    assert _frames_read([len(unknown).to_bytes(4, "big") + unknown], ids) == (["ConnectionError"] * 3, True)

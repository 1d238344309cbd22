"""Producer id blocks across two kbroker processes sharing one real ZooKeeper.

Concurrent InitProducerId load (raw requests through protocol.codec) against broker 1 and broker 2: every id
is distinct, each broker hands out ids from whole blocks of 1000 that the other broker never touches, and
/latest_producer_id_block tells the same story (one conditional write per block claimed). Then ZooKeeper
goes away: idempotent producers keep starting on both brokers (each claimed its next block before the current
one ran out); only a broker that used up both answers InitProducerId with a retriable error, while produce and
fetch of existing topics keep working, and it claims the next block once ZooKeeper is back.

The tests share one ZooKeeper and one two-broker cluster and run in file order.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient
from kazoo.client import KazooClient
from kbroker.coordinator import zk_paths as zp
from kbroker.coordinator.producer_ids import BLOCK_SIZE
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import InitProducerIdRequest, InitProducerIdResponse

from tests.broker_process import BrokerProcess
from tests.clients import RawClient, ck_consume, wait_until
from tests.zookeeper import ZooKeeperServer, zookeeper_missing

pytestmark = pytest.mark.skipif(zookeeper_missing() is not None, reason=zookeeper_missing() or "")

THREADS = 8
REQUESTS_PER_THREAD = 1000  # 8,000 ids: several blocks per broker
SHARE_OF_BROKER_1 = 0.6  # uneven, so the brokers run through their blocks at different speeds
TOPIC = "pid-ranges-data"
RETRIABLE = {ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_CONTROLLER}
CLAIMED = re.compile(r"Claimed producer id block \[(\d+), (\d+)\]")


class Pair:
    def __init__(self, zk: ZooKeeperServer, base: Path) -> None:
        self.zk = zk
        self.brokers = {
            i: BrokerProcess(base / f"b{i}", {
                "zookeeper.connect": zk.connect,
                "broker.id": str(i),
                "zookeeper.session.timeout.ms": "6000",
                "zookeeper.connection.timeout.ms": "5000",
            })
            for i in (1, 2)
        }
        # broker id -> every id it handed out during the load test, in order per connection
        self.handed_out: dict[int, list[int]] = {1: [], 2: []}


@pytest.fixture(scope="module")
def pair(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    p = Pair(zookeeper, tmp_path_factory.mktemp("pid-ranges"))
    for b in p.brokers.values():
        b.start()
    yield p
    for b in p.brokers.values():
        try:
            b.stop()
        except RuntimeError:
            b.kill()


def init_producer_id(c: RawClient, version: int = 4) -> InitProducerIdResponse:
    return c.request(22, version, InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000,
                                                        producer_id=-1, producer_epoch=-1))


def claimed_blocks(b: BrokerProcess) -> list[tuple[int, int]]:
    return [(int(s), int(e)) for s, e in CLAIMED.findall(b.read_log())]


def metadata_brokers(b: BrokerProcess) -> dict[int, int]:
    md = AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(topic="__probe_absent", timeout=10)
    return {i: m.port for i, m in md.brokers.items()}


# ---------------------------------------------------------------- cluster


def test_both_brokers_in_each_others_metadata(pair: Pair) -> None:
    ports = {i: b.port for i, b in pair.brokers.items()}
    for b in pair.brokers.values():
        wait_until(lambda b=b: metadata_brokers(b) == ports, timeout=15, what=f"both brokers seen by {b.bootstrap}")
        admin = KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=5000)
        try:
            assert {x["broker_id"]: x["port"] for x in admin.describe_cluster()["brokers"]} == ports
        finally:
            admin.close()


# ---------------------------------------------------------------- concurrent InitProducerId load


def test_concurrent_init_producer_id_blocks_are_disjoint(pair: Pair, zk_client: KazooClient) -> None:
    data, stat = zk_client.get(zp.LATEST_PRODUCER_ID_BLOCK)
    # The znode is created empty (version 0) and each broker claims its first block at startup.
    assert stat.version == 2, "each broker claims one block when it starts"
    assert sorted(claimed_blocks(pair.brokers[1]) + claimed_blocks(pair.brokers[2])) == [(0, 999), (1000, 1999)]

    results: list[tuple[int, int]] = []  # (broker id, producer id)
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(THREADS)

    def load(t: int) -> None:
        rng = random.Random(t)
        try:
            clients = {i: RawClient(b.bootstrap) for i, b in pair.brokers.items()}
            try:
                start.wait(10)
                got = []
                for _ in range(REQUESTS_PER_THREAD):
                    bid = 1 if rng.random() < SHARE_OF_BROKER_1 else 2
                    resp = init_producer_id(clients[bid], version=rng.choice((0, 2, 4, 5)))
                    assert resp.error_code == 0 and resp.producer_epoch == 0, resp
                    got.append((bid, resp.producer_id))
                with lock:
                    results.extend(got)
            finally:
                for c in clients.values():
                    c.close()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t0 = time.monotonic()
    threads = [threading.Thread(target=load, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    elapsed = time.monotonic() - t0
    assert not errors, errors[0]
    assert len(results) == THREADS * REQUESTS_PER_THREAD

    ids = [pid for _, pid in results]
    assert len(set(ids)) == len(ids), f"{len(ids) - len(set(ids))} producer ids handed out twice"

    blocks_of: dict[int, set[int]] = {}
    claimed_of: dict[int, list[int]] = {}
    for bid in (1, 2):
        mine = sorted(pid for b, pid in results if b == bid)
        pair.handed_out[bid] = mine
        blocks_of[bid] = {pid // BLOCK_SIZE for pid in mine}
        # Whole blocks: every block the broker used is used from its start without gaps, and only its
        # newest block may still have ids left.
        per_block = Counter(pid // BLOCK_SIZE for pid in mine)
        newest = max(per_block)
        for blk, n in per_block.items():
            assert set(range(blk * BLOCK_SIZE, blk * BLOCK_SIZE + n)) <= set(mine)
            assert n == BLOCK_SIZE or blk == newest, f"broker {bid}: block {blk} only {n} ids used"
        # and the broker's own log names these blocks in claim order, plus at most one claimed in advance
        claimed = claimed_blocks(pair.brokers[bid])
        assert all(end == start + BLOCK_SIZE - 1 for start, end in claimed)
        claimed_of[bid] = [start // BLOCK_SIZE for start, _ in claimed]
        assert claimed_of[bid][: len(per_block)] == sorted(per_block), (claimed_of[bid], sorted(per_block))
        assert len(claimed_of[bid]) - len(per_block) <= 1
    assert not blocks_of[1] & blocks_of[2], "a block served by both brokers"
    assert not set(claimed_of[1]) & set(claimed_of[2]), "a block claimed by both brokers"
    all_blocks = set(claimed_of[1]) | set(claimed_of[2])
    assert all_blocks == set(range(len(all_blocks))), "blocks are claimed one after another from 0"
    assert len(blocks_of[1]) >= 4 and len(blocks_of[2]) >= 3

    # ZooKeeper: the znode was created empty (version 0) by the brokers' path setup, and each claim is one
    # set(version=...), so its version counts the blocks claimed; its content is the newest block.
    data, stat = zk_client.get(zp.LATEST_PRODUCER_ID_BLOCK)
    doc = zp.loads(data)
    top = max(ids)
    assert stat.version == len(all_blocks)
    assert top <= int(doc["block_end"])
    assert int(doc["block_end"]) == len(all_blocks) * BLOCK_SIZE - 1
    assert doc["broker"] == (1 if int(doc["block_start"]) // BLOCK_SIZE in claimed_of[1] else 2)
    assert doc["version"] == 1
    print(f"\n{len(ids)} InitProducerId in {elapsed:.1f} s over {THREADS} threads: broker 1 {len(pair.handed_out[1])} "
          f"ids in blocks {sorted(blocks_of[1])}, broker 2 {len(pair.handed_out[2])} ids in blocks "
          f"{sorted(blocks_of[2])}; znode version {stat.version}, block_end {doc['block_end']}")


# ---------------------------------------------------------------- ZooKeeper outage


def test_zookeeper_down_producers_keep_starting_until_both_blocks_are_used_up(pair: Pair,
                                                                              zk_client: KazooClient) -> None:
    b1, b2 = pair.brokers[1], pair.brokers[2]
    admin = AdminClient({"bootstrap.servers": b1.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 4, 1)], operation_timeout=10)[TOPIC].result(15)
    wait_until(lambda: all(len(AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(TOPIC, timeout=5)
                               .topics[TOPIC].partitions) == 4 for b in (b1, b2)), timeout=15, what="topic on both")

    # Broker 1 runs into the last tenth of its block, so it claims the next block in advance.
    claimed_before = len(claimed_blocks(b1))
    with RawClient(b1.bootstrap) as c:
        last = init_producer_id(c).producer_id
        while last % BLOCK_SIZE < BLOCK_SIZE * 9 // 10:
            last = init_producer_id(c).producer_id
    wait_until(lambda: len(claimed_blocks(b1)) >= claimed_before + 1, timeout=15,
               what="broker 1 claimed its next block in advance")
    assert len(claimed_blocks(b1)) == claimed_before + 1
    version_before = zk_client.get(zp.LATEST_PRODUCER_ID_BLOCK)[1].version

    pair.zk.stop()
    try:
        time.sleep(1.0)  # the brokers notice the lost connection
        # Idempotent producers keep starting on both brokers and their data flows.
        for i, b in enumerate((b1, b2)):
            p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "acks": "all",
                          "linger.ms": 5})
            failed: list[object] = []
            for n in range(200):
                p.produce(TOPIC, f"idempotent-{i}-{n}".encode(), partition=n % 4,
                          on_delivery=lambda err, _m, failed=failed: failed.append(err) if err else None)
            assert p.flush(30) == 0 and not failed, failed[:3]
            del p
        with RawClient(b2.bootstrap) as c:
            assert init_producer_id(c).error_code == 0, "broker 2 still has ids in its block"

        # Broker 1 hands out the rest of its current block and the whole next one, then answers retriably.
        handed = 0
        errors = []
        with RawClient(b1.bootstrap, timeout=20) as c:
            while True:
                resp = init_producer_id(c)
                if resp.error_code != 0:
                    break
                last = resp.producer_id
                handed += 1
                assert handed <= 2 * BLOCK_SIZE
            assert last % BLOCK_SIZE == BLOCK_SIZE - 1, "the block in hand was not used up"
            for _ in range(3):
                t0 = time.monotonic()
                assert resp.error_code in RETRIABLE, f"InitProducerId without ZooKeeper answered {resp}"
                assert resp.producer_id == -1
                errors.append((resp.error_code, round(time.monotonic() - t0, 2)))
                resp = init_producer_id(c)
        assert handed > BLOCK_SIZE, "the block claimed in advance was not used"

        # produce (no idempotence: InitProducerId may be routed to broker 1) and fetch through both brokers
        p = Producer({"bootstrap.servers": f"{b1.bootstrap},{b2.bootstrap}", "acks": "all",
                      "enable.idempotence": False, "linger.ms": 5})
        failed = []
        for i in range(400):
            p.produce(TOPIC, f"during-outage-{i}".encode(), partition=i % 4,
                      on_delivery=lambda err, _m: failed.append(err) if err else None)
        assert p.flush(30) == 0 and not failed, failed[:3]
        recs = ck_consume(b2.bootstrap, TOPIC, range(4), 800, timeout=20)
        assert sorted(r.value for r in recs if r.value.startswith(b"during")) == sorted(
            f"during-outage-{i}".encode() for i in range(400))
        print(f"\nwithout ZooKeeper: idempotent producers started on both brokers; broker 1 handed out {handed} "
              f"more ids, then answered (error, seconds) {errors}; 400 records produced and fetched")
    finally:
        pair.zk.start()

    # ZooKeeper back: a retry succeeds with a fresh block right after the newest one
    def retry() -> int | None:
        with RawClient(b1.bootstrap, timeout=20) as c:
            resp = init_producer_id(c)
        assert resp.error_code in RETRIABLE | {0}, resp
        return resp.producer_id if resp.error_code == 0 else None

    pid = wait_until(retry, timeout=30, interval=0.5, what="InitProducerId on broker 1 after ZooKeeper is back")
    data, stat = zk_client.get(zp.LATEST_PRODUCER_ID_BLOCK)
    assert stat.version == version_before + 1
    assert pid == int(zp.loads(data)["block_start"]) and pid % BLOCK_SIZE == 0 and pid > last

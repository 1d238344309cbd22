"""One registry served by two brokers on ZooKeeper: one elected writer, the other forwards writes to it, both
answer reads from the same `_schemas`; concurrent registrations on both get distinct ids; the writer's broker
stops and the other takes over."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker_process import BrokerProcess, free_port, wait_all_registered
from tests.schema_registry.registry_http import Http, wait_for_port
from tests.zookeeper import ZooKeeperServer, zookeeper_missing

pytestmark = pytest.mark.skipif(zookeeper_missing() is not None, reason=zookeeper_missing() or "")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[tuple[BrokerProcess, Http]]]:
    base: Path = tmp_path_factory.mktemp("two")
    zk = ZooKeeperServer(base / "zk").start()
    out: list[tuple[BrokerProcess, Http]] = []
    try:
        for broker_id in (1, 2):
            port = free_port()
            b = BrokerProcess(
                base / f"b{broker_id}",
                {
                    "zookeeper.connect": zk.connect,
                    "broker.id": str(broker_id),
                    "schema.registry.listeners": f"http://127.0.0.1:{port}",
                    "offsets.topic.num.partitions": "2",
                    "offsets.topic.replication.factor": "2",
                    "controlled.shutdown.retry.backoff.ms": "200",
                },
            ).start()
            out.append((b, Http(f"http://127.0.0.1:{port}")))
        wait_all_registered([b for b, _ in out], timeout=20)
        for _, http in out:
            wait_for_port(int(http.base.rsplit(":", 1)[1]))
        yield out
    finally:
        for b, _ in out:
            b.stop()
        zk.stop()


def schema(i: int) -> dict[str, str]:
    return {
        "schema": json.dumps({"type": "record", "name": f"R{i}", "fields": [{"name": "f", "type": "int"}]})
    }


def test_both_brokers_serve_one_registry(cluster: list[tuple[BrokerProcess, Http]]) -> None:
    (_, a), (_, b) = cluster
    first = a.ok("POST", "/subjects/shared/versions", schema(0))["id"]
    assert b.ok("POST", "/subjects/shared/versions", schema(0)) == {"id": first}
    assert b.ok("GET", "/subjects/shared/versions") == [1]
    # Concurrent registrations through both brokers: one writer assigns every id, none twice.
    ids: dict[str, int] = {}
    lock = threading.Lock()

    def register(http: Http, i: int) -> None:
        got = http.ok("POST", f"/subjects/s{i}/versions", schema(i))["id"]
        with lock:
            ids[f"s{i}"] = got

    threads = [threading.Thread(target=register, args=(a if i % 2 else b, i)) for i in range(1, 13)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(set(ids.values())) == 12 and first not in ids.values()
    # Each broker answers with what the other wrote (a forwarded write waits until its broker has read it back).
    for subject, schema_id in ids.items():
        assert a.ok("GET", f"/subjects/{subject}/versions/latest")["id"] == schema_id
        assert b.ok("GET", f"/subjects/{subject}/versions/latest")["id"] == schema_id
    a.ok("PUT", "/config/shared", {"compatibility": "FULL"})
    assert b.ok("GET", "/config/shared") == {"compatibilityLevel": "FULL"}


def test_the_other_broker_takes_over_writes(cluster: list[tuple[BrokerProcess, Http]]) -> None:
    (b1, a), (b2, b) = cluster
    writer_log = "this broker)"
    writer, survivor = (b1, b) if writer_log in b1.read_log() else (b2, a)
    assert writer.stop() == 0
    got = survivor.ok("POST", "/subjects/after-failover/versions", schema(99))["id"]
    assert survivor.ok("GET", f"/schemas/ids/{got}")["schema"]
    assert len(survivor.ok("GET", "/subjects")) == 14

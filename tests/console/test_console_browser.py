"""The web console in a real headless browser (Debian's Chromium driven by Playwright): every page loads, shows what
the clients did, and is kept as a screenshot in build/test-artifacts/console/ (or $KBROKER_ARTIFACTS/console/)."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker_process import ROOT, BrokerProcess, free_port, wait_for_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(os.environ.get("KBROKER_ARTIFACTS") or ROOT / "build" / "test-artifacts") / "console"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH (Debian package chromium; .ci/run installs it): browser test not run")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is not installed (pip install playwright): browser test not run")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    port, registry_port = free_port(), free_port()
    b = BrokerProcess(tmp_path_factory.mktemp("console-ui"), {
        "console.listeners": f"http://127.0.0.1:{port}", "offsets.topic.num.partitions": "2",
        "schema.registry.listeners": f"http://127.0.0.1:{registry_port}",
        "transaction.state.log.num.partitions": "2", "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1"}).start()
    wait_for_port(port)
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("pageviews", 2, 1)])["pageviews"].result(30)
        p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True})
        for i in range(40):
            p.produce("pageviews", key=f"user-{i % 4}".encode(), partition=i % 2,
                      value=json.dumps({"page": f"/p/{i}", "ms": 100 + i}).encode(), headers=[("app", b"web")])
        assert p.flush(30) == 0
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "dashboards", "auto.offset.reset": "earliest",
                      "enable.auto.commit": False})
        c.assign([TopicPartition("pageviews", 0, 0)])
        got = 0
        deadline = time.monotonic() + 60
        while got < 15 and time.monotonic() < deadline:
            m = c.poll(1)
            if m is not None and not m.error():
                got += 1
        c.commit(asynchronous=False)  # 15 of partition 0's 20: lag 5
        c.close()
        produce_avro(b.bootstrap, f"http://127.0.0.1:{registry_port}")
        tx = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "ui-tx"})
        tx.init_transactions(30)
        tx.begin_transaction()
        tx.produce("pageviews", b"in a transaction", partition=1)
        tx.flush(30)
        yield b, f"http://127.0.0.1:{port}"
        tx.abort_transaction(30)
    finally:
        assert b.stop() == 0


PROFILE = {"type": "record", "name": "Profile", "fields": [{"name": "name", "type": "string"},
                                                          {"name": "visits", "type": "int"}]}


def produce_avro(bootstrap: str, registry_url: str) -> None:
    """Two records with confluent-kafka's AvroSerializer, the schema registered in the broker's own registry."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serialize = AvroSerializer(SchemaRegistryClient({"url": registry_url}), json.dumps(PROFILE))
    p = Producer({"bootstrap.servers": bootstrap})
    for record in ({"name": "ada", "visits": 3}, {"name": "grace", "visits": 7}):
        p.produce("profiles", partition=0, value=serialize(record, SerializationContext("profiles",
                                                                                         MessageField.VALUE)))
    assert p.flush(30) == 0


def _open(browser: Any, url: str, hash_: str, page_name: str) -> Any:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{url}/{hash_}")
    page.wait_for_selector(f'main[data-loaded="{page_name}"]', timeout=30000)
    return page


def _shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 5000  # a rendered page, not a blank one


def test_every_page_loads_and_shows_what_the_clients_did(browser: Any, cluster: tuple[BrokerProcess, str]) -> None:
    b, url = cluster
    page = _open(browser, url, "#/brokers", "brokers")
    assert page.inner_text("main").count("127.0.0.1") >= 1 and "controller" in page.inner_text("main")
    _shot(page, "brokers")

    page = _open(browser, url, "#/topics", "topics")
    row = page.locator("tr", has_text="pageviews").inner_text()
    assert "\t2\t" in row and "\t41\t" in row  # 2 partitions, 40 records and the open transaction's one
    _shot(page, "topics")

    page = _open(browser, url, "#/topic/pageviews", "topic")
    text = page.inner_text("main")
    assert "Partitions" in text and "cleanup.policy" in text and "Active producers" in text
    _shot(page, "topic")

    page = _open(browser, url, "#/messages/pageviews/0?offset=3&limit=5", "messages")
    text = page.inner_text("main")
    assert '"page": "/p/6"' in text and "user-2" in text and "app:" in text  # partition 0 offset 3 is i = 6
    assert page.locator("tbody tr").count() == 5
    _shot(page, "messages")

    page = _open(browser, url, "#/groups", "groups")
    assert "dashboards" in page.locator("tr", has_text="dashboards").inner_text()
    _shot(page, "groups")

    page = _open(browser, url, "#/group/dashboards", "group")
    assert page.inner_text("#total-lag") == "5"
    _shot(page, "group")

    page = _open(browser, url, "#/transactions", "transactions")
    assert "Ongoing" in page.locator("tr", has_text="ui-tx").inner_text()
    _shot(page, "transactions")

    page = _open(browser, url, "#/throughput", "throughput")
    assert page.locator("svg.chart, p.muted").count() >= 1
    _shot(page, "throughput")


def test_seek_form_and_topic_creation_from_the_page(browser: Any, cluster: tuple[BrokerProcess, str]) -> None:
    b, url = cluster
    page = _open(browser, url, "#/messages/pageviews/1", "messages")
    page.fill('input[name="offset"]', "0")
    page.fill('input[name="limit"]', "2")
    page.click("#seek button")
    page.wait_for_function("location.hash.includes('offset=0')")
    # The page keeps the previous listing (20 rows, data-loaded already "messages") until the seek's answer
    # replaces it: wait for the two rows asked for.
    page.wait_for_function("document.querySelectorAll('main[data-loaded=\"messages\"] tbody tr').length === 2")
    assert '"/p/1"' in page.inner_text("main")

    page = _open(browser, url, "#/topics", "topics")
    page.fill('#create-topic input[name="name"]', "from-the-browser")
    page.fill('#create-topic input[name="partitions"]', "3")
    page.click("#create-topic button")
    page.wait_for_selector("tr:has-text('from-the-browser')", timeout=30000)
    md = AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=30)
    assert len(md.topics["from-the-browser"].partitions) == 3


def test_avro_values_decoded_through_the_schema_registry(browser: Any, cluster: tuple[BrokerProcess, str]) -> None:
    _, url = cluster
    with urllib.request.urlopen(f"{url}/api/topics/profiles/messages?partition=0&offset=0", timeout=30) as resp:
        records = json.load(resp)["records"]
    assert [(r["value"]["schema_type"], r["value"]["schema_id"], json.loads(r["value"]["data"])) for r in records] \
        == [("AVRO", 1, {"name": "ada", "visits": 3}), ("AVRO", 1, {"name": "grace", "visits": 7})]
    page = _open(browser, url, "#/messages/profiles/0?offset=0", "messages")
    text = page.inner_text("main")
    assert "AVRO schema 1" in text and '"name": "grace"' in text and '"visits": 7' in text
    _shot(page, "messages-avro")


def test_a_kip848_group_page_shows_its_member_and_lag(browser: Any, cluster: tuple[BrokerProcess, str]) -> None:
    b, url = cluster
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "kip848-ui", "group.protocol": "consumer",
                  "client.id": "kip848-browser", "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        c.subscribe(["pageviews"])
        seen: set[int] = set()
        deadline = time.monotonic() + 60
        while len(seen) < 2 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                seen.add(m.partition())
        assert seen == {0, 1}
        # pageviews: 20 records in partition 0, 21 in partition 1 (the open transaction's one counts to its end)
        c.commit(offsets=[TopicPartition("pageviews", 0, 12), TopicPartition("pageviews", 1, 20)], asynchronous=False)

        page = _open(browser, url, "#/groups", "groups")
        assert "consumer (KIP-848)" in page.locator("tr", has_text="kip848-ui").inner_text()
        page = _open(browser, url, "#/group/kip848-ui", "group")
        assert page.inner_text("#group-type") == "consumer (KIP-848)"
        members = page.locator("tr", has_text="kip848-browser").inner_text()
        assert "pageviews: 0,1" in members
        offsets = [page.locator("tr", has_text="pageviews").nth(i).inner_text().split("\t") for i in (1, 2)]
        assert [row[1:] for row in offsets] == [["0", "12", "20", "8"], ["1", "20", "21", "1"]], offsets
        assert page.inner_text("#total-lag") == "9"
        _shot(page, "group-kip848")
    finally:
        c.close()

"""kbroker and Apache Kafka 3.9 (ZooKeeper mode) started side by side with equivalent configs, and the runs over them:
ApiVersions, generated requests and stateful scenarios."""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings
from kbroker.protocol import codec
from kbroker.protocol.messages import (
    ApiVersionsRequest,
    CreateTopicsRequest,
    FindCoordinatorRequest,
    InitProducerIdRequest,
)

from tests.broker_process import BrokerProcess
from tests.differential import generate
from tests.differential.harness import Pair, Tally

# Both brokers: node 0, one partition by default, auto-creation on, no initial rebalance delay, 50 offsets
# partitions (Kafka's default), replication factor 1 for the internal topics.
COMMON = {
    "broker.id": "0",
    "num.partitions": "1",
    "auto.create.topics.enable": "true",
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "50",
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "50",
    # kbroker's configs/server.properties sets it (to Kafka's default): set on both, so DescribeConfigs and
    # CreateTopics report segment.bytes as STATIC_BROKER_CONFIG on both sides
    "log.segment.bytes": "1073741824",
}


@contextlib.contextmanager
def brokers(base: Path | None = None) -> Iterator[tuple[str, str]]:
    """(kbroker bootstrap, Kafka bootstrap); raises ArtifactUnavailable when Kafka 3.9 cannot be had."""
    from bench.peers.kafka import KafkaPeer

    with tempfile.TemporaryDirectory(prefix="differential-") as tmp:
        root = Path(base or tmp)
        ours = BrokerProcess(root / "kbroker", overrides=dict(COMMON))
        ours.start()
        try:
            with KafkaPeer("3.9", mode="zk", overrides=dict(COMMON), base=root / "kafka") as kafka:
                yield ours.bootstrap, kafka.bootstrap
        finally:
            ours.stop()


def advertised(pair: Pair) -> tuple[dict[int, tuple[int, int]], dict[int, tuple[int, int]]]:
    """Both ApiVersions v3 answers (compared in the tally) as {api key: (min, max)}."""
    ours, theirs, _ = pair.both(
        18, 3, ApiVersionsRequest(client_software_name="differential", client_software_version="1")
    )
    return (
        {k.api_key: (k.min_version, k.max_version) for k in ours.api_keys},
        {k.api_key: (k.min_version, k.max_version) for k in theirs.api_keys},
    )


def api_version_differences(
    ours: dict[int, tuple[int, int]], theirs: dict[int, tuple[int, int]]
) -> list[str]:
    out = []
    for key in sorted(ours.keys() | theirs.keys()):
        name = codec.REQUESTS[key].__name__.removesuffix("Request") if key in codec.REQUESTS else str(key)
        a, b = ours.get(key), theirs.get(key)
        if a != b:
            out.append(f"{name} ({key}): kbroker {a or 'not advertised'}, Kafka 3.9 {b or 'not advertised'}")
    return out


def create_topics(pair: Pair) -> None:
    Topic = CreateTopicsRequest.CreatableTopic
    req = CreateTopicsRequest(
        topics=[Topic(name=n, num_partitions=p, replication_factor=1) for n, p in generate.TOPICS.items()],
        timeout_ms=10000,
    )
    pair.both(19, 5, req)


def warm_up(pair: Pair, timeout: float = 60.0) -> None:
    """Kafka creates __consumer_offsets and __transaction_state on the first FindCoordinator and answers
    NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS until they are loaded; a client asks FindCoordinator first and
    retries, so both brokers are brought to that point (untallied) before anything is compared."""
    keys = [n for n in generate.NAMES if n] + ["diff-group", "diff-txn"]
    deadline = time.monotonic() + timeout
    for target in (pair.ours, pair.theirs):
        for key_type in (0, 1):
            while True:
                resp = target.send(10, 4, FindCoordinatorRequest(key_type=key_type, coordinator_keys=keys))
                if (
                    all(c.error_code == 0 for c in getattr(resp, "coordinators", [None]) if c is not None)
                    and not isinstance(resp, str)
                    or time.monotonic() > deadline
                ):
                    break
                time.sleep(0.5)
        while True:
            resp = target.send(
                22, 4, InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000)
            )
            if getattr(resp, "error_code", -1) == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)


def generated(pair: Pair, cases: list[tuple[int, int]], examples: int, first_seed: int = 0) -> None:
    """`examples` generated requests per (API, version), seeded, each sent to both brokers."""
    if examples <= 0:
        return
    for api_key, version in cases:
        cls = codec.REQUESTS[api_key]

        run = seed(first_seed + api_key * 100 + version)(
            settings(
                max_examples=examples,
                deadline=None,
                database=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )(given(generate.message(cls, version))(_sender(pair, api_key, version)))
        )
        run()


def _sender(pair: Pair, api_key: int, version: int) -> Callable[[object], None]:
    def send(body: object) -> None:
        pair.both(api_key, version, body)

    return send


def run_all(pair: Pair, examples: int, scenarios: bool = True) -> tuple[Tally, list[str]]:
    ours, theirs = advertised(pair)
    create_topics(pair)
    warm_up(pair)
    if scenarios:
        from tests.differential import scenarios as sc

        sc.run(pair)
    generated(pair, generate.cases(ours, theirs), examples)
    return pair.tally, api_version_differences(ours, theirs)

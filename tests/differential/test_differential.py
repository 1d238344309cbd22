"""A short seeded differential pass against Apache Kafka 3.9 in ZooKeeper mode (the long run is
`python -m tests.differential --examples N`): ApiVersions, the stateful scenarios and one generated request per
API and version of the APIs whose answers already match Kafka's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.differential import generate, known, scenarios
from tests.differential.harness import Pair, Tally
from tests.differential.session import (
    advertised,
    api_version_differences,
    brokers,
    create_topics,
    generated,
    warm_up,
)
from tests.zookeeper import zookeeper_missing

# APIs whose generated requests (valid and invalid) got the same answers from both brokers in the long run; a
# difference in one of them is a regression.
MATCHING = {25, 26, 32, 33, 44, 51, 61, 66}


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    why = zookeeper_missing()
    if why:
        pytest.skip(why)
    from bench.peers.maven import ArtifactUnavailable

    try:
        with brokers() as (kbroker, kafka):
            p = Pair(kbroker, kafka, Tally(keep=5))
            create_topics(p)
            warm_up(p)
            yield p
            p.close()
    except ArtifactUnavailable as e:
        pytest.skip(f"Apache Kafka 3.9 cannot be fetched here: {e}")


def test_api_versions_match_except_the_documented(pair: Pair) -> None:
    ours, theirs = advertised(pair)
    differing = {line.split("(")[1].split(")")[0] for line in api_version_differences(ours, theirs)}
    assert differing == {str(k) for k in known.API_VERSIONS}, api_version_differences(ours, theirs)


def test_stateful_scenarios_differ_only_where_documented(pair: Pair) -> None:
    tally = Tally(keep=20)
    sub = Pair.__new__(Pair)
    sub.ours, sub.theirs, sub.tally = pair.ours, pair.theirs, tally
    scenarios.run(sub)
    different = {api for (api, _v), row in tally.rows.items() if row.different}
    assert different <= set(known.SCENARIOS), tally.table()
    assert sum(r.compared for r in tally.rows.values()) >= 60


def test_generated_requests_of_matching_apis(pair: Pair) -> None:
    ours, theirs = advertised(pair)
    tally = Tally(keep=5)
    sub = Pair.__new__(Pair)
    sub.ours, sub.theirs, sub.tally = pair.ours, pair.theirs, tally
    generated(sub, [c for c in generate.cases(ours, theirs) if c[0] in MATCHING], examples=2)
    assert tally.total_different() == 0, tally.table()
    assert sum(r.compared for r in tally.rows.values()) >= 2 * len(MATCHING)

"""A short seeded differential pass against Apache Kafka 3.9 in ZooKeeper mode (the long runs are
`python -m tests.differential --examples N` and `python -m tests.differential.denied`): ApiVersions, the stateful
scenarios, generated requests of the APIs whose answers already match Kafka's, and the same from a principal with no
ACLs. Both brokers run the ACL authorizer; the setup and comparisons without ACLs use the PLAINTEXT listener, whose
ANONYMOUS principal is a super user."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.differential import denied, generate, known, scenarios
from tests.differential.harness import Pair, Tally
from tests.differential.session import (
    advertised,
    api_version_differences,
    create_topics,
    generated,
    warm_up,
)
from tests.zookeeper import zookeeper_missing

# APIs whose generated requests (valid and invalid) got the same answers from both brokers in the long run; a
# difference in one of them is a regression.
MATCHING = {1, 2, 8, 11, 15, 16, 23, 24, 25, 26, 28, 32, 33, 35, 44, 49, 51, 61, 66}


@pytest.fixture(scope="module")
def pairs() -> Iterator[tuple[Pair, Pair]]:
    why = zookeeper_missing()
    if why:
        pytest.skip(why)
    from bench.peers.maven import ArtifactUnavailable

    try:
        with denied.denied_pairs() as (admin, user):
            admin.tally = Tally(keep=5)
            create_topics(admin)
            warm_up(admin)
            yield admin, user
    except ArtifactUnavailable as e:
        pytest.skip(f"Apache Kafka 3.9 cannot be fetched here: {e}")


@pytest.fixture(scope="module")
def pair(pairs: tuple[Pair, Pair]) -> Pair:
    return pairs[0]


def test_api_versions_match_except_the_documented(pair: Pair) -> None:
    ours, theirs = advertised(pair)
    differing = {line.split("(")[1].split(")")[0] for line in api_version_differences(ours, theirs)}
    assert differing == {str(k) for k in known.API_VERSIONS}, api_version_differences(ours, theirs)


def test_stateful_scenarios_differ_only_where_documented(pair: Pair) -> None:
    tally = Tally(keep=20)
    sub = Pair.__new__(Pair)
    sub.ours, sub.theirs, sub.tally = pair.ours, pair.theirs, tally
    scenarios.run(sub, slow=False)
    different = {api for (api, _v), row in tally.rows.items() if row.different}
    assert different <= set(known.SCENARIOS), tally.table()
    assert sum(r.compared for r in tally.rows.values()) >= 60


def test_generated_requests_of_matching_apis(pair: Pair) -> None:
    ours, theirs = advertised(pair)
    tally = Tally(keep=5)
    sub = Pair.__new__(Pair)
    sub.ours, sub.theirs, sub.tally = pair.ours, pair.theirs, tally
    sub.classify = known.GeneratedReasons()  # e.g. a DescribeLogDirs counting an OffsetCommit v0's bytes
    generated(sub, [c for c in generate.cases(ours, theirs) if c[0] in MATCHING], examples=2)
    assert tally.unexplained() == 0, tally.table()
    assert sum(r.compared for r in tally.rows.values()) >= 2 * len(MATCHING)


# APIs whose generated requests from the principal with no ACLs got the same answers from both brokers in the long
# run (`python -m tests.differential.denied`).
DENIED_MATCHING = {
    2,
    8,
    10,
    11,
    12,
    13,
    14,
    15,
    16,
    21,
    22,
    23,
    25,
    26,
    32,
    35,
    42,
    44,
    47,
    48,
    49,
    51,
    60,
    61,
    65,
    66,
}


def test_denied_principal_gets_kafkas_errors(pairs: tuple[Pair, Pair]) -> None:
    admin, user = pairs
    ours, theirs = advertised(admin)
    tally = Tally(keep=5)
    sub = Pair.__new__(Pair)
    sub.ours, sub.theirs, sub.tally = user.ours, user.theirs, tally
    generated(
        sub, [c for c in generate.cases(ours, theirs) if c[0] in DENIED_MATCHING], examples=1, first_seed=7000
    )
    assert tally.total_different() == 0, tally.table()
    assert sum(r.compared for r in tally.rows.values()) >= len(DENIED_MATCHING)

"""The group metadata hash (KIP-1101) against Kafka's own code: tests/java/GroupMetadataHash.java runs Kafka 4.4's
group coordinator Utils.computeTopicHash / computeGroupHash (and hash4j's XXH3-64 as Kafka calls it) from the
cached jars (`python -m bench.peers.kafka fetch 4`) on the same inputs as coordinator.group_metadata_hash."""

from __future__ import annotations

import base64
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from kbroker.coordinator.group_metadata_hash import group_hash, topic_hash, topics_hash, xxh3_64
from kbroker.coordinator.metadata_store import PartitionState, TopicRecord

from bench.peers.kafka import ArtifactUnavailable, fetch

SOURCE = Path(__file__).resolve().parents[1] / "java" / "GroupMetadataHash.java"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The java command line of the reference program."""
    if shutil.which("javac") is None or shutil.which("java") is None:
        pytest.skip("javac/java not on PATH (install a JDK, e.g. openjdk-17-jdk-headless)")
    try:
        lib = fetch("4")
    except ArtifactUnavailable as e:
        pytest.skip(f"the Kafka 4 jars cannot be fetched: {e}")
    jars = os.pathsep.join(str(p) for p in sorted(lib.glob("*.jar")))
    out = tmp_path_factory.mktemp("hash-java")
    r = subprocess.run(
        ["javac", "-d", str(out), "-cp", jars, str(SOURCE)], capture_output=True, text=True, timeout=180
    )
    assert r.returncode == 0, f"javac failed:\n{r.stdout}\n{r.stderr}"
    return ["java", "-cp", os.pathsep.join([str(out), jars]), "GroupMetadataHash"]


def ask(reference: list[str], lines: list[str]) -> list[int]:
    r = subprocess.run(
        reference, input="".join(f"{x}\n" for x in lines), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    out = [int(x) for x in r.stdout.split()]
    assert len(out) == len(lines)
    return out


def signed(h: int) -> int:
    return h - (1 << 64) if h >= 1 << 63 else h


def test_xxh3_matches_hash4j_at_every_length_class(reference: list[str]) -> None:
    """Every branch of XXH3-64: 0, 1-3, 4-8, 9-16, 17-128, 129-240 bytes, then stripes, blocks and their ends."""
    rnd = random.Random(932)
    lengths = [*range(0, 260), 1023, 1024, 1025, 1087, 1088, 1089, 2048, 2049, 4999]
    lengths += [rnd.randrange(260, 6000) for _ in range(60)]
    data = [rnd.randbytes(n) for n in lengths]
    want = ask(reference, [f"bytes {d.hex()}" for d in data])
    got = [signed(xxh3_64(d)) for d in data]
    assert [n for n, w, g in zip(lengths, want, got, strict=True) if w != g] == []


def random_name(rnd: random.Random) -> str:
    # topic-name characters, plus names outside ASCII and the BMP: hash4j hashes UTF-16 code units
    alphabet = "abcxyz._-0189ABZ"
    name = "".join(rnd.choice(alphabet) for _ in range(rnd.randrange(1, 40)))
    return name if rnd.random() < 0.7 else name + rnd.choice(["é", "主題", "\U0001f600"])


def test_topic_and_group_hashes_match_kafka(reference: list[str]) -> None:
    rnd = random.Random(1101)
    topics = []
    for _ in range(150):
        topic_id = rnd.randbytes(16)
        name = random_name(rnd)
        partitions = rnd.choice([0, 1, 2, 3, 7, 50, 300])
        racks = [
            [rnd.choice(["r0", "r1", "rack-é", "a", "zz"]) for _ in range(rnd.randrange(0, 4))]
            if rnd.random() < 0.5
            else []
            for _ in range(partitions)
        ]
        topics.append((topic_id, name, racks))
    lines = []
    for topic_id, name, racks in topics:
        uuid = base64.urlsafe_b64encode(topic_id).decode().rstrip("=")
        spec = ";".join(",".join(r) if r else "-" for r in racks)
        lines.append(f"topic {uuid} {name} {spec}")
    want = ask(reference, lines)
    got = [topic_hash(tid, name, racks) for tid, name, racks in topics]
    assert want == got
    # groups of some of those topics (names unique within a group, as the map's keys)
    groups = []
    for _ in range(60):
        chosen = {
            name: h
            for (_, name, _), h in rnd.sample(list(zip(topics, got, strict=True)), rnd.randrange(0, 12))
        }
        groups.append(chosen)
    want_groups = ask(reference, ["group " + " ".join(f"{n}={h}" for n, h in g.items()) for g in groups])
    assert want_groups == [group_hash(g) for g in groups]
    assert group_hash({}) == 0


def test_what_changes_the_hash() -> None:
    """A partition more, a new topic id for the same name (deleted and made again), or a rack: each a new hash;
    the order racks are listed in is not."""
    tid, other = bytes(range(16)), bytes(range(1, 17))
    base = topic_hash(tid, "orders", [[], []])
    assert topic_hash(tid, "orders", [[], [], []]) != base
    assert topic_hash(other, "orders", [[], []]) != base
    assert topic_hash(tid, "orders", [["r1"], []]) != base
    assert topic_hash(tid, "orders", [["r1", "r2"], []]) == topic_hash(tid, "orders", [["r2", "r1"], []])


def test_the_cached_topic_hash_follows_the_topic_and_its_racks() -> None:
    """topics_hash keeps a topic's hash while its record and its brokers' racks stay the same (Kafka's
    topicHashCache); a record replaced (partitions added, the topic made again) or a rack moved is hashed again."""
    tid = bytes(range(16))
    rec = TopicRecord.single_replica("orders", tid, [1, 2])
    racks: dict[int, str | None] = {1: "r1", 2: None}
    want = group_hash({"orders": topic_hash(tid, "orders", [["r1"], []])})
    assert topics_hash(["orders", "missing"], {"orders": rec}, racks.get) == want
    assert topics_hash(["orders"], {"orders": rec}, racks.get) == want
    racks[2] = "r2"
    assert topics_hash(["orders"], {"orders": rec}, racks.get) == group_hash(
        {"orders": topic_hash(tid, "orders", [["r1"], ["r2"]])}
    )
    more = rec.with_partitions([*rec.partitions, PartitionState.sole(1)])
    assert topics_hash(["orders"], {"orders": more}, racks.get) == group_hash(
        {"orders": topic_hash(tid, "orders", [["r1"], ["r2"], ["r1"]])}
    )
    again = TopicRecord.single_replica("orders", bytes(range(1, 17)), [1])
    assert topics_hash(["orders"], {"orders": again}, racks.get) == group_hash(
        {"orders": topic_hash(bytes(range(1, 17)), "orders", [["r1"]])}
    )
    assert topics_hash(["missing"], {"orders": again}, racks.get) == 0

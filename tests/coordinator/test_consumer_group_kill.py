"""KIP-848 (group.protocol=consumer) with confluent-kafka: three members, each a process of its own, one killed
with SIGKILL; the coordinator fences it when its session expires and its partitions move to the other two,
which never stop consuming their own. The scenario and its checks are in tests/group_kill.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker_process import ROOT, BrokerProcess
from tests.group_helpers import kip848_broker
from tests.group_kill import kill_one_of_three

SESSION_TIMEOUT_MS = 3000


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("broker"), kip848_broker(SESSION_TIMEOUT_MS))
    b.start()
    yield b
    b.stop()


def test_three_members_one_killed_others_keep_consuming(broker: BrokerProcess, topic_name: str,
                                                        tmp_path: Path) -> None:
    measured = kill_one_of_three(broker, topic_name, "g-" + topic_name,
                                 [sys.executable, "-m", "tests.consumer_member"], tmp_path, ROOT, SESSION_TIMEOUT_MS)
    print(f"confluent-kafka, one of three members killed: {measured}")

"""KIP-848 (group.protocol=consumer) with the Java client (kafka-clients 3.9.1): three members, each a JVM running
ConsumerGroupMember.java, one killed with SIGKILL; the coordinator fences it when its session expires and its
partitions move to the other two, which never stop consuming their own. The scenario and its checks are in
tests/group_kill.py, shared with the confluent-kafka test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker_process import ROOT, BrokerProcess
from tests.group_helpers import kip848_broker
from tests.group_kill import kill_one_of_three
from tests.java.test_java_client import _missing, compile_java

HERE = Path(__file__).resolve().parent
SOURCES = [HERE / "ConsumerGroupMember.java", HERE / "org" / "slf4j" / "impl" / "StaticLoggerBinder.java"]
SESSION_TIMEOUT_MS = 3000

_why = _missing()
pytestmark = pytest.mark.skipif(_why is not None, reason=_why or "")


@pytest.fixture(scope="module")
def classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    return compile_java(tmp_path_factory, SOURCES, "java-classes")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("broker"), kip848_broker(SESSION_TIMEOUT_MS))
    b.start()
    yield b
    b.stop()


def test_java_three_members_one_killed_others_keep_consuming(classpath: str, broker: BrokerProcess,
                                                             topic_name: str, tmp_path: Path) -> None:
    # three JVMs start at once on a shared machine: give them longer to join than librdkafka needs
    measured = kill_one_of_three(broker, topic_name, "java-" + topic_name,
                                 ["java", "-Dkcompat.log=WARN", "-cp", classpath, "ConsumerGroupMember"], tmp_path,
                                 ROOT, SESSION_TIMEOUT_MS, join_timeout=30)
    print(f"Java client, one of three members killed: {measured}")

"""The Java client (kafka-clients 3.9) against ACL authorization: Admin createAcls / describeAcls (ANY, MATCH) /
deleteAcls, describeTopics with authorized operations, and a consumer and producer as a SASL PLAIN user
(AclCompat.java beside this file)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.test_acls_users import USERS, UsersBroker, as_user
from tests.clients import Msg, ck_produce
from tests.java.test_java_client import _missing, compile_java

HERE = Path(__file__).resolve().parent
SOURCES = [HERE / "AclCompat.java", HERE / "org" / "slf4j" / "impl" / "StaticLoggerBinder.java"]

_why = _missing()
pytestmark = pytest.mark.skipif(_why is not None, reason=_why or "")


@pytest.fixture(scope="module")
def classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    return compile_java(tmp_path_factory, SOURCES, "acl-java-classes")


@pytest.fixture(scope="module")
def users(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UsersBroker]:
    b = UsersBroker(tmp_path_factory.mktemp("acl-java"))
    b.start()
    yield b
    b.stop()


def test_java_admin_acls_and_clients(classpath: str, users: UsersBroker) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    assert set(USERS) >= {"admin", "alice"}
    admin = AdminClient({"bootstrap.servers": users.sasl, **as_user("admin")})
    admin.create_topics([NewTopic("jacl-topic", 1, 1)])["jacl-topic"].result(15)
    ck_produce(users.sasl, "jacl-topic", [Msg(b"k", f"v{i}".encode()) for i in range(3)],
               **{k.replace(".", "_"): v for k, v in as_user("admin").items()})
    r = subprocess.run(["java", "-Dkcompat.log=WARN", "-cp", classpath, "AclCompat", users.sasl, "jacl-topic",
                        "jacl-group"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and r.stdout.splitlines()[-1:] == ["DONE"], (
        f"exit {r.returncode}\n--- stdout:\n{r.stdout}\n--- stderr:\n{r.stderr[-6000:]}\n"
        f"--- broker log:\n{users.read_log()[-3000:]}")
    ok = [line[3:] for line in r.stdout.splitlines() if line.startswith("OK ")]
    assert [line.split(" ")[0] for line in ok] == [
        "createAcls", "describeAcls", "describeAcls", "authorizedOperations", "createAcls", "consume", "produce",
        "deleteAcls", "topic"], r.stdout
    assert "authorizedOperations [READ, DESCRIBE]" in ok or "authorizedOperations [DESCRIBE, READ]" in ok

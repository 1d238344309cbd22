"""The worked SASL_SSL + ACL example, run as written: its broker properties (paths, hosts and ports
substituted), its SCRAM user and ACLs, its kcat commands and its Java client properties."""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kbroker.broker.config import read_properties

from tests.broker_process import ROOT, BrokerProcess, free_port
from tests.conftest import have_kcat
from tests.java.test_java_security import java_classpath  # noqa: F401  (the compiled SecurityCompat)
from tests.security_setup import Pki, make_pki

pytestmark = pytest.mark.skipif(not have_kcat(), reason="kcat is not installed")


def example_blocks() -> list[tuple[str, str]]:
    text = (ROOT / "docs" / "security.md").read_text()
    section = text.split("## Worked example: SASL_SSL", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, re.S)


class Example:
    def __init__(self, base: Path, pki: Pki) -> None:
        blocks = example_blocks()
        props = [b for lang, b in blocks if lang == "properties"]
        self.shell = [b for lang, b in blocks if lang == "sh"]
        self.local, self.external = free_port(), free_port()
        self.pki = pki
        broker = {k: self.subst(v) for k, v in read_properties(props[0]).items()}
        self.client = {k: self.subst(v) for k, v in read_properties(props[1]).items()}
        self.broker = BrokerProcess(base, broker, port=self.local)

    def subst(self, v: str) -> str:
        return (v.replace("/etc/kbroker/broker.pem", str(self.pki.broker_keystore))
                .replace("/etc/kbroker/ca.pem", str(self.pki.ca)).replace("ca.pem", str(self.pki.ca))
                .replace("127.0.0.1:9092", f"127.0.0.1:{self.local}")
                .replace("0.0.0.0:9093", f"127.0.0.1:{self.external}")
                .replace("broker.example.com:9093", f"127.0.0.1:{self.external}"))

    def commands(self, block: str) -> list[list[str]]:
        return [[self.subst(a) for a in shlex.split(line)] for line in block.replace("\\\n", " ").splitlines()
                if line.strip()]


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Example]:
    ex = Example(tmp_path_factory.mktemp("readme-example"), make_pki(tmp_path_factory.mktemp("pki")))
    ex.broker.start()
    yield ex
    ex.broker.stop()


def test_worked_example(example: Example, java_classpath: str) -> None:  # noqa: F811
    # The admin commands use Kafka's shell tools; the same requests, made with confluent-kafka's admin client.
    topics, configs, acls = example.commands(example.shell[0])
    assert topics[-5:] == ["--create", "--topic", "orders", "--partitions", "1"]
    assert configs[:3] == ["kafka-configs.sh", "--bootstrap-server", f"127.0.0.1:{example.local}"]
    assert "SCRAM-SHA-256=[iterations=8192,password=alice-secret]" in configs
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{example.local}"})
    admin.create_topics([NewTopic("orders", 1, 1)])["orders"].result(timeout=30)
    up = UserScramCredentialUpsertion("alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), b"alice-secret")
    admin.alter_user_scram_credentials([up])["alice"].result(timeout=30)
    assert acls[acls.index("--allow-principal") + 1] == "User:alice"
    ops = [acls[i + 1] for i, a in enumerate(acls) if a == "--operation"]
    bindings = [AclBinding(kind, name, ResourcePatternType.LITERAL, "User:alice", "*", getattr(AclOperation, op.upper()),
                           AclPermissionType.ALLOW)
                for kind, name in ((ResourceType.TOPIC, acls[acls.index("--topic") + 1]),
                                   (ResourceType.GROUP, acls[acls.index("--group") + 1]))
                for op in ops]
    for f in admin.create_acls(bindings).values():
        f.result(timeout=30)

    # The Java client with the example's client.properties: produce and consume in group billing.
    props = {f"prop.{k}": v for k, v in example.client.items() if k != "bootstrap.servers"}
    cmd = ["java", "-cp", java_classpath, "SecurityCompat", example.client["bootstrap.servers"], "roundtrip",
           "topic=orders", "group=billing", "count=100", *(f"{k}={v}" for k, v in props.items())]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and "OK consumed 100" in r.stdout, r.stdout + r.stderr[-4000:]

    # kcat, as written.
    produce, consume = example.commands(example.shell[1])
    p = subprocess.run(produce, input=b"one\ntwo\nthree\n", capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    c = subprocess.run([*consume, "-c", "3"], capture_output=True, timeout=60)
    assert c.returncode == 0 and c.stdout.splitlines() == [b"one", b"two", b"three"], c.stderr

    # Another topic: TOPIC_AUTHORIZATION_FAILED. A wrong password: the SASL error.
    denied = subprocess.run([*produce[:-1], "payments"], input=b"x\n", capture_output=True, timeout=60)
    assert denied.returncode != 0 or b"Topic authorization failed" in denied.stderr, denied.stderr
    assert b"authorization failed" in denied.stderr.lower(), denied.stderr
    wrong = [a.replace("sasl.password=alice-secret", "sasl.password=wrong") for a in produce]
    bad = subprocess.run(wrong, input=b"x\n", capture_output=True, timeout=60)
    assert b"invalid credentials with SASL mechanism SCRAM-SHA-256" in bad.stderr, bad.stderr

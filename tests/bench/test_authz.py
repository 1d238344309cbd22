"""bench.authz configures Apache Kafka's own authorizer per mode: AclAuthorizer on ZooKeeper, StandardAuthorizer on
KRaft with the controller listener on SASL/PLAIN as the only super user, and the same listeners for the baseline."""

from __future__ import annotations

from pathlib import Path

from bench.authz import ACL_AUTHORIZER, STANDARD_AUTHORIZER, kafka_overrides
from bench.peers.kafka import KafkaPeer


def test_zookeeper_mode_gets_acl_authorizer_and_no_super_user(tmp_path: Path) -> None:
    props = KafkaPeer("3.9", mode="zk", zookeeper="127.0.0.1:1", base=tmp_path).properties()
    assert kafka_overrides(props, authorizer=False) == {}
    out = kafka_overrides(props, authorizer=True)
    assert out == {"authorizer.class.name": ACL_AUTHORIZER, "allow.everyone.if.no.acl.found": "true"}


def test_kraft_controller_listener_is_the_only_super_user(tmp_path: Path) -> None:
    props = KafkaPeer("4", mode="kraft", base=tmp_path).properties()
    plain, authz = kafka_overrides(props, authorizer=False), kafka_overrides(props, authorizer=True)
    # The baseline has the same listeners; only the authorizer keys differ.
    assert {k: v for k, v in authz.items() if k in plain} == plain
    assert set(authz) - set(plain) == {
        "authorizer.class.name",
        "allow.everyone.if.no.acl.found",
        "super.users",
    }
    assert authz["authorizer.class.name"] == STANDARD_AUTHORIZER
    mapped = dict(kv.split(":") for kv in plain["listener.security.protocol.map"].split(","))
    assert mapped == {"PLAINTEXT": "PLAINTEXT", "CONTROLLER": "SASL_PLAINTEXT"}
    assert plain["sasl.mechanism.controller.protocol"] == "PLAIN"
    jaas = plain["listener.name.controller.plain.sasl.jaas.config"]
    assert 'username="controller"' in jaas and 'user_controller="' in jaas and jaas.endswith(";")
    # The clients stay ANONYMOUS on PLAINTEXT, under the ACLs: only the controller principal is a super user.
    assert authz["super.users"] == "User:controller"

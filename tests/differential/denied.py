"""The same requests from an authenticated principal with no ACLs (SASL/PLAIN, ACL authorizer on both brokers):
which authorization error each broker answers, and what Metadata hides.

`python -m tests.differential.denied [--examples N]` prints the table; tests/differential/test_denied.py runs a
short seeded pass in CI."""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kbroker.protocol.messages import SaslAuthenticateRequest, SaslHandshakeRequest

from bench.peers.ports import free_port
from tests.broker_process import BrokerProcess
from tests.differential import generate, known
from tests.differential.harness import CLOSED, Pair, Tally, Target
from tests.differential.session import COMMON, advertised, create_topics, generated, warm_up

USER, PASSWORD = "alice", "alice-secret"
JAAS = (
    'org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-secret" '
    f'user_admin="admin-secret" user_{USER}="{PASSWORD}";'
)


def secured(plain_port: int, sasl_port: int) -> dict[str, str]:
    """The same security settings for both brokers: PLAINTEXT for setup and inter-broker traffic (ANONYMOUS is a
    super user), SASL_PLAINTEXT with PLAIN for the principal under test, Kafka's ZooKeeper ACL authorizer (no ACL,
    no access)."""
    listeners = f"PLAINTEXT://127.0.0.1:{plain_port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}"
    return {
        "listeners": listeners,
        "advertised.listeners": listeners,
        "inter.broker.listener.name": "PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
        "super.users": "User:ANONYMOUS",
        "allow.everyone.if.no.acl.found": "false",
    }


class _SecuredBroker(BrokerProcess):
    def __init__(self, data_dir: Path) -> None:
        self.sasl_port = free_port()
        port = free_port()
        super().__init__(data_dir, {**COMMON, **secured(port, self.sasl_port)}, port=port)

    def listen_ports(self) -> list[int]:
        return [self.port, self.sasl_port]


class SaslTarget(Target):
    """A Target whose every connection authenticates with SASL/PLAIN first."""

    def send(self, api_key: int, version: int, body: Any, expect_response: bool = True) -> Any:
        # Authenticate before this request takes its correlation id (Target.send numbers it first).
        if self.sock is None and api_key not in (17, 36):
            try:
                self.sock = socket.create_connection(self.address, timeout=self.timeout)
            except OSError:
                return CLOSED
            hs = super().send(17, 1, SaslHandshakeRequest(mechanism="PLAIN"))
            auth = super().send(36, 2, SaslAuthenticateRequest(auth_bytes=f"\0{USER}\0{PASSWORD}".encode()))
            if getattr(hs, "error_code", -1) or getattr(auth, "error_code", -1):
                raise ConnectionError(f"{self.name}: SASL/PLAIN refused: {hs!r} {auth!r}")
        return super().send(api_key, version, body, expect_response)


@contextlib.contextmanager
def denied_pairs() -> Iterator[tuple[Pair, Pair]]:
    """(a super-user Pair over PLAINTEXT for setup, the denied principal's Pair over SASL_PLAINTEXT)."""
    from bench.peers.kafka import KafkaPeer

    with tempfile.TemporaryDirectory(prefix="differential-denied-") as tmp:
        ours = _SecuredBroker(Path(tmp) / "kbroker")
        ours.start()
        try:
            kafka_sasl = free_port()
            peer = KafkaPeer("3.9", mode="zk", overrides=dict(COMMON), base=Path(tmp) / "kafka")
            peer.overrides |= secured(peer.port, kafka_sasl)
            with peer as kafka:
                admin = Pair(ours.bootstrap, kafka.bootstrap)
                user = Pair.__new__(Pair)
                user.ours = SaslTarget("kbroker", f"127.0.0.1:{ours.sasl_port}")
                user.theirs = SaslTarget("kafka", f"127.0.0.1:{kafka_sasl}")
                user.tally = Tally()
                try:
                    yield admin, user
                finally:
                    admin.close()
                    user.close()
        finally:
            ours.stop()


def run(admin: Pair, user: Pair, examples: int, only: set[int] | None = None) -> Tally:
    """Topics and coordinators set up as the super user, then `examples` generated requests per API and version
    from the denied principal (APIs in `only`, or all both brokers advertise)."""
    ours, theirs = advertised(admin)
    create_topics(admin)
    warm_up(admin)
    cases = [c for c in generate.cases(ours, theirs) if only is None or c[0] in only]
    generated(user, cases, examples, first_seed=7000)
    return user.tally


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.differential.denied", description=__doc__)
    parser.add_argument("--examples", type=int, default=5, help="generated requests per API and version")
    parser.add_argument("--examples-shown", type=int, default=3, help="differences shown per API and version")
    parser.add_argument(
        "--by-api", action="store_true", help="also the table with the versions of an API summed"
    )
    parser.add_argument(
        "--dump", type=argparse.FileType("w"), help="write every difference in full to this file"
    )
    args = parser.parse_args(argv)
    from bench.peers.maven import ArtifactUnavailable

    try:
        with denied_pairs() as (admin, user):
            user.tally = Tally(args.examples_shown, args.dump)
            user.classify = known.GeneratedReasons()
            tally = run(admin, user, args.examples)
    except ArtifactUnavailable as e:
        print(f"Kafka 3.9 is unavailable here: {e}", file=sys.stderr)
        return 2
    print(
        f"Requests from User:{USER} (SASL/PLAIN, no ACLs) to kbroker and Kafka 3.9, both with an ACL authorizer"
    )
    print(tally.table())
    if args.by_api:
        print("\nPer API (all versions):")
        print(tally.by_api().table(examples=False).replace("  -1", "   "))
    print(f"\n{tally.unexplained()} differences without a reason in tests/differential/known.py")
    return 1 if tally.unexplained() else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

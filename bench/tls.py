"""Workload: TLS + SASL cost. One kbroker with a PLAINTEXT and a SASL_SSL listener (TLS 1.3 only, AES-GCM,
SCRAM-SHA-256), certificates made for the run. The same confluent-kafka produce (100 B, acks=all, 8 topics x 4
partitions) and consume (from offset 0) run over each listener, alternating which goes first. Target: SASL_SSL
at least 0.6x PLAINTEXT's throughput in the same run (the issue's performance target).

Apache Kafka peers (--peers kafka3.9 / kafka4) get the same two listeners, the same PEM keystore and CA, TLS 1.3 only
and the same SCRAM-SHA-256 user (created with AlterUserScramCredentials over PLAINTEXT, as on kbroker), and run the
same loops after kbroker in each repetition. Tansu has no SASL_SSL listener: left out with a note."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import clients
from bench.harness import PEERS, Ctx, KafkaTarget, KBroker, Row, Target, free_port, med, payloads, workdir

NTOPICS = 8
USER, PASSWORD = "bench", "bench-secret"


def ratio_to(baseline: Row, factor: float) -> Callable[[Row], bool | None]:
    def chk(r: Row) -> bool | None:
        a, b = med(r.kb), med(baseline.kb)
        return None if a is None or not b else a >= factor * b

    return chk


def _add_user(bootstrap: str) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    up = UserScramCredentialUpsertion(USER, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), PASSWORD.encode())
    admin.alter_user_scram_credentials([up])[USER].result(30)


def _wait_sasl(bootstrap: str, conf: dict[str, Any], timeout: float = 60.0) -> None:
    """Until a SASL_SSL client authenticates: Kafka on ZooKeeper learns new SCRAM credentials by notification."""
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout
    while True:
        try:
            AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, **conf}).list_topics(timeout=5)
            return
        except Exception:  # noqa: BLE001 - authentication refused until the credential arrives
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def sasl_ssl_overrides(props: dict[str, str], sasl_port: int, keystore: Path) -> dict[str, str]:
    """Kafka server.properties that add kbroker's SASL_SSL listener (PEM keystore, TLS 1.3 only, SCRAM-SHA-256)
    to a single-node KafkaPeer's `props`, ZooKeeper or KRaft."""
    extra = f",SASL_SSL://127.0.0.1:{sasl_port}"
    out = {
        "listeners": props["listeners"] + extra,
        "advertised.listeners": props["advertised.listeners"] + extra,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(keystore),
        "ssl.enabled.protocols": "TLSv1.3",
        "ssl.protocol": "TLSv1.3",
        "sasl.enabled.mechanisms": "SCRAM-SHA-256",
        # Kafka's SCRAM server side needs a login module for the listener's mechanism even with nothing to log in.
        "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
    }
    if "listener.security.protocol.map" in props:  # KRaft names its CONTROLLER listener, so the map is explicit
        out["listener.security.protocol.map"] = props["listener.security.protocol.map"] + ",SASL_SSL:SASL_SSL"
    return out


def _secure_kafka(ctx: Ctx, key: str, pki: Any) -> tuple[Target, str]:
    """Apache Kafka with a PLAINTEXT and a SASL_SSL listener configured as kbroker's, started, user created."""
    t = PEERS[key](ctx)
    if not isinstance(t, KafkaTarget):
        raise RuntimeError(f"{t.name} has no SASL_SSL listener here")
    sasl_port = free_port()
    t.peer.overrides.update(sasl_ssl_overrides(t.peer.properties(), sasl_port, pki.broker_keystore))
    t.start()
    _add_user(t.bootstrap)
    return t, f"127.0.0.1:{sasl_port}"


def _secure_broker(ctx: Ctx, pki: Any) -> tuple[KBroker, str, dict[str, Any]]:
    sasl_port = free_port()
    kb = KBroker(ctx.base)
    kb.overrides.update({
        "listeners": f"PLAINTEXT://127.0.0.1:{kb.port},SASL_SSL://127.0.0.1:{sasl_port}",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(pki.broker_keystore),
        "ssl.enabled.protocols": "TLSv1.3",
        "sasl.enabled.mechanisms": "SCRAM-SHA-256",
    })
    kb.start()
    _add_user(kb.bootstrap)
    conf = {"security.protocol": "SASL_SSL", "ssl.ca.location": str(pki.ca), "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": USER, "sasl.password": PASSWORD}
    return kb, f"127.0.0.1:{sasl_port}", conf


def run(ctx: Ctx) -> list[Row]:
    n = ctx.n(1_000_000, 100_000)
    values = payloads(100)
    prod_plain = Row("produce 100 B, PLAINTEXT (baseline of the TLS rows)", "msg/s", target="(baseline)")
    prod_tls = Row("produce 100 B, SASL_SSL (TLS 1.3 AES-GCM, SCRAM-SHA-256)", "msg/s",
                   target=">= 0.6x PLAINTEXT", check=ratio_to(prod_plain, 0.6))
    cons_plain = Row("consume 100 B, confluent-kafka, PLAINTEXT (baseline of the TLS rows)", "msg/s",
                     target="(baseline)")
    cons_tls = Row("consume 100 B, confluent-kafka, SASL_SSL (TLS 1.3 AES-GCM, SCRAM-SHA-256)", "msg/s",
                   target=">= 0.6x PLAINTEXT", check=ratio_to(cons_plain, 0.6))
    from tests.security_setup import make_pki

    pki = make_pki(workdir(ctx.base, "pki"))
    kb, sasl_bootstrap, sasl_conf = _secure_broker(ctx, pki)
    brokers: list[tuple[Target, str]] = [(kb, sasl_bootstrap)]
    try:
        for key in ctx.extra.get("peers", []):
            try:
                t, bootstrap = _secure_kafka(ctx, key, pki)
            except Exception as e:  # noqa: BLE001 - ArtifactUnavailable, no TLS listener, or it would not start
                reason = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
                ctx.extra.setdefault("unavailable", {})[f"{key} (tls)"] = reason
                ctx.log(f"  [{key} unavailable for the TLS rows: {reason}]")
                continue
            brokers.append((t, bootstrap))
            _wait_sasl(bootstrap, sasl_conf)
            ctx.log(f"  [{t.name} up with SASL_SSL on {bootstrap}]")
        for rep in range(ctx.reps):
            if ctx.out_of_time(f"tls rep {rep + 1}"):
                break
            for t, sasl in brokers:
                runs = [(t.bootstrap, {}, prod_plain, cons_plain, "plain"),
                        (sasl, sasl_conf, prod_tls, cons_tls, "sasl_ssl")]
                for bootstrap, conf, prow, crow, tag in runs if rep % 2 == 0 else runs[::-1]:
                    topics = [f"tls_r{rep}_{tag}_{k}" for k in range(NTOPICS)]
                    tps = clients.partitions_of(topics)
                    t.create_topics(topics)
                    c0 = t.cpu()
                    secs, left = clients.produce(bootstrap, tps, n, values, conf, timeout=180)
                    cpu = t.cpu() - c0
                    if left:
                        prow.note += f" {t.name} rep{rep + 1}: {left} undelivered;"
                    prow.add(t, n / secs if not left else float("nan"), cpu * 1e6 / n)
                    c0 = t.cpu()
                    csecs, got, _ = clients.consume_confluent(bootstrap, tps, n, 180, conf=conf)
                    ccpu = t.cpu() - c0
                    if got < n:
                        crow.note += f" {t.name} rep{rep + 1}: read {got} of {n};"
                    crow.add(t, got / csecs if got >= n else float("nan"), ccpu * 1e6 / max(got, 1))
                    ctx.log(f"  tls rep {rep + 1} {t.name} {tag}: produce {n / secs:,.0f} msg/s "
                            f"({cpu * 1e6 / n:.2f} us CPU/msg), consume {got / csecs:,.0f} msg/s "
                            f"({ccpu * 1e6 / max(got, 1):.2f} us CPU/msg)")
        for r in (prod_plain, prod_tls, cons_plain, cons_tls):
            for t, _ in brokers:
                r.add_rss(t)
    finally:
        for t, _ in brokers:
            t.stop()
    for base, row in ((prod_plain, prod_tls), (cons_plain, cons_tls)):
        a, b = med(row.kb), med(base.kb)
        if a is not None and b:
            row.note += f" {a / b:.2f}x PLAINTEXT in the same run"
        for name, xs in row.others.items():
            oa, ob = med(xs), med(base.others.get(name, []))
            if oa is not None and ob:
                row.note += f", {name} {oa / ob:.2f}x"
        row.note += ";"
    return [prod_plain, prod_tls, cons_plain, cons_tls]

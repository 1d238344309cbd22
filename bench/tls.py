"""Workload: TLS + SASL cost. One kbroker with a PLAINTEXT and a SASL_SSL listener (TLS 1.3 only, AES-GCM,
SCRAM-SHA-256), certificates made for the run. The same confluent-kafka produce (100 B, acks=all, 8 topics x 4
partitions) and consume (from offset 0) run over each listener, alternating which goes first. Target: SASL_SSL
at least 0.6x PLAINTEXT's throughput in the same run (the issue's performance target)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench import clients
from bench.harness import Ctx, KBroker, Row, free_port, med, payloads, workdir

NTOPICS = 8
USER, PASSWORD = "bench", "bench-secret"


def ratio_to(baseline: Row, factor: float) -> Callable[[Row], bool | None]:
    def chk(r: Row) -> bool | None:
        a, b = med(r.kb), med(baseline.kb)
        return None if a is None or not b else a >= factor * b

    return chk


def _secure_broker(ctx: Ctx) -> tuple[KBroker, str, dict[str, Any]]:
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    from tests.security_setup import make_pki

    pki = make_pki(workdir(ctx.base, "pki"))
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
    admin = AdminClient({"bootstrap.servers": kb.bootstrap, "log_level": 3})
    up = UserScramCredentialUpsertion(USER, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), PASSWORD.encode())
    admin.alter_user_scram_credentials([up])[USER].result(30)
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
    kb, sasl_bootstrap, sasl_conf = _secure_broker(ctx)
    try:
        for rep in range(ctx.reps):
            if ctx.out_of_time(f"tls rep {rep + 1}"):
                break
            runs = [(kb.bootstrap, {}, prod_plain, cons_plain, "plain"),
                    (sasl_bootstrap, sasl_conf, prod_tls, cons_tls, "sasl_ssl")]
            for bootstrap, conf, prow, crow, tag in runs if rep % 2 == 0 else runs[::-1]:
                topics = [f"tls_r{rep}_{tag}_{k}" for k in range(NTOPICS)]
                tps = clients.partitions_of(topics)
                kb.create_topics(topics)
                c0 = kb.cpu()
                secs, left = clients.produce(bootstrap, tps, n, values, conf, timeout=180)
                cpu = kb.cpu() - c0
                if left:
                    prow.note += f" rep{rep + 1}: {left} undelivered;"
                prow.kb.append(n / secs if not left else float("nan"))
                prow.kb_cpu_us.append(cpu * 1e6 / n)
                c0 = kb.cpu()
                csecs, got, _ = clients.consume_confluent(bootstrap, tps, n, 180, conf=conf)
                ccpu = kb.cpu() - c0
                if got < n:
                    crow.note += f" rep{rep + 1}: read {got} of {n};"
                crow.kb.append(got / csecs if got >= n else float("nan"))
                crow.kb_cpu_us.append(ccpu * 1e6 / max(got, 1))
                ctx.log(f"  tls rep {rep + 1} {tag}: produce {n / secs:,.0f} msg/s ({cpu * 1e6 / n:.2f} us CPU/msg), "
                        f"consume {got / csecs:,.0f} msg/s ({ccpu * 1e6 / max(got, 1):.2f} us CPU/msg)")
        hwm = kb.hwm_mb()
        for r in (prod_plain, prod_tls, cons_plain, cons_tls):
            r.kb_rss_mb.append(hwm)
    finally:
        kb.stop()
    for base, row in ((prod_plain, prod_tls), (cons_plain, cons_tls)):
        a, b = med(row.kb), med(base.kb)
        if a is not None and b:
            row.note += f" {a / b:.2f}x PLAINTEXT in the same run;"
    return [prod_plain, prod_tls, cons_plain, cons_tls]

"""Workload: authorization cost. Two kbroker processes in the same run, one without an authorizer (the baseline)
and one with `authorizer.class.name` and 200 ACLs (the producer's and consumer's access through prefixed
ACLs among literal ones for other users), no super user. Each gets
small requests, where a per-request cost shows most: produce 100 B one message per request (linger.ms 0,
one in flight), then Metadata for 8 topics. Target: the authorizing broker's CPU per request at most 1.05x
the baseline's (the issue's "authorization adds under 5% CPU per request"). A 5% difference needs a quiet
machine: on a shared one, two identical brokers measured this way differ by more than that.

Then each Apache Kafka of --peers the same way, a pair at a time after kbroker's: one broker without an authorizer
and one with Kafka's own (3.x on ZooKeeper: kafka.security.authorizer.AclAuthorizer; 4.x on KRaft:
org.apache.kafka.metadata.authorizer.StandardAuthorizer), the same 200 ACLs, allow.everyone.if.no.acl.found and
no super user for the clients. StandardAuthorizer refuses every principal but a super user until it has loaded the
metadata log, so the KRaft pair's controller listener authenticates the node to itself with SASL/PLAIN as
User:controller, the one super user; the clients' PLAINTEXT principal stays ANONYMOUS, under the ACLs. Both brokers
of a pair get the same listeners, so the authorizer is their only difference. Each JVM first serves an untimed
half-size pass of both loops (JIT compilation would otherwise be most of the first repetition). Tansu has no
authorizer to configure here: not run."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable

from bench import clients
from bench.harness import Ctx, KafkaTarget, KBroker, Row, Target, med, payloads, start_peer

# allow.everyone.if.no.acl.found lets the bench (ANONYMOUS, no SASL) write the first ACLs; every resource the
# measured requests touch has ACLs, so each decision goes through the ACL match, not the empty-ACL shortcut.
AUTHZ = {"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer", "allow.everyone.if.no.acl.found": "true"}
SMALL_REQUESTS = {"linger.ms": 0, "batch.num.messages": 1, "max.in.flight.requests.per.connection": 1,
                  "acks": 1, "enable.idempotence": False}
NTOPICS = 8
ACL_AUTHORIZER = "kafka.security.authorizer.AclAuthorizer"
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
CONTROLLER_USER, CONTROLLER_PASSWORD = "controller", "controller-secret"


def cpu_at_most(baseline: Row, factor: float) -> Callable[[Row], bool | None]:
    """The best repetition against the best: on a shared machine other processes only ever add CPU time (cache
    misses, preemption), so the minimum is the estimate least disturbed by them."""
    def chk(r: Row) -> bool | None:
        if not r.kb_cpu_us or not baseline.kb_cpu_us:
            return None
        return min(r.kb_cpu_us) <= factor * min(baseline.kb_cpu_us)

    return chk


def kafka_overrides(props: dict[str, str], authorizer: bool) -> dict[str, str]:
    """server.properties overrides for a single-node KafkaPeer with `props`: on KRaft, the controller listener on
    SASL/PLAIN as the super user User:controller (both brokers of a pair, so the listeners match); with
    `authorizer`, Kafka's authorizer of that mode, allowing what no ACL names (as kbroker's run)."""
    kraft = "controller.listener.names" in props
    out: dict[str, str] = {}
    if kraft:
        protocols = dict(kv.split(":", 1) for kv in props["listener.security.protocol.map"].split(","))
        protocols["CONTROLLER"] = "SASL_PLAINTEXT"
        out |= {
            "listener.security.protocol.map": ",".join(f"{k}:{v}" for k, v in protocols.items()),
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            # The node is both ends of its controller connection: the client side logs in with username/password,
            # the server side checks them against user_controller.
            "listener.name.controller.plain.sasl.jaas.config":
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'username="{CONTROLLER_USER}" password="{CONTROLLER_PASSWORD}" '
                f'user_{CONTROLLER_USER}="{CONTROLLER_PASSWORD}";',
        }
    if authorizer:
        out |= {"authorizer.class.name": STANDARD_AUTHORIZER if kraft else ACL_AUTHORIZER,
                "allow.everyone.if.no.acl.found": "true"}
        if kraft:
            out["super.users"] = f"User:{CONTROLLER_USER}"
    return out


def _grant(kb: Target, topics_prefix: str) -> None:
    """ANONYMOUS (the bench clients) may create, write and describe the bench topics; 196 other ACLs sit beside."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": kb.bootstrap, "log_level": 3})
    prefixed, literal = ResourcePatternType.PREFIXED, ResourcePatternType.LITERAL
    allow = AclPermissionType.ALLOW
    acls = [AclBinding(ResourceType.TOPIC, topics_prefix, prefixed, "User:ANONYMOUS", "*", op, allow)
            for op in (AclOperation.WRITE, AclOperation.READ, AclOperation.CREATE)]
    acls.append(AclBinding(ResourceType.BROKER, "kafka-cluster", literal, "User:ANONYMOUS", "*",
                           AclOperation.ALL, allow))
    acls += [AclBinding(ResourceType.TOPIC, f"other-{i}", literal, f"User:user-{i % 20}", "*",
                        AclOperation.READ, allow) for i in range(196)]
    for f in admin.create_acls(acls).values():
        f.result(30)
    _wait_acls(admin, len(acls))


def _wait_acls(admin: object, count: int, timeout: float = 60.0) -> None:
    """Until DescribeAcls shows all `count`: Kafka's authorizer learns new ACLs asynchronously (a ZooKeeper
    notification, the KRaft metadata log), and DescribeAcls answers from the authorizer's own cache."""
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    any_acl = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                               AclPermissionType.ANY)
    deadline = time.monotonic() + timeout
    while True:
        seen = len(admin.describe_acls(any_acl).result(30))  # type: ignore[attr-defined]
        if seen >= count:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {seen} of {count} ACLs visible after {timeout:.0f} s")
        time.sleep(0.2)


def _metadata_requests(bootstrap: str, topics: list[str], count: int) -> float:
    """count Metadata v12 requests for the topics, one at a time on one connection; returns the seconds."""
    from kbroker.protocol import codec
    from kbroker.protocol.messages import MetadataRequest, RequestHeader

    req = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=t) for t in topics],
                          allow_auto_topic_creation=False)
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        t0 = time.perf_counter()
        for cid in range(count):
            header = RequestHeader(request_api_key=3, request_api_version=12, correlation_id=cid, client_id="bench")
            sock.sendall(codec.encode_request(header, req))
            (size,) = struct.unpack(">i", _recv(sock, 4))
            _, resp = codec.decode_response(3, 12, _recv(sock, size))
            if any(t.error_code for t in resp.topics):
                raise RuntimeError(f"Metadata answered {[t.error_code for t in resp.topics]}")
        return time.perf_counter() - t0


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        buf += chunk
    return bytes(buf)


def _loops(ctx: Ctx, t: Target, topics: list[str], n: int, values: list[bytes], prow: Row | None,
           mrow: Row | None, what: str) -> None:
    """The two measured loops on one broker; rows None: an untimed warm-up pass."""
    c0 = t.cpu()
    secs, left = clients.produce(t.bootstrap, [(topics[0], 0)], n, values, SMALL_REQUESTS, 180)
    cpu = t.cpu() - c0
    c0 = t.cpu()
    msecs = _metadata_requests(t.bootstrap, topics, n)
    mcpu = t.cpu() - c0
    if prow is not None and mrow is not None:
        if left:
            prow.note += f" {t.name} {what}: {left} undelivered;"
        prow.add(t, n / secs if not left else float("nan"), cpu * 1e6 / n)
        mrow.add(t, n / msecs, mcpu * 1e6 / n)
    ctx.log(f"  authz {what} {t.name}: produce {n / secs:,.0f} req/s, {cpu * 1e6 / n:.1f} us CPU/req; "
            f"Metadata {n / msecs:,.0f} req/s, {mcpu * 1e6 / n:.1f} us CPU/req")


def _measure_pair(ctx: Ctx, plain: Target, authz: Target, rows: tuple[Row, Row, Row, Row], n: int,
                  values: list[bytes], warm_up: bool) -> None:
    """Every repetition on both brokers of a pair, alternating which goes first; then their peak RSS."""
    produce_base, produce_authz, meta_base, meta_authz = rows
    if warm_up:
        topics = [f"bench-authz-warm-{k}" for k in range(NTOPICS)]
        for t in (plain, authz):
            t.create_topics(topics, partitions=1)
            _loops(ctx, t, topics, max(1, n // 2), values, None, None,
                   f"warm-up {'with' if t is authz else 'without'} authorizer")
    for rep in range(ctx.reps):
        if ctx.out_of_time(f"authz {plain.name} rep {rep + 1}"):
            break
        topics = [f"bench-authz-r{rep}-{k}" for k in range(NTOPICS)]
        for t in (plain, authz):
            t.create_topics(topics, partitions=1)
        order = [(plain, produce_base, meta_base), (authz, produce_authz, meta_authz)]
        # Alternate which broker goes first: the machine's load drifts, and both should see the same drift.
        for t, prow, mrow in order if rep % 2 == 0 else order[::-1]:
            _loops(ctx, t, topics, n, values, prow, mrow,
                   f"rep {rep + 1} {'with' if t is authz else 'without'} authorizer")
    for r in (produce_base, meta_base):
        r.add_rss(plain)
    for r in (produce_authz, meta_authz):
        r.add_rss(authz)


def _kafka_pair(ctx: Ctx, key: str) -> tuple[Target, Target] | None:
    """A --peers Apache Kafka without and with its authorizer (ACLs granted), or None (noted) if it cannot run."""

    def configure(authorizer: bool) -> Callable[[Target], None]:
        def apply(t: Target) -> None:
            if not isinstance(t, KafkaTarget):
                raise RuntimeError("no ACL authorizer configured for it here (the authz rows are kbroker's and "
                                   "Apache Kafka's)")
            t.peer.overrides.update(kafka_overrides(t.peer.properties(), authorizer))

        return apply

    plain = start_peer(ctx, key, configure(False), " (authz baseline)")
    if plain is None:
        return None
    kind = STANDARD_AUTHORIZER if isinstance(plain, KafkaTarget) and plain.peer.mode == "kraft" else ACL_AUTHORIZER
    authz = start_peer(ctx, key, configure(True), f" ({kind.rsplit('.', 1)[1]})")
    if authz is None:
        plain.stop()
        return None
    try:
        _grant(authz, "bench-")
    except Exception as e:  # noqa: BLE001 - a peer that would not take the ACLs: noted, the others go on
        ctx.extra.setdefault("unavailable", {})[f"{authz.name} (authz)"] = f"ACLs not granted: {e}"
        ctx.log(f"  [{authz.name}: ACLs not granted: {e}]")
        plain.stop()
        authz.stop()
        return None
    return plain, authz


def _cpu_note(row: Row, base: Row, authorizers: dict[str, str]) -> str:
    """Each broker's CPU per request with its authorizer over its own baseline's: medians and best repetitions."""
    note = ""
    a, b = med(row.kb_cpu_us), med(base.kb_cpu_us)
    if a is not None and b:
        note += (f" CPU per request {a / b:.3f}x the baseline's (medians), "
                 f"{min(row.kb_cpu_us) / min(base.kb_cpu_us):.3f}x (best repetitions);")
    for name, xs in row.others_cpu_us.items():
        ys = base.others_cpu_us.get(name, [])
        oa, ob = med(xs), med(ys)
        if oa is not None and ob:
            note += (f" {name} ({authorizers.get(name, '?')}): {oa / ob:.3f}x its baseline's (medians), "
                     f"{min(xs) / min(ys):.3f}x (best);")
    return note


def run(ctx: Ctx) -> list[Row]:
    n = ctx.n(20_000, 10_000)
    values = payloads(100)
    produce_base = Row("produce 100 B, one message per request, no authorizer (baseline)", "msg/s",
                       target="(baseline)")
    produce_authz = Row("produce 100 B, one message per request, ACL authorizer (200 ACLs)", "msg/s",
                        target="CPU/request <= 1.05x baseline (best reps)", check=cpu_at_most(produce_base, 1.05))
    meta_base = Row("Metadata of 8 topics, no authorizer (baseline)", "req/s", target="(baseline)")
    meta_authz = Row("Metadata of 8 topics, ACL authorizer (200 ACLs)", "req/s",
                     target="CPU/request <= 1.05x baseline (best reps)", check=cpu_at_most(meta_base, 1.05))
    rows = (produce_base, produce_authz, meta_base, meta_authz)
    plain, authz = KBroker(ctx.base), KBroker(ctx.base, AUTHZ)
    try:
        plain.start()
        authz.start()
        _grant(authz, "bench-")
        _measure_pair(ctx, plain, authz, rows, n, values, warm_up=False)
    finally:
        plain.stop()
        authz.stop()
    # Apache Kafka afterwards, one pair at a time: kbroker's figures are taken as before, with no JVM beside them.
    authorizers: dict[str, str] = {}
    for key in ctx.extra.get("peers", []):
        if ctx.out_of_time(f"authz {key}"):
            break
        pair = _kafka_pair(ctx, key)
        if pair is None:
            continue
        kplain, kauthz = pair
        assert isinstance(kplain, KafkaTarget)
        authorizers[kplain.name] = (STANDARD_AUTHORIZER if kplain.peer.mode == "kraft" else ACL_AUTHORIZER
                                    ).rsplit(".", 1)[1]
        try:
            _measure_pair(ctx, kplain, kauthz, rows, n, values, warm_up=True)
        except Exception as e:  # noqa: BLE001 - a peer's failure is its cells' note, not the lost workload
            for r in rows:
                r.note += f" {kplain.name}: {type(e).__name__}: {str(e)[:200]};"
            ctx.log(f"  authz {kplain.name}: failed: {type(e).__name__}: {e}")
        finally:
            kplain.stop()
            kauthz.stop()
    for base, row in ((produce_base, produce_authz), (meta_base, meta_authz)):
        row.note += _cpu_note(row, base, authorizers)
    return [produce_base, produce_authz, meta_base, meta_authz]

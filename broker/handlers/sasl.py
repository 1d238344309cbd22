"""SaslHandshake (17) and SaslAuthenticate (36) after authentication, DescribeUserScramCredentials (50) and
AlterUserScramCredentials (51).

Before a connection has authenticated its SASL requests never get here: broker/security/sasl.py answers them.
Here they are what Kafka's KafkaApis answers: ILLEGAL_SASL_STATE (a PLAINTEXT or SSL listener, or a second
authentication without re-authentication).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Coroutine
from typing import Any

from kbroker.broker.apis import ApiHandler, RequestContext
from kbroker.broker.security import scram
from kbroker.broker.security.acls import AclOperation, ResourceType
from kbroker.broker.security.credentials import CredentialChanges
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)


def handle_sasl_handshake(ctx: RequestContext, req: SaslHandshakeRequest) -> SaslHandshakeResponse:
    ctx.refused(ErrorCode.ILLEGAL_SASL_STATE, "SaslHandshake outside SASL authentication")
    return SaslHandshakeResponse(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=[])


def handle_sasl_authenticate(ctx: RequestContext, req: SaslAuthenticateRequest) -> SaslAuthenticateResponse:
    message = "SaslAuthenticate request received after successful authentication"
    ctx.refused(ErrorCode.ILLEGAL_SASL_STATE, message)
    return SaslAuthenticateResponse(error_code=ErrorCode.ILLEGAL_SASL_STATE, error_message=message)


def handle_describe_user_scram_credentials(ctx: RequestContext, req: DescribeUserScramCredentialsRequest
                                           ) -> DescribeUserScramCredentialsResponse:
    R = DescribeUserScramCredentialsResponse
    if not ctx.authorized(AclOperation.DESCRIBE, ResourceType.CLUSTER):
        # Kafka's getErrorResponse: one result per user named, its user name left unset ("").
        why = "Not authorized to describe SCRAM credentials"
        return R(throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=why,
                 results=[R.DescribeUserScramCredentialsResult(
                     user="", error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=why)
                     for _ in req.users or ()])
    stored = ctx.server.scram_credentials.credentials
    if not req.users:
        wanted = sorted(stored)
        counts: Counter[str] = Counter()
    else:
        wanted = [u.name for u in req.users]
        counts = Counter(wanted)
    results = []
    for user in dict.fromkeys(wanted):
        result = R.DescribeUserScramCredentialsResult(user=user, error_code=0, error_message=None)
        if counts[user] > 1:
            result.error_code = ErrorCode.DUPLICATE_RESOURCE
            result.error_message = "Cannot describe SCRAM credentials for the same user twice in a single request"
        elif user not in stored:
            result.error_code = ErrorCode.RESOURCE_NOT_FOUND
            result.error_message = "Attempt to describe a user credential that does not exist"
        else:
            result.credential_infos = [
                R.CredentialInfo(mechanism=scram.MECHANISM_ID_OF[m], iterations=c.iterations)
                for m, c in sorted(stored[user].items())
            ]
        results.append(result)
    return R(throttle_time_ms=0, error_code=0, error_message=None, results=results)


def validate_scram_alterations(req: AlterUserScramCredentialsRequest,
                               stored: dict[str, dict[str, scram.ScramCredential]]
                               ) -> tuple[dict[str, tuple[ErrorCode, str]], CredentialChanges]:
    """Kafka's ZkAdminManager.alterUserScramCredentials checks, in its order: (errors by user, changes of the valid
    users). Illegal upsertions and deletions first (a user's last; an upsertion's wins over a deletion's), then a user
    credential named twice among the rest, then deletions of credentials that do not exist."""
    def illegal(user: str, mechanism_id: int, iterations: int | None) -> tuple[ErrorCode, str] | None:
        if not user:
            return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
        if mechanism_id not in scram.MECHANISM_IDS:
            return ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"
        if iterations is not None and iterations < scram.MIN_ITERATIONS:
            return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too few iterations"
        if iterations is not None and iterations > scram.MAX_ITERATIONS:
            return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too many iterations"
        return None

    by_upsertion: dict[str, tuple[ErrorCode, str]] = {}
    for u in req.upsertions:
        e = illegal(u.name, u.mechanism, u.iterations)
        if e is not None:
            by_upsertion[u.name] = e  # Kafka maps user -> error: the last one wins
    by_deletion: dict[str, tuple[ErrorCode, str]] = {}
    for d in req.deletions:
        e = illegal(d.name, d.mechanism, None)
        if e is not None:
            by_deletion[d.name] = e
    errors: dict[str, tuple[ErrorCode, str]] = {**by_deletion, **by_upsertion}
    pairs = Counter([(u.name, u.mechanism) for u in req.upsertions if u.name not in errors]
                    + [(d.name, d.mechanism) for d in req.deletions if d.name not in errors])
    for (user, _), n in pairs.items():
        if n > 1:
            errors[user] = (ErrorCode.DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request")
    changes: CredentialChanges = {}
    for d in req.deletions:
        if d.name in errors:
            continue
        mechanism = scram.MECHANISM_IDS[d.mechanism]
        if mechanism not in stored.get(d.name, {}):
            errors[d.name] = (ErrorCode.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist")
            continue
        changes.setdefault(d.name, {})[mechanism] = None
    for u in req.upsertions:
        if u.name in errors:
            continue
        if not u.salt or not u.salted_password:
            errors[u.name] = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Salt and salted password must not be empty")
            continue
        mechanism = scram.MECHANISM_IDS[u.mechanism]
        changes.setdefault(u.name, {})[mechanism] = scram.credential_from_salted(
            mechanism, u.salted_password, u.salt, u.iterations)
    return errors, {user: c for user, c in changes.items() if user not in errors}


def handle_alter_user_scram_credentials(ctx: RequestContext, req: AlterUserScramCredentialsRequest
                                        ) -> Coroutine[Any, Any, AlterUserScramCredentialsResponse]:
    R = AlterUserScramCredentialsResponse
    store = ctx.server.scram_credentials
    errors, changes = validate_scram_alterations(req, store.credentials)
    users = list(dict.fromkeys([d.name for d in req.deletions] + [u.name for u in req.upsertions]))
    if not ctx.authorized(AclOperation.ALTER, ResourceType.CLUSTER):
        # Kafka checks Alter on the cluster before anything else: every user gets the refusal.
        denied = (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Not authorized to alter SCRAM credentials")
        errors, changes = {user: denied for user in users}, {}
    for user, (code, message) in errors.items():
        ctx.refused(code, message, f"user {user!r}")

    async def apply() -> AlterUserScramCredentialsResponse:
        failure: tuple[int, str] | None = None
        if changes:
            try:
                await asyncio.wrap_future(ctx.server.io_pool.submit(store.alter, changes))
            except Exception as e:  # noqa: BLE001  (ZooKeeper unreachable, disk full: every change of this request failed)
                failure = (getattr(e, "code", ErrorCode.UNKNOWN_SERVER_ERROR), str(e) or type(e).__name__)
        results = []
        for user in users:
            code, message = errors.get(user, (ErrorCode.NONE, None))
            if user in changes and failure is not None:
                code, message = failure  # type: ignore[assignment]
            results.append(R.AlterUserScramCredentialsResult(user=user, error_code=code, error_message=message))
        return R(throttle_time_ms=0, results=results)

    return apply()


HANDLERS = [
    ApiHandler(17, 0, 1, handle_sasl_handshake),
    ApiHandler(36, 0, 2, handle_sasl_authenticate),
    ApiHandler(50, 0, 0, handle_describe_user_scram_credentials),
    ApiHandler(51, 0, 0, handle_alter_user_scram_credentials),
]

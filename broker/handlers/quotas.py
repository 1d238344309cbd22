"""DescribeClientQuotas (48) and AlterClientQuotas (49): byte-rate quotas per client id."""

from __future__ import annotations

import math

from kbroker.broker.apis import ApiHandler, RequestContext
from kbroker.broker.quotas import KNOWN_KEYS, SUPPORTED_KEYS
from kbroker.broker.security.acls import AclOperation, ResourceType
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)

CLIENT_ID = "client-id"
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2


def _matches(entity: str | None, components: list[DescribeClientQuotasRequest.ComponentData]) -> bool:
    for c in components:
        if c.entity_type != CLIENT_ID:
            return False  # only client-id entities exist here
        if c.match_type == MATCH_EXACT and entity != c.match:
            return False
        if c.match_type == MATCH_DEFAULT and entity is not None:
            return False
        if c.match_type == MATCH_SPECIFIED and entity is None:
            return False
    return True


def handle_describe_client_quotas(ctx: RequestContext, req: DescribeClientQuotasRequest) -> DescribeClientQuotasResponse:
    R = DescribeClientQuotasResponse
    if not ctx.authorized(AclOperation.DESCRIBE_CONFIGS, ResourceType.CLUSTER):
        return R(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=None, entries=None)
    for c in req.components:
        if c.match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED):
            # Kafka 3.9 fails building the filter (IllegalArgumentException): UNKNOWN_SERVER_ERROR, not a 42.
            ctx.refused(ErrorCode.UNKNOWN_SERVER_ERROR, f"unknown match type {c.match_type}")
            return R(error_code=ErrorCode.UNKNOWN_SERVER_ERROR, error_message=f"unknown match type {c.match_type}",
                     entries=None)
    types = [c.entity_type for c in req.components]
    if len(set(types)) != len(types):
        ctx.refused(ErrorCode.INVALID_REQUEST, "duplicate entity type in filter")
        return R(error_code=ErrorCode.INVALID_REQUEST, error_message="duplicate entity type in filter", entries=None)
    entries = [
        R.EntryData(
            entity=[R.EntityData(entity_type=CLIENT_ID, entity_name=entity)],
            values=[R.ValueData(key=k, value=v) for k, v in sorted(values.items())],
        )
        for entity, values in sorted(ctx.server.metadata.client_quotas.items(), key=lambda kv: kv[0] or "")
        if _matches(entity, req.components)
    ]
    return R(error_code=0, error_message=None, entries=entries)


def handle_alter_client_quotas(ctx: RequestContext, req: AlterClientQuotasRequest) -> AlterClientQuotasResponse:
    R = AlterClientQuotasResponse
    store = ctx.server.metadata
    allowed = ctx.authorized(AclOperation.ALTER_CONFIGS, ResourceType.CLUSTER)
    # Kafka reads an entity as a map by entity type (a type named twice: the last name) and answers a map by
    # entity, so an entity altered twice in one request is answered once, with its last outcome.
    out: dict[frozenset[tuple[str, str | None]], AlterClientQuotasResponse.EntryData] = {}
    refused: list[AlterClientQuotasResponse.EntryData] = []
    for entry in req.entries:
        entity = {e.entity_type: e.entity_name for e in entry.entity}
        entity_data = [R.EntityData(entity_type=t, entity_name=n) for t, n in entity.items()]
        result = R.EntryData(error_code=0, error_message=None, entity=entity_data)
        if not allowed:
            # Kafka's getErrorResponse: every entry as named (only its entity read as a map).
            result.error_code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            refused.append(result)
            continue
        key = frozenset(entity.items())
        out.pop(key, None)
        out[key] = result
        if len(entity) != 1 or CLIENT_ID not in entity:
            result.error_code = ErrorCode.INVALID_REQUEST
            result.error_message = "kbroker supports quotas for client-id entities only"
            ctx.refused(result.error_code, result.error_message)
            continue
        name = entity[CLIENT_ID]
        values = dict(store.client_quotas.get(name, {}))
        problem = None
        for op in entry.ops:
            if op.key not in KNOWN_KEYS:
                problem = f"Invalid configuration key {op.key}"
            elif op.key not in SUPPORTED_KEYS:
                problem = f"Quota {op.key} is not supported by kbroker"
            elif op.remove:
                values.pop(op.key, None)
            elif not math.isfinite(op.value) or op.value <= 0:
                problem = f"Quota {op.key} must be a positive number, not {op.value}"
            else:
                values[op.key] = op.value
            if problem:
                break
        if problem:
            result.error_code = ErrorCode.INVALID_REQUEST
            result.error_message = problem
            ctx.refused(result.error_code, problem, f"client-id {name!r}")
            continue
        if not req.validate_only:
            try:
                store.set_client_quotas(name, values)
            except Exception as e:  # noqa: BLE001 - e.g. ZooKeeper unreachable
                result.error_code = getattr(e, "code", ErrorCode.UNKNOWN_SERVER_ERROR)
                result.error_message = str(e)
    return R(throttle_time_ms=0, entries=refused + list(out.values()))


HANDLERS = [
    ApiHandler(48, 0, 1, handle_describe_client_quotas),
    ApiHandler(49, 0, 1, handle_alter_client_quotas),
]

"""InitProducerId (key 22): producer ids for idempotent producers; transactional producers get theirs
from the transaction coordinator, which also fences older epochs of the same transactional id."""

from __future__ import annotations

import asyncio
import logging

from kbroker.broker.apis import ApiHandler, RequestContext
from kbroker.broker.handlers.txn import abortable_error, fenced_error
from kbroker.broker.security.acls import AclOperation, ResourceType
from kbroker.coordinator.producer_ids import ProducerIdsExhausted
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import InitProducerIdRequest, InitProducerIdResponse

log = logging.getLogger("kbroker.producer")


async def handle_init_producer_id(ctx: RequestContext, req: InitProducerIdRequest) -> InitProducerIdResponse:
    if ctx.server.authorizer is not None:
        code = _authorize(ctx, req.transactional_id)
        if code != ErrorCode.NONE:
            return InitProducerIdResponse(error_code=code, producer_id=-1, producer_epoch=-1)
    if (req.producer_id == -1) != (req.producer_epoch == -1):
        # Kafka's KafkaApis: a producer id without an epoch, or an epoch without an id, is INVALID_REQUEST.
        return InitProducerIdResponse(error_code=ErrorCode.INVALID_REQUEST, producer_id=-1, producer_epoch=-1)
    if req.transactional_id is not None:
        return await _init_transactional(ctx, req)
    loop = asyncio.get_running_loop()
    try:
        # Idempotent producers without a transactional id always get a fresh id at epoch 0.
        pid = await loop.run_in_executor(ctx.server.io_pool, ctx.server.producer_ids.generate)
    except ProducerIdsExhausted as e:
        log.error("InitProducerId failed: %s", e)
        return InitProducerIdResponse(error_code=ErrorCode.UNKNOWN_SERVER_ERROR, producer_id=-1, producer_epoch=-1)
    except Exception:
        log.exception("InitProducerId could not claim a producer id block")
        return InitProducerIdResponse(error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE, producer_id=-1,
                                      producer_epoch=-1)
    return InitProducerIdResponse(error_code=0, producer_id=pid, producer_epoch=0)


def _authorize(ctx: RequestContext, transactional_id: str | None) -> ErrorCode:
    """Kafka's KafkaApis.handleInitProducerIdRequest: Write on the transactional id; without one, IdempotentWrite
    on the cluster or Write on at least one topic (KIP-679: any producer allowed to write may be idempotent)."""
    if transactional_id is not None:
        if not ctx.authorized(AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id):
            return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        return ErrorCode.NONE
    authz = ctx.server.authorizer
    assert authz is not None
    if (ctx.authorized(AclOperation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, log_denied=False)
            or authz.authorize_by_resource_type(ctx.conn.principal, ctx.client_host, AclOperation.WRITE,
                                                ResourceType.TOPIC)):
        return ErrorCode.NONE
    ctx.refused(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                f"{ctx.conn.principal} has neither IdempotentWrite on the cluster nor Write on any topic")
    return ErrorCode.CLUSTER_AUTHORIZATION_FAILED


async def _init_transactional(ctx: RequestContext, req: InitProducerIdRequest) -> InitProducerIdResponse:
    assert req.transactional_id is not None
    if req.transactional_id == "":
        return InitProducerIdResponse(error_code=ErrorCode.INVALID_REQUEST, producer_id=-1, producer_epoch=-1)
    tc = ctx.server.txn_coordinator
    expected_id, expected_epoch = (req.producer_id, req.producer_epoch) if ctx.api_version >= 3 else (-1, -1)
    code, pid, epoch = await tc.call(tc.init_producer_id, req.transactional_id, req.transaction_timeout_ms,
                                     expected_id, expected_epoch)
    code = abortable_error(fenced_error(code, ctx.api_version, 4), ctx.api_version, 5)
    if code != ErrorCode.NONE:
        pid, epoch = -1, -1
    return InitProducerIdResponse(error_code=code, producer_id=pid, producer_epoch=epoch)


HANDLERS = [ApiHandler(22, 0, 5, handle_init_producer_id)]

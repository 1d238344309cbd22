"""InitProducerId (key 22): producer ids for idempotent producers."""

from __future__ import annotations

import asyncio
import logging

from broker.apis import ApiHandler, RequestContext
from coordinator.producer_ids import ProducerIdsExhausted
from protocol.errors import ErrorCode
from protocol.messages import InitProducerIdRequest, InitProducerIdResponse

log = logging.getLogger("kbroker.producer")


async def handle_init_producer_id(ctx: RequestContext, req: InitProducerIdRequest) -> InitProducerIdResponse:
    if req.transactional_id is not None:
        # No transaction coordinator: a transactional producer is told the feature is missing.
        return InitProducerIdResponse(error_code=ErrorCode.UNSUPPORTED_VERSION, producer_id=-1, producer_epoch=-1)
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


HANDLERS = [ApiHandler(22, 0, 5, handle_init_producer_id)]

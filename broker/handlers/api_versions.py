"""ApiVersions (key 18)."""

from __future__ import annotations

from kbroker.broker.apis import ApiHandler, RequestContext
from kbroker.protocol.messages import ApiVersionsRequest, ApiVersionsResponse


def handle_api_versions(ctx: RequestContext, req: ApiVersionsRequest) -> ApiVersionsResponse:
    return ApiVersionsResponse(error_code=0, api_keys=ctx.server.apis.api_version_list())


HANDLERS = [ApiHandler(18, 0, 4, handle_api_versions)]

"""ApiVersions (key 18)."""

from __future__ import annotations

from broker.apis import ApiHandler, RequestContext
from protocol.messages import ApiVersionsRequest, ApiVersionsResponse


def handle_api_versions(ctx: RequestContext, req: ApiVersionsRequest) -> ApiVersionsResponse:
    if ctx.api_version >= 3:
        ctx.conn.client_software = (req.client_software_name, req.client_software_version)
    return ApiVersionsResponse(error_code=0, api_keys=ctx.server.apis.api_version_list())


HANDLERS = [ApiHandler(18, 0, 4, handle_api_versions)]

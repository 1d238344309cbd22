"""DescribeAcls (29), CreateAcls (30), DeleteAcls (31): Kafka's AclApis over broker.security.AclAuthorizer.

Without `authorizer.class.name` every one answers SECURITY_DISABLED, as Kafka does. Store writes (ZooKeeper
or the embedded file) run on the I/O pool, never on a processor's loop.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

from kbroker.broker.apis import ApiHandler, RequestContext
from kbroker.broker.network import CloseConnection
from kbroker.broker.security.acls import (
    AccessControlEntry,
    AclBindingFilter,
    AclOperation,
    PatternType,
    ResourcePattern,
    ResourceType,
    binding_problem,
    operation,
    pattern_type,
    permission,
    resource_type,
)
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    CreateAclsRequest,
    CreateAclsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
)

NO_AUTHORIZER = "No Authorizer is configured."
NOT_AUTHORIZED = "Request is not authorized for this cluster operation."


# Kafka's UNKNOWN code of ResourceType, PatternType, AclOperation and AclPermissionType; ANY and LITERAL patterns.
_UNKNOWN, _ANY, _LITERAL = 0, 1, 3


def _refuse_unparsable(version: int, patterns: list[int], others: list[int], what: str) -> None:
    """Kafka validates ACL requests while parsing them (CreateAclsRequest.validate, DeleteAclsRequest and
    DescribeAclsRequest.normalizeAndValidate): v0 takes only LITERAL patterns (ANY too in a filter, read as LITERAL),
    and no version takes an UNKNOWN (0) code. A request failing that cannot be parsed, so its connection is closed
    before authorization or the authorizer's absence are looked at."""
    if version == 0 and any(p != _LITERAL for p in patterns):
        raise CloseConnection(f"{what} v0 only supports literal resource pattern types")
    if _UNKNOWN in patterns or _UNKNOWN in others:
        raise CloseConnection(f"{what} contains UNKNOWN elements")


def _filter(rtype: int, name: str | None, ptype: int, principal: str | None, host: str | None, op: int,
            perm: int) -> AclBindingFilter:
    return AclBindingFilter(resource_type(rtype), name, pattern_type(ptype), principal, host, operation(op),
                            permission(perm))


def handle_describe_acls(ctx: RequestContext, req: DescribeAclsRequest) -> DescribeAclsResponse:
    R = DescribeAclsResponse
    if ctx.api_version == 0 and req.pattern_type_filter == _ANY:
        req.pattern_type_filter = _LITERAL
    _refuse_unparsable(ctx.api_version, [req.pattern_type_filter],
                       [req.resource_type_filter, req.operation, req.permission_type], "DescribeAclsRequest")
    if not ctx.authorized(AclOperation.DESCRIBE, ResourceType.CLUSTER):
        return R(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=NOT_AUTHORIZED, resources=[])
    authz = ctx.server.authorizer
    if authz is None:
        ctx.refused(ErrorCode.SECURITY_DISABLED, NO_AUTHORIZER)
        return R(error_code=ErrorCode.SECURITY_DISABLED, error_message=NO_AUTHORIZER, resources=[])
    flt = _filter(req.resource_type_filter, req.resource_name_filter, req.pattern_type_filter, req.principal_filter,
                  req.host_filter, req.operation, req.permission_type)
    if flt.is_unknown():
        message = "The ACL filter contains UNKNOWN elements"
        ctx.refused(ErrorCode.INVALID_REQUEST, message)
        return R(error_code=ErrorCode.INVALID_REQUEST, error_message=message, resources=[])
    by_pattern: dict[ResourcePattern, list[AccessControlEntry]] = defaultdict(list)
    for pattern, entry in authz.acls(flt):
        by_pattern[pattern].append(entry)
    resources = [
        R.DescribeAclsResource(
            resource_type=p.resource_type, resource_name=p.name, pattern_type=p.pattern_type,
            acls=[R.AclDescription(principal=e.principal, host=e.host, operation=e.operation,
                                   permission_type=e.permission)
                  for e in sorted(entries, key=lambda e: (e.principal, e.host, e.operation, e.permission))],
        )
        for p, entries in sorted(by_pattern.items(), key=lambda kv: str(kv[0]))
    ]
    return R(error_code=0, error_message=None, resources=resources)


async def handle_create_acls(ctx: RequestContext, req: CreateAclsRequest) -> CreateAclsResponse:
    R = CreateAclsResponse
    _refuse_unparsable(ctx.api_version, [c.resource_pattern_type for c in req.creations],
                       [v for c in req.creations for v in (c.resource_type, c.operation, c.permission_type)],
                       "CreateAclsRequest")
    if not ctx.authorized(AclOperation.ALTER, ResourceType.CLUSTER):
        return R(results=[R.AclCreationResult(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                               error_message=NOT_AUTHORIZED) for _ in req.creations])
    authz = ctx.server.authorizer
    if authz is None:
        ctx.refused(ErrorCode.SECURITY_DISABLED, NO_AUTHORIZER)
        return R(results=[R.AclCreationResult(error_code=ErrorCode.SECURITY_DISABLED, error_message=NO_AUTHORIZER)
                          for _ in req.creations])
    results: list[CreateAclsResponse.AclCreationResult] = []
    valid: list[tuple[int, ResourcePattern, AccessControlEntry]] = []
    for i, c in enumerate(req.creations):
        pattern = ResourcePattern(resource_type(c.resource_type), c.resource_name, pattern_type(c.resource_pattern_type))
        entry = AccessControlEntry(c.principal, c.host, operation(c.operation), permission(c.permission_type))
        results.append(R.AclCreationResult(error_code=0, error_message=None))
        if ctx.api_version == 0 and pattern.pattern_type != PatternType.LITERAL:
            problem: str | None = "Version 0 only supports literal resource pattern types"
        else:
            problem = binding_problem(pattern, entry)
        if problem:
            results[i].error_code = ErrorCode.INVALID_REQUEST
            results[i].error_message = problem
            ctx.refused(ErrorCode.INVALID_REQUEST, problem, str(pattern))
            continue
        valid.append((i, pattern, entry))
    if valid:
        loop = asyncio.get_running_loop()
        outcome = await loop.run_in_executor(ctx.server.io_pool, authz.create_acls,
                                             [(p, e) for _, p, e in valid])
        for i, pattern, _ in valid:
            error = outcome.get(pattern)
            if error is not None:
                results[i].error_code = ErrorCode.UNKNOWN_SERVER_ERROR
                results[i].error_message = error
    return R(results=results)


async def handle_delete_acls(ctx: RequestContext, req: DeleteAclsRequest) -> DeleteAclsResponse:
    R = DeleteAclsResponse
    if ctx.api_version == 0:
        for f in req.filters:
            if f.pattern_type_filter == _ANY:
                f.pattern_type_filter = _LITERAL
    _refuse_unparsable(ctx.api_version, [f.pattern_type_filter for f in req.filters],
                       [v for f in req.filters for v in (f.resource_type_filter, f.operation, f.permission_type)],
                       "DeleteAclsRequest")
    if not ctx.authorized(AclOperation.ALTER, ResourceType.CLUSTER):
        return R(filter_results=[R.DeleteAclsFilterResult(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                                          error_message=NOT_AUTHORIZED, matching_acls=[])
                                 for _ in req.filters])
    authz = ctx.server.authorizer
    if authz is None:
        ctx.refused(ErrorCode.SECURITY_DISABLED, NO_AUTHORIZER)
        return R(filter_results=[R.DeleteAclsFilterResult(error_code=ErrorCode.SECURITY_DISABLED,
                                                          error_message=NO_AUTHORIZER, matching_acls=[])
                                 for _ in req.filters])
    results = [R.DeleteAclsFilterResult(error_code=0, error_message=None, matching_acls=[]) for _ in req.filters]
    filters: list[tuple[int, AclBindingFilter]] = []
    for i, f in enumerate(req.filters):
        flt = _filter(f.resource_type_filter, f.resource_name_filter, f.pattern_type_filter, f.principal_filter,
                      f.host_filter, f.operation, f.permission_type)
        if flt.is_unknown():
            results[i].error_code = ErrorCode.INVALID_REQUEST
            results[i].error_message = "The ACL filter contains UNKNOWN elements"
            ctx.refused(ErrorCode.INVALID_REQUEST, results[i].error_message)
            continue
        filters.append((i, flt))
    if filters:
        loop = asyncio.get_running_loop()
        deleted = await loop.run_in_executor(ctx.server.io_pool, authz.delete_acls, [f for _, f in filters])
        for (i, _), matches in zip(filters, deleted, strict=True):
            results[i].matching_acls = [
                R.DeleteAclsMatchingAcl(
                    error_code=0 if error is None else ErrorCode.UNKNOWN_SERVER_ERROR, error_message=error,
                    resource_type=p.resource_type, resource_name=p.name, pattern_type=p.pattern_type,
                    principal=e.principal, host=e.host, operation=e.operation, permission_type=e.permission,
                )
                for p, e, error in matches
            ]
    return R(filter_results=results)


HANDLERS = [
    ApiHandler(29, 0, 3, handle_describe_acls),
    ApiHandler(30, 0, 3, handle_create_acls),
    ApiHandler(31, 0, 3, handle_delete_acls),
]

"""Kafka's ACL vocabulary: resource patterns, access control entries, bindings and their filters.

Codes are those of org.apache.kafka.common.acl / .resource (the wire values of CreateAcls, DescribeAcls,
DeleteAcls and of authorized-operations bit fields); names are the ones Kafka writes into ZooKeeper.
Pure data and pure functions: no I/O, no locks.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class AclPermissionType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


CLUSTER_NAME = "kafka-cluster"
WILDCARD_RESOURCE = "*"
WILDCARD_PRINCIPAL = "User:*"
WILDCARD_HOST = "*"

# Kafka's SecurityUtils.resourceTypeName / operationName / permissionTypeName: the names of ZooKeeper paths
# and of the JSON documents under /kafka-acl.
RESOURCE_TYPE_NAMES: dict[ResourceType, str] = {
    ResourceType.TOPIC: "Topic", ResourceType.GROUP: "Group", ResourceType.CLUSTER: "Cluster",
    ResourceType.TRANSACTIONAL_ID: "TransactionalId", ResourceType.DELEGATION_TOKEN: "DelegationToken",
    ResourceType.USER: "User",
}
OPERATION_NAMES: dict[AclOperation, str] = {
    AclOperation.ALL: "All", AclOperation.READ: "Read", AclOperation.WRITE: "Write", AclOperation.CREATE: "Create",
    AclOperation.DELETE: "Delete", AclOperation.ALTER: "Alter", AclOperation.DESCRIBE: "Describe",
    AclOperation.CLUSTER_ACTION: "ClusterAction", AclOperation.DESCRIBE_CONFIGS: "DescribeConfigs",
    AclOperation.ALTER_CONFIGS: "AlterConfigs", AclOperation.IDEMPOTENT_WRITE: "IdempotentWrite",
    AclOperation.CREATE_TOKENS: "CreateTokens", AclOperation.DESCRIBE_TOKENS: "DescribeTokens",
}
PERMISSION_NAMES: dict[AclPermissionType, str] = {AclPermissionType.ALLOW: "Allow", AclPermissionType.DENY: "Deny"}

# AclEntry.supportedOperations: what authorized-operations bit fields are made of.
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[AclOperation, ...]] = {
    ResourceType.TOPIC: (AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE,
                         AclOperation.DELETE, AclOperation.ALTER, AclOperation.DESCRIBE_CONFIGS,
                         AclOperation.ALTER_CONFIGS),
    ResourceType.GROUP: (AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE),
    ResourceType.CLUSTER: (AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
                           AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
                           AclOperation.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (AclOperation.DESCRIBE, AclOperation.WRITE),
    ResourceType.DELEGATION_TOKEN: (AclOperation.DESCRIBE,),
    ResourceType.USER: (AclOperation.CREATE_TOKENS, AclOperation.DESCRIBE_TOKENS),
}

# AclAuthorizer: an ALLOW of any of these grants the key operation (Describe is implied by Read, Write,
# Delete and Alter; DescribeConfigs by AlterConfigs). DENY entries imply nothing.
IMPLIED_BY: dict[AclOperation, frozenset[AclOperation]] = {
    AclOperation.DESCRIBE: frozenset({AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE,
                                      AclOperation.DELETE, AclOperation.ALTER, AclOperation.ALL}),
    AclOperation.DESCRIBE_CONFIGS: frozenset({AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS,
                                              AclOperation.ALL}),
}


def java_host_address(ip: str) -> str:
    """An address as Java's InetAddress.getHostAddress writes it, which is what Kafka matches ACL hosts against:
    IPv6 in eight uncompressed groups (0:0:0:0:0:0:0:1), IPv4-mapped IPv6 as plain IPv4."""
    if ":" not in ip:
        return ip
    import ipaddress

    try:
        addr = ipaddress.IPv6Address(ip.split("%", 1)[0])
    except ValueError:
        return ip
    if addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return ":".join(f"{int(group, 16):x}" for group in addr.exploded.split(":"))


def bit_field(operations: list[AclOperation] | tuple[AclOperation, ...]) -> int:
    """Kafka's Utils.to32BitField."""
    out = 0
    for op in operations:
        out |= 1 << int(op)
    return out


@dataclass(frozen=True, slots=True)
class ResourcePattern:
    resource_type: ResourceType
    name: str
    pattern_type: PatternType

    def __str__(self) -> str:
        return f"{RESOURCE_TYPE_NAMES.get(self.resource_type, self.resource_type.name)}:{self.pattern_type.name}:{self.name}"


@dataclass(frozen=True, slots=True)
class AccessControlEntry:
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermissionType

    def __str__(self) -> str:
        return (f"{self.principal} has {PERMISSION_NAMES.get(self.permission, '?')} permission for operations: "
                f"{OPERATION_NAMES.get(self.operation, '?')} from hosts: {self.host}")


Acls = dict[ResourcePattern, frozenset[AccessControlEntry]]


def _enum(cls: type[IntEnum], code: int) -> Any:
    try:
        return cls(code)
    except ValueError:
        return cls(0)  # UNKNOWN, as Kafka's fromCode does


def resource_type(code: int) -> ResourceType:
    return _enum(ResourceType, code)  # type: ignore[no-any-return]


def pattern_type(code: int) -> PatternType:
    return _enum(PatternType, code)  # type: ignore[no-any-return]


def operation(code: int) -> AclOperation:
    return _enum(AclOperation, code)  # type: ignore[no-any-return]


def permission(code: int) -> AclPermissionType:
    return _enum(AclPermissionType, code)  # type: ignore[no-any-return]


def principal_problem(principal: str | None) -> str | None:
    """SecurityUtils.parseKafkaPrincipal's rule: `type:name`, both non-empty."""
    if not principal:
        return "principal must not be empty"
    ptype, sep, name = principal.partition(":")
    if not sep or not ptype or not name:
        return f"expected a string in format principalType:principalName but got {principal}"
    return None


def binding_problem(resource: ResourcePattern, entry: AccessControlEntry) -> str | None:
    """Why CreateAcls refuses this binding (Kafka answers INVALID_REQUEST), or None."""
    if (resource.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY)
            or resource.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED)
            or entry.operation in (AclOperation.UNKNOWN, AclOperation.ANY)
            or entry.permission not in (AclPermissionType.ALLOW, AclPermissionType.DENY)):
        return f"Invalid ACL creation: {resource} {entry} contains unknown or ANY elements"
    if resource.resource_type in (ResourceType.DELEGATION_TOKEN, ResourceType.USER):
        return "kbroker has no delegation tokens: ACLs on DelegationToken and User resources are not supported"
    if resource.resource_type == ResourceType.CLUSTER and resource.name != CLUSTER_NAME:
        return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
    if not resource.name:
        return "Invalid empty resource name"
    return principal_problem(entry.principal)


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """ResourcePatternFilter + AccessControlEntryFilter; None names, principals and hosts match anything."""

    resource_type: ResourceType
    name: str | None
    pattern_type: PatternType
    principal: str | None
    host: str | None
    operation: AclOperation
    permission: AclPermissionType

    def is_unknown(self) -> bool:
        return (self.resource_type == ResourceType.UNKNOWN or self.pattern_type == PatternType.UNKNOWN
                or self.operation == AclOperation.UNKNOWN or self.permission == AclPermissionType.UNKNOWN)

    def matches_pattern(self, p: ResourcePattern) -> bool:
        if self.resource_type != ResourceType.ANY and self.resource_type != p.resource_type:
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH) and self.pattern_type != p.pattern_type:
            return False
        if self.name is None:
            return True
        if self.pattern_type in (PatternType.ANY, p.pattern_type):
            return self.name == p.name
        # MATCH: every pattern that would apply to a resource of this name
        if p.pattern_type == PatternType.LITERAL:
            return self.name == p.name or p.name == WILDCARD_RESOURCE
        return self.name.startswith(p.name)

    def matches_entry(self, e: AccessControlEntry) -> bool:
        return ((self.principal is None or self.principal == e.principal)
                and (self.host is None or self.host == e.host)
                and (self.operation == AclOperation.ANY or self.operation == e.operation)
                and (self.permission == AclPermissionType.ANY or self.permission == e.permission))


# ------------------------------------------------------------------ JSON documents (Kafka's AclEntry format)

_OPERATION_BY_NAME = {v.lower(): k for k, v in OPERATION_NAMES.items()}
_PERMISSION_BY_NAME = {v.lower(): k for k, v in PERMISSION_NAMES.items()}
RESOURCE_TYPE_BY_NAME = {v.lower(): k for k, v in RESOURCE_TYPE_NAMES.items()}
RESOURCE_TYPE_BY_NAME.update({k.name.lower(): k for k in RESOURCE_TYPE_NAMES})


def entries_to_json(entries: frozenset[AccessControlEntry]) -> dict[str, Any]:
    """/kafka-acl/<Type>/<name>: {"version":1,"acls":[{"principal","permissionType","operation","host"}]}."""
    return {"version": 1, "acls": [
        {"principal": e.principal, "permissionType": PERMISSION_NAMES[e.permission],
         "operation": OPERATION_NAMES[e.operation], "host": e.host}
        for e in sorted(entries, key=lambda e: (e.principal, e.host, int(e.operation), int(e.permission)))
    ]}


def entries_from_json(doc: dict[str, Any]) -> frozenset[AccessControlEntry]:
    """Raises ValueError/KeyError/TypeError on a document that is not Kafka's format."""
    out = set()
    for a in doc.get("acls") or []:
        out.add(AccessControlEntry(
            str(a["principal"]), str(a["host"]),
            _OPERATION_BY_NAME[str(a["operation"]).lower().replace("_", "")],
            _PERMISSION_BY_NAME[str(a["permissionType"]).lower()],
        ))
    return frozenset(out)


"""DescribeConfigs (32), AlterConfigs (33), IncrementalAlterConfigs (44) for topics, brokers and groups."""

from __future__ import annotations

from kbroker.broker.admin_manager import INTERNAL_TOPICS
from kbroker.broker.apis import ApiHandler, RequestContext
from kbroker.broker.config import CONFIG_TYPE_NAMES, KAFKA_DYNAMIC_CONFIGS, KEYS, render_value
from kbroker.broker.group_config import DOCUMENTATION, GROUP_TO_BROKER, config_type, describe_group
from kbroker.broker.security.acls import AclOperation, ResourceType
from kbroker.broker.topic_config import (
    CONFIG_TYPES,
    SOURCE_DEFAULT,
    SOURCE_DYNAMIC_DEFAULT_BROKER,
    TOPIC_ONLY,
    TOPIC_TO_BROKER,
    DescribedConfig,
    broker_config_synonyms,
    config_type_of,
    describe_topic,
)
from kbroker.protocol.errors import ErrorCode, KafkaError
from kbroker.protocol.messages import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)

TOPIC, BROKER, BROKER_LOGGER, GROUP = 2, 4, 8, 32
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
LIST_CONFIGS = frozenset({"cleanup.policy", "log.cleanup.policy", "leader.replication.throttled.replicas",
                          "follower.replication.throttled.replicas"})


def _describe_broker(ctx: RequestContext) -> list[DescribedConfig]:
    """Kafka's createBrokerConfigEntry: read_only unless Kafka can change the key at runtime; the value of a
    key never set (and without a default) is null, as Kafka's KafkaConfig.values has it."""
    cfg = ctx.server.config
    metadata = ctx.server.metadata
    dynamic = metadata.broker_configs
    out = []
    for name, spec in sorted(KEYS.items()):
        synonyms = broker_config_synonyms(cfg, metadata.default_broker_configs, name, metadata.own_broker_configs)
        if name in dynamic:
            value = dynamic[name]
        elif name in cfg.originals:
            value = render_value(cfg[name])
        else:
            value = render_value(spec.default)
        source = synonyms[0][2] if synonyms else SOURCE_DEFAULT
        if spec.sensitive:  # passwords and private keys: Kafka answers null with is_sensitive
            value = None
            synonyms = [(n, None, s) for n, _, s in synonyms]
        out.append(DescribedConfig(name, value, source, read_only=name not in KAFKA_DYNAMIC_CONFIGS,
                                   sensitive=spec.sensitive, synonyms=synonyms))
    return out


def _describe_broker_defaults(ctx: RequestContext) -> list[DescribedConfig]:
    dynamic = ctx.server.metadata.default_broker_configs
    return [
        DescribedConfig(name, value, SOURCE_DYNAMIC_DEFAULT_BROKER, read_only=False,
                        synonyms=[(name, value, SOURCE_DYNAMIC_DEFAULT_BROKER)])
        for name, value in sorted(dynamic.items())
    ]


def _broker_type(name: str) -> int:
    spec = KEYS.get(name)
    return CONFIG_TYPES[CONFIG_TYPE_NAMES.get(spec.parse, "string") if spec else "string"]


def _config_type(resource_type: int, name: str) -> int:
    if resource_type == TOPIC:
        return config_type_of(name)
    return config_type(name) if resource_type == GROUP else _broker_type(name)


def _resource(resource_type: int, name: str) -> str:
    kind = {TOPIC: "topic", BROKER: "broker", BROKER_LOGGER: "broker logger", GROUP: "group"}.get(resource_type,
                                                                               f"resource type {resource_type}")
    return f"{kind} {name!r}"


def _authorize(ctx: RequestContext, op: AclOperation, resource_type: int, name: str) -> None:
    """Kafka's ConfigHelper/ControllerApis checks: op on the topic or the group, or on the cluster for broker
    resources."""
    if ctx.server.authorizer is None:
        return
    if resource_type == TOPIC:
        if not ctx.authorized(op, ResourceType.TOPIC, name):
            raise KafkaError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"Not authorized to access topic {name}")
    elif resource_type == GROUP:
        if not ctx.authorized(op, ResourceType.GROUP, name):
            raise KafkaError(ErrorCode.GROUP_AUTHORIZATION_FAILED, f"Not authorized to access group {name}")
    elif resource_type in (BROKER, BROKER_LOGGER):
        if not ctx.authorized(op, ResourceType.CLUSTER):
            raise KafkaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Not authorized to access the cluster")


def _check_broker_resource(ctx: RequestContext, name: str, allow_default: bool) -> None:
    if name == "" and allow_default:
        return
    if name != str(ctx.server.broker_id):
        raise KafkaError(ErrorCode.INVALID_REQUEST, f"Unexpected broker id, expected {ctx.server.broker_id} but received {name}")


def handle_describe_configs(ctx: RequestContext, req: DescribeConfigsRequest) -> DescribeConfigsResponse:
    R = DescribeConfigsResponse
    v = ctx.api_version
    results = []
    for res in req.resources:
        out = R.DescribeConfigsResult(
            error_code=0, error_message=None, resource_type=res.resource_type, resource_name=res.resource_name
        )
        results.append(out)
        try:
            _authorize(ctx, AclOperation.DESCRIBE_CONFIGS, res.resource_type, res.resource_name)
            if res.resource_type == TOPIC:
                rec = ctx.server.metadata.topics.get(res.resource_name)
                if rec is None:
                    raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {res.resource_name} does not exist")
                metadata = ctx.server.metadata
                entries = describe_topic(ctx.server.config, rec.configs, metadata.default_broker_configs,
                                         metadata.own_broker_configs)
            elif res.resource_type == BROKER and res.resource_name == "":
                # Kafka's ConfigHelper: the empty name is the cluster-wide default resource, which lists only
                # the dynamic default configs (kafka-configs --describe --entity-type brokers --entity-default).
                entries = _describe_broker_defaults(ctx)
            elif res.resource_type == BROKER:
                _check_broker_resource(ctx, res.resource_name, allow_default=False)
                entries = _describe_broker(ctx)
            elif res.resource_type == GROUP:
                if not res.resource_name:
                    raise KafkaError(ErrorCode.INVALID_REQUEST, "Group name must not be empty")
                entries = describe_group(ctx.server.config, ctx.server.consumer_group_config(res.resource_name))
            else:
                raise KafkaError(ErrorCode.INVALID_REQUEST, f"Unsupported resource type {res.resource_type}")
            keys = None if res.configuration_keys is None else set(res.configuration_keys)
            out.configs = [
                R.DescribeConfigsResourceResult(
                    name=e.name,
                    value=e.value,
                    read_only=e.read_only,
                    is_default=e.source == SOURCE_DEFAULT,
                    config_source=e.source,
                    is_sensitive=e.sensitive,
                    synonyms=[R.DescribeConfigsSynonym(name=n, value=val, source=s) for n, val, s in e.synonyms or []]
                    if v >= 1 and req.include_synonyms
                    else [],
                    config_type=_config_type(res.resource_type, e.name),
                    documentation=DOCUMENTATION.get(e.name)
                    if res.resource_type == GROUP and v >= 3 and req.include_documentation else None,
                )
                for e in entries
                if keys is None or e.name in keys
            ]
        except KafkaError as e:
            out.error_code = e.code
            out.error_message = e.message or None
            ctx.refused(e.code, e.message, _resource(res.resource_type, res.resource_name))
    return R(throttle_time_ms=0, results=results)


def _apply(ctx: RequestContext, resource_type: int, name: str, new: dict[str, str | None], validate_only: bool) -> None:
    if resource_type == TOPIC:
        if name in INTERNAL_TOPICS:
            _check_internal_cleanup_policy(ctx, name, new)
        ctx.server.admin.set_topic_configs(name, new, validate_only)
    elif resource_type == BROKER:
        _check_broker_resource(ctx, name, allow_default=True)
        ctx.server.admin.set_broker_configs({k: str(v) for k, v in new.items()}, validate_only, own=name != "")
    elif resource_type == GROUP:
        ctx.server.admin.set_group_configs(name, new, validate_only)
    else:
        raise KafkaError(ErrorCode.INVALID_REQUEST, f"Unsupported resource type {resource_type}")


def _check_internal_cleanup_policy(ctx: RequestContext, name: str, new: dict[str, str | None]) -> None:
    """The coordinators' topics must stay compacted: under `delete` retention would drop every group's committed
    offsets and every transactional id's state once they are older than retention.ms."""
    policy = new.get("cleanup.policy")
    if policy is None:
        policy = _effective(ctx, TOPIC, "cleanup.policy")
    if "compact" not in [p.strip() for p in (policy or "").split(",")]:
        raise KafkaError(ErrorCode.INVALID_CONFIG,
                         f"cleanup.policy of internal topic {name} must include compact, not {policy!r}")


def _current(ctx: RequestContext, resource_type: int, name: str) -> dict[str, str | None]:
    if resource_type == TOPIC:
        rec = ctx.server.metadata.topics.get(name)
        if rec is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {name} does not exist")
        return dict(rec.configs)
    if resource_type == GROUP:
        return dict(ctx.server.consumer_group_config(name))
    metadata = ctx.server.metadata
    return dict(metadata.own_broker_configs if name else metadata.default_broker_configs)


def _check_entries(resource_type: int, names: list[str], null_values: list[str]) -> None:
    """Kafka's ConfigAdminManager.preprocess, as KRaft brokers run it for the resource types they forward (kbroker
    applies it to groups, which only KRaft serves; topics and brokers keep the ZooKeeper-mode answers)."""
    if resource_type != GROUP:
        return
    if len(set(names)) != len(names):
        raise KafkaError(ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys")
    if null_values:
        raise KafkaError(ErrorCode.INVALID_REQUEST, f"Null value not supported for : {', '.join(null_values)}")


def handle_alter_configs(ctx: RequestContext, req: AlterConfigsRequest) -> AlterConfigsResponse:
    R = AlterConfigsResponse
    out = []
    for res in req.resources:
        r = R.AlterConfigsResourceResponse(error_code=0, error_message=None, resource_type=res.resource_type,
                                           resource_name=res.resource_name)
        out.append(r)
        try:
            _authorize(ctx, AclOperation.ALTER_CONFIGS, res.resource_type, res.resource_name)
            _check_entries(res.resource_type, [c.name for c in res.configs],
                           [c.name for c in res.configs if c.value is None])
            _current(ctx, res.resource_type, res.resource_name)  # existence check
            _apply(ctx, res.resource_type, res.resource_name, {c.name: c.value for c in res.configs}, req.validate_only)
        except KafkaError as e:
            r.error_code = e.code
            r.error_message = e.message or None
            ctx.refused(e.code, e.message, _resource(res.resource_type, res.resource_name))
    return R(throttle_time_ms=0, responses=out)


def handle_incremental_alter_configs(
    ctx: RequestContext, req: IncrementalAlterConfigsRequest
) -> IncrementalAlterConfigsResponse:
    R = IncrementalAlterConfigsResponse
    out = []
    for res in req.resources:
        r = R.AlterConfigsResourceResponse(error_code=0, error_message=None, resource_type=res.resource_type,
                                           resource_name=res.resource_name)
        out.append(r)
        try:
            _authorize(ctx, AclOperation.ALTER_CONFIGS, res.resource_type, res.resource_name)
            _check_entries(res.resource_type, [c.name for c in res.configs],
                           [c.name for c in res.configs if c.config_operation != DELETE and c.value is None])
            configs = _current(ctx, res.resource_type, res.resource_name)
            for c in res.configs:
                if c.config_operation == SET:
                    configs[c.name] = c.value
                elif c.config_operation == DELETE:
                    configs.pop(c.name, None)
                elif c.config_operation in (APPEND, SUBTRACT):
                    if res.resource_type == GROUP:  # Kafka's ConfigurationControlManager: no group key is a LIST
                        op = "APPEND" if c.config_operation == APPEND else "SUBTRACT"
                        known = "not LIST" if c.name in GROUP_TO_BROKER else "not known"
                        raise KafkaError(ErrorCode.INVALID_CONFIG,
                                         f"Can't {op} to key {c.name} because its type is {known}.")
                    if c.name not in LIST_CONFIGS:
                        raise KafkaError(ErrorCode.INVALID_CONFIG,
                                         f"Config value append/subtract is not allowed for config key {c.name}")
                    # A key set to the empty list is a value of its own: start from it, not from the default.
                    current = configs[c.name] if c.name in configs else _effective(ctx, res.resource_type, c.name)
                    items = [x for x in (current or "").split(",") if x]
                    change = [x.strip() for x in (c.value or "").split(",") if x.strip()]
                    if c.config_operation == APPEND:
                        items += [x for x in change if x not in items]
                    else:
                        items = [x for x in items if x not in change]
                    configs[c.name] = ",".join(items)
                else:
                    raise KafkaError(ErrorCode.INVALID_REQUEST, f"Unknown config operation {c.config_operation}")
            _apply(ctx, res.resource_type, res.resource_name, configs, req.validate_only)
        except KafkaError as e:
            r.error_code = e.code
            r.error_message = e.message or None
            ctx.refused(e.code, e.message, _resource(res.resource_type, res.resource_name))
    return R(throttle_time_ms=0, responses=out)


def _effective(ctx: RequestContext, resource_type: int, name: str) -> str | None:
    if resource_type == TOPIC and name in TOPIC_ONLY:
        return TOPIC_ONLY[name]
    key = TOPIC_TO_BROKER.get(name, name) if resource_type == TOPIC else name
    return render_value(ctx.server.config[key])


HANDLERS = [
    ApiHandler(32, 0, 4, handle_describe_configs),
    ApiHandler(33, 0, 2, handle_alter_configs),
    ApiHandler(44, 0, 1, handle_incremental_alter_configs),
]

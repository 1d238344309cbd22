"""Request handlers, one module per API family. Each module lists its ApiHandlers in HANDLERS."""

from __future__ import annotations

from kbroker.broker.apis import ApiHandler


def all_handlers() -> list[ApiHandler]:
    from kbroker.broker.handlers import (
        acls,
        api_versions,
        configs,
        consumer_groups,
        fetch,
        groups,
        log_dirs,
        metadata,
        produce,
        producer,
        quotas,
        replication,
        sasl,
        share,
        share_admin,
        share_state,
        streams_groups,
        topics,
        txn,
    )

    out: list[ApiHandler] = []
    for module in (api_versions, metadata, produce, producer, fetch, topics, configs, groups, consumer_groups, quotas, txn, replication, log_dirs,
                   sasl, acls, share, share_admin, share_state, streams_groups):
        out.extend(module.HANDLERS)
    return out

"""Share-group configs for the share tests: set through confluent-kafka's AdminClient (IncrementalAlterConfigs on
the GROUP resource), as a user sets them."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

# Records from the start, and the longest lock the broker allows: nothing in a test comes back because a lock expired.
EARLIEST_LONG_LOCKS = {"share.auto.offset.reset": "earliest", "share.record.lock.duration.ms": "60000"}


def set_group_configs(admin: AdminClient, group: str, configs: dict[str, str], timeout: float = 30) -> None:
    res = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()
        ],
    )
    admin.incremental_alter_configs([res])[res].result(timeout)

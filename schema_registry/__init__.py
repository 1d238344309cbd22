"""A Confluent-compatible Schema Registry served by the broker at schema.registry.listeners, stored in `_schemas`."""

"""`kbroker-admin`: Kafka's command-line tools (kafka-topics, kafka-consumer-groups, kafka-configs,
kafka-console-producer/-consumer, kafka-get-offsets) for any Kafka-compatible broker, over the wire protocol."""

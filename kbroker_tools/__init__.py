"""Tools around a Kafka-compatible broker that talk to it only over the wire protocol: the pytest plugin
(`kbroker_tools.pytest_plugin`), the `kbroker-admin` command line and the container health check."""

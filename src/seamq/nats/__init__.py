"""NATS JetStream adapter: connections, pipelined publishing, provisioning, pulls."""

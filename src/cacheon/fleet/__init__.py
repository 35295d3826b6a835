"""The fleet event plane: KV batches, snapshots and heartbeats through NATS JetStream."""

"""Fleet state through NATS: what gateway replicas share with each other (the ``fleet`` extra)."""

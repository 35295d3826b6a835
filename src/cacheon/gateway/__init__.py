"""The KV-aware gateway: SGLang KV-event contracts, decoders, subscriber, block index, hash prediction."""

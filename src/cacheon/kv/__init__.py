"""SGLang KV events: wire contracts, typed events, the ingest transport, the block index, hash prediction."""

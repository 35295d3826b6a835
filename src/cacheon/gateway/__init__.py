"""The KV-aware gateway: the HTTP service (fleet, proxy, policies, attestation, metrics, config)."""

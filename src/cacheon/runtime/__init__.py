"""The runtime pin guard: the exact SGLang (and Bittensor SDK) Cacheon integrates with, the seams it
relies on, the canaries that check them, and the adapters that arm bundles inside SGLang."""

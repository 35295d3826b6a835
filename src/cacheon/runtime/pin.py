"""The exact upstream versions Cacheon integrates with. Equality is exact string equality: a bump is a
reviewed rebaseline (re-measure the seams, re-run the tiers), never an automatic update."""

SGLANG_DIST = "sglang"
SGLANG_PIN = "0.5.13.post1"

# The last classic SDK (Subtensor/Metagraph/bittensor_wallet). 11.x is a rewrite with another surface
# (reads/intents); adopting it is a rebaseline of the validator code, see docs/maintaining/runtime-pin.md.
BITTENSOR_DIST = "bittensor"
BITTENSOR_PIN = "10.5.0"

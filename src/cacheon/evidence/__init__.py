"""Evidence bound to exact runtime identities: ledger, classes, pin-bump gates, release descriptors."""

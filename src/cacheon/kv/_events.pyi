"""Types of the per-event pass in C (``_events.pyx``)."""

from collections.abc import Callable, Sequence
from typing import Any

UNUSUAL_TOKENS: int
PAST_BOUNDS: int

def token_array(raw: Any) -> tuple[int, bool]: ...
def scan(events: Sequence[Any], stored: type, max_block_size: int, max_tokens: int, max_pages: int) -> int: ...
def operations(events: Sequence[Any], kinds: dict[type, Any], op_of: Callable[[type], Any], device_media: Any,
               store: Any, clear: Any) -> tuple[list[Any], int]: ...

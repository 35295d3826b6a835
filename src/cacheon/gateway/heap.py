"""Keep the garbage collector's full passes short in a long-lived gateway process."""

from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    """Move every object alive after start-up (modules, tokenizers, templates) out of the collector's view.

    CPython's older-generation passes traverse every tracked object, and a gateway's start-up
    objects never die: traversing them is pure pause on the routing path. ``gc.freeze`` is
    CPython's tool for exactly this; collecting first keeps start-up garbage from being pinned.
    """
    gc.collect()
    gc.freeze()

"""Keep the garbage collector's passes few and short in a long-lived gateway process."""

from __future__ import annotations

import gc

# Container allocations between young-generation passes (CPython's default: 700, 10, 10). A streamed
# request allocates many short-lived containers (futures, handles, headers, per-chunk bookkeeping) that
# refcounting frees anyway: a young pass every 700 spends its time on objects about to die. Measured
# in benchmarks/README.md (issue 22): less gateway CPU per streamed request, routing p99 within noise.
THRESHOLDS = (20_000, 20, 20)  # young; then young passes per middle pass, middle passes per full pass


def freeze_startup_objects(thresholds: tuple[int, int, int] | None = THRESHOLDS) -> None:
    """Move every object alive after start-up (modules, tokenizers, templates) out of the collector's view,
    and set the collector's ``thresholds`` (None: CPython's left as they are).

    CPython's older-generation passes traverse every tracked object, and a service's start-up
    objects never die: traversing them is pure pause on the routing path. ``gc.freeze`` is
    CPython's tool for exactly this; collecting first keeps start-up garbage from being pinned.
    The gateway's older passes come after 20 of the younger ones (CPython: 10), as measured; a
    relay keeps CPython's (a young generation of 20,000 objects is a longer pause on its lag path,
    and nothing measured it better there).
    """
    gc.collect()
    gc.freeze()
    if thresholds is not None:
        gc.set_threshold(*thresholds)

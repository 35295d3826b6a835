"""What one SGLang release's own radix-cache event recorder queues for a described change.

``python -m tests.sim.sglang_recorder RELEASES_DIR VERSION`` reads a JSON description on stdin::

    {"page_size": 4, "removed": [[hash, ...], ...], "stored": {"parent": hash | null, "hashes": [...],
     "tokens": [...]}}

``removed`` is one list of page hashes per evicted radix node, ``stored`` the one node an insert adds
(``RadixCache._insert_helper`` records exactly one new node per insert, in every release). It feeds them to
the release's ``sglang/srt/mem_cache/events.py`` (``KVCacheEventMixin`` up to 0.5.18,
``KVCacheEventRecorder`` from 0.5.19), removals first as a scheduler step evicts before it caches, and
writes the queued events as hex msgpack, encoded from the release's own event classes.

The node hash values are given, so the release's hashing helpers (a C++ extension from 0.5.18, torch and
triton around them) are replaced by a stand-in ``sglang.srt.mem_cache.utils`` that passes them through.
One release per process, as the release modules share their names.
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec

from cacheon.sim.publisher import load_release_kv_events


class _Key:
    """The ``RadixKey`` attributes the recorders read: no bigrams, no salt, no LoRA namespace."""

    def __init__(self, tokens: list[int]) -> None:
        self.token_ids = tokens
        self.is_bigram = False
        self.cache_salt = None
        self.extra_key = None

    def __len__(self) -> int:
        return len(self.token_ids)


def _given(_node: Any, _page_size: int) -> list[Any]:
    raise AssertionError("node hash values are given; the recorder must not compute them")


def _load_events(releases: Path, version: str) -> types.ModuleType:
    kv = load_release_kv_events(releases, version)  # stand-in parents for sglang, srt, disaggregation
    mem_cache = types.ModuleType("sglang.srt.mem_cache")
    mem_cache.__path__ = [str(Path(kv.__file__).parents[1] / "mem_cache")]
    utils = types.ModuleType("sglang.srt.mem_cache.utils")
    utils.compute_node_hash_values = _given  # type: ignore[attr-defined]  # a stand-in for SGLang's hashing
    utils.compute_node_event_hash_values = _given  # type: ignore[attr-defined]  # a stand-in, as above
    utils.hash_str_to_int64 = int  # type: ignore[attr-defined]  # hash values are ints already
    sys.modules.update({mem_cache.__name__: mem_cache, utils.__name__: utils})
    return importlib.import_module("sglang.srt.mem_cache.events")


def queued_events(releases: Path, version: str, change: dict[str, Any]) -> bytes:
    """The release's queue after recording ``change``, msgpack-encoded."""
    events = _load_events(releases, version)
    page = change["page_size"]
    root = SimpleNamespace(parent=None, hash_value=[], key=_Key([]))
    if hasattr(events, "KVCacheEventRecorder"):
        recorder = events.KVCacheEventRecorder(enabled=True, page_size=page)
        store, remove, take = recorder.record_store, recorder.record_remove, recorder.take
    else:
        cache = type("Cache", (events.KVCacheEventMixin,), {})()
        cache.enable_kv_cache_events, cache.page_size, cache.kv_event_queue = True, page, []
        cache.root_node = root
        store, remove, take = cache._record_store_event, cache._record_remove_event, cache.take_events
    for hashes in change["removed"]:
        remove(SimpleNamespace(parent=root, hash_value=hashes, key=_Key([0] * page * len(hashes))))
    stored = change["stored"]
    if stored is not None:
        parent = root
        if stored["parent"] is not None:
            parent = SimpleNamespace(parent=root, hash_value=[stored["parent"]], key=_Key([0] * page))
        store(SimpleNamespace(parent=parent, hash_value=stored["hashes"], key=_Key(stored["tokens"])))
    return msgspec.msgpack.encode(take())


if __name__ == "__main__":
    sys.stdout.write(queued_events(Path(sys.argv[1]), sys.argv[2], json.load(sys.stdin)).hex())

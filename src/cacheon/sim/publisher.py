"""Publish the simulator's cache changes with a chosen SGLang release's own publisher code.

The release's ``kv_events`` module is loaded from its unpacked wheel (``.sglang/<version>``,
as scripts/install_sglang_releases.sh lays it out) with stand-in parent packages, so
``sglang/__init__.py`` (torch, torchvision) never runs, while ``ZmqEventPublisher`` and the
event classes are that release's files: the bytes on the wire are the release's bytes. How
pages group into events follows that release's radix cache (see ``coalesces``), and the
publishers are built from the same ``--kv-events-config`` JSON the server reports.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import sys
import time
import types
from pathlib import Path
from typing import Any

from packaging.version import Version

from cacheon.errors import UsageError
from cacheon.sim.cache import StoredPage
from cacheon.sim.releases import how_to_get, unpacked


def load_release_kv_events(releases_dir: Path, version: str) -> types.ModuleType:
    """The ``kv_events`` module of exactly ``version`` (one release per process)."""
    root = (releases_dir / version).resolve() / "sglang"
    if not unpacked(releases_dir, version):
        raise UsageError(how_to_get(releases_dir, version))
    loaded = sys.modules.get("sglang.srt.disaggregation.kv_events")
    if loaded is not None:  # the installed SGLang is loaded (--prefix-cache sglang): only if it is `version`
        if Path(loaded.__file__ or "").resolve().is_relative_to(root) or _installed() == version:
            return loaded
        raise UsageError(f"SGLang {_installed()} is already loaded in this process, not {version}")
    for name in ("sglang", "sglang.srt", "sglang.srt.utils", "sglang.srt.disaggregation"):
        package = types.ModuleType(name)
        package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
        sys.modules[name] = package
    return importlib.import_module("sglang.srt.disaggregation.kv_events")


def _installed() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


# The first release whose radix cache merges a BlockStored onto the queue's tail when the new
# event's parent is the tail's last hash (and a BlockRemoved onto a BlockRemoved tail):
# sglang/srt/mem_cache/events.py ``_enqueue_kv_event`` (0.5.18), ``KVCacheEventRecorder.enqueue``
# (0.5.19+). Up to 0.5.13.post1 it queues one BlockStored and one BlockRemoved per page.
COALESCING_FROM = Version("0.5.18")


def coalesces(version: str) -> bool:
    """Whether ``version``'s radix cache merges consecutive pages into one event."""
    return Version(version) >= COALESCING_FROM


def kv_events_config(kv_port: int, replay_port: int | None) -> str:
    """The ``--kv-events-config`` JSON a real server would be started with for these ports."""
    config: dict[str, Any] = {"publisher": "zmq", "endpoint": f"tcp://*:{kv_port}", "topic": ""}
    if replay_port:
        config["replay_endpoint"] = f"tcp://*:{replay_port}"
    return json.dumps(config)


class RankPublishers:
    """One release publisher per DP rank, made as the release's scheduler makes it (from the config)."""

    def __init__(self, kv: types.ModuleType, version: str, config: str, dp_size: int) -> None:
        self.kv, self.coalesce = kv, coalesces(version)
        self.pubs = [kv.EventPublisherFactory.create(config, attn_dp_rank=r) for r in range(dp_size)]

    def publish(self, rank: int, stored: list[StoredPage], removed: list[int], block_size: int) -> None:
        """One batch as the release's radix cache queues it: removals (they made room), then stores.

        Every event is on the device tier (``medium`` GPU) with ``lora_id`` nil, as the release's
        recorder writes them for the default (unsalted, adapter-free) cache.
        """
        gpu = self.kv.StorageMedium.GPU
        groups = [removed] if self.coalesce and removed else [[h] for h in removed]
        events: list[Any] = [self.kv.BlockRemoved(block_hashes=hashes, medium=gpu) for hashes in groups]
        for page in stored:
            tail = events[-1] if events else None
            if self.coalesce and isinstance(tail, self.kv.BlockStored) and tail.block_hashes[-1] == page.parent:
                tail.block_hashes.append(page.block_hash)
                tail.token_ids.extend(page.tokens)
                continue
            events.append(
                self.kv.BlockStored(
                    block_hashes=[page.block_hash],
                    parent_block_hash=page.parent,
                    token_ids=list(page.tokens),
                    block_size=block_size,
                    lora_id=None,
                    medium=gpu,
                )
            )
        if events:
            self.pubs[rank].publish(self.kv.KVEventBatch(ts=time.time(), events=events))

    def clear(self, rank: int) -> None:
        """What the release's radix cache queues on a reset (``/flush_cache``)."""
        self.pubs[rank].publish(self.kv.KVEventBatch(ts=time.time(), events=[self.kv.AllBlocksCleared()]))

    def close(self) -> None:
        for pub in self.pubs:
            pub.shutdown()

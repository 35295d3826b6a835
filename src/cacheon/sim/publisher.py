"""Publish the simulator's cache changes with a chosen SGLang release's own publisher code.

The release's ``kv_events`` module is loaded from its unpacked wheel (``.sglang/<version>``,
as scripts/install_sglang_releases.sh lays it out) with stand-in parent packages, so
``sglang/__init__.py`` (torch, torchvision) never runs, while ``ZmqEventPublisher`` and the
event classes are that release's files: the bytes on the wire are the release's bytes.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import time
import types
from pathlib import Path
from typing import Any

from cacheon.errors import UsageError
from cacheon.sim.cache import StoredPage


def load_release_kv_events(releases_dir: Path, version: str) -> types.ModuleType:
    """The ``kv_events`` module of exactly ``version`` (one release per process)."""
    root = (releases_dir / version).resolve() / "sglang"
    if not (root / "srt" / "disaggregation" / "kv_events.py").is_file():
        raise UsageError(
            f"SGLang {version} is not unpacked under {releases_dir} (run scripts/install_sglang_releases.sh)"
        )
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


class RankPublishers:
    """One release ``ZmqEventPublisher`` per DP rank: live ``kv_port + r``, replay ``replay_port + r``."""

    def __init__(self, kv: types.ModuleType, kv_port: int, dp_size: int, replay_port: int | None) -> None:
        self.kv = kv
        replay = f"tcp://*:{replay_port}" if replay_port else None
        self.pubs = [
            kv.ZmqEventPublisher(attn_dp_rank=r, endpoint=f"tcp://*:{kv_port}", replay_endpoint=replay)
            for r in range(dp_size)
        ]

    def publish(self, rank: int, stored: list[StoredPage], removed: list[int], block_size: int) -> None:
        """One batch: removals first (they made room), then one BlockStored per page."""
        events: list[Any] = []
        if removed:
            events.append(self.kv.BlockRemoved(block_hashes=removed))
        events += [
            self.kv.BlockStored(
                block_hashes=[p.block_hash],
                parent_block_hash=p.parent,
                token_ids=list(p.tokens),
                block_size=block_size,
                lora_id=None,
            )
            for p in stored
        ]
        if events:
            self.pubs[rank].publish(self.kv.KVEventBatch(ts=time.time(), events=events))

    def close(self) -> None:
        for pub in self.pubs:
            pub.shutdown()

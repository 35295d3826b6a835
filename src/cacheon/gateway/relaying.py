"""What ``cacheon kv relay`` takes from the gateway: a worker found by its URL as the gateway finds it.

The relay lives in ``cacheon.fleet`` and knows nothing of HTTP discovery; this module discovers a
worker's KV geometry (``/server_info``: version, publisher port, DP size, replay port) and names
the contract for its version, so a relay subscribes exactly where and how a gateway would.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

import aiohttp

from cacheon.errors import UsageError
from cacheon.fleet.relay import Followed, Relay, RelaySettings, default_relay_id
from cacheon.gateway.config import RelayConfig, WorkerSpec
from cacheon.gateway.workers import DiscoveryError, discover
from cacheon.kv.contracts import for_version

log = logging.getLogger("cacheon.fleet")


def plane_name(spec: WorkerSpec) -> str:
    """A worker's name on the event plane: its id, else its URL (``Worker.plane_name`` in a gateway)."""
    return spec.id or spec.url


async def resolve(client: aiohttp.ClientSession, spec: WorkerSpec, timeout_s: float) -> Followed | None:
    """The worker's KV geometry, or None (logged) while it cannot be discovered or publishes no events."""
    try:
        found = await discover(client, spec.url, timeout_s)
        contract = for_version(found.version)
    except (DiscoveryError, UsageError) as exc:
        log.warning("relay cannot follow worker yet", extra={"fields": {"worker": plane_name(spec), "error": str(exc)}})
        return None
    if found.kv_port is None:
        log.warning("relay: worker publishes no KV events", extra={"fields": {"worker": plane_name(spec)}})
        return None
    host = urlsplit(spec.url).hostname or "127.0.0.1"
    replay = found.replay_port or spec.kv_replay_port
    return Followed(plane_name(spec), f"tcp://{host}:{found.kv_port}", f"tcp://{host}:{replay}" if replay else None,
                    contract, found.dp_size)


def settings(cfg: RelayConfig) -> RelaySettings:
    ep = cfg.event_plane
    return RelaySettings(url=ep.url, relay_id=cfg.relay_id or default_relay_id(),
                         stream=ep.stream, snapshot_bucket=ep.snapshot_bucket, lease_s=cfg.lease_s,
                         heartbeat_s=cfg.heartbeat_s, snapshot_interval_s=cfg.snapshot_interval_s,
                         retention_s=cfg.retention_s, bounds=cfg.kv_wire, max_replay=cfg.kv_max_replay)


async def serve(cfg: RelayConfig, stop: asyncio.Event, started: asyncio.Future[Relay] | None = None) -> Relay:
    """Run one relay until ``stop``; ``started`` gets it once connected (for status and tests)."""
    specs = {plane_name(s): s for s in cfg.workers}
    async with aiohttp.ClientSession() as client:
        async def find(name: str) -> Followed | None:
            return await resolve(client, specs[name], cfg.request_timeout_s)

        relay = Relay(settings(cfg), list(specs), find)
        task = asyncio.create_task(relay.run(stop))
        while relay.plane is None and not task.done():
            await asyncio.sleep(0.05)
        if started is not None and not started.done():
            if task.done() and task.exception() is not None:
                started.set_exception(task.exception() or RuntimeError("relay stopped"))
            else:
                started.set_result(relay)
        await task
    return relay

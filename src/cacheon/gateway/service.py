"""One gateway: the parts a config builds (profiles, index, chain cache, policy, metrics) and
the two that work on them, the fleet (workers) and the proxy (requests), started and stopped together."""

from __future__ import annotations

import aiohttp

from cacheon.gateway.config import GatewayConfig
from cacheon.gateway.fleet import Fleet
from cacheon.gateway.http import session
from cacheon.gateway.metrics import Metrics
from cacheon.gateway.policy import make_policy
from cacheon.gateway.proxy import Proxy
from cacheon.kv.feed import Source
from cacheon.kv.index import BlockIndex
from cacheon.tokens.chains import ChainCache
from cacheon.tokens.profile import TokenizerProfile


class Gateway:
    """Owns every cache and index it routes with: nothing is shared through module state."""

    def __init__(self, cfg: GatewayConfig) -> None:
        self.cfg = cfg
        self.profiles = {name: TokenizerProfile(spec) for name, spec in cfg.models.items()}
        self.index: BlockIndex[Source] = BlockIndex()
        self.chains = ChainCache()
        self.policy = make_policy(cfg, self.index, self.chains)
        self.fleet = Fleet(cfg, self.profiles, self.index, self.chains, self.policy)
        self.metrics = Metrics(lambda: [(w.id, w.feed_totals()) for w in list(self.fleet.workers.values())],
                               self.profiles, self.chains)
        self.proxy = Proxy(cfg, self.fleet, self.policy, self.profiles, self.metrics)
        self._client: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._client = session()
        await self.fleet.start(self._client)

    async def stop(self) -> None:
        await self.fleet.stop()
        if self._client is not None:
            await self._client.close()

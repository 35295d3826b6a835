"""Routing precision through a live gateway over simulated workers: exact on ordinary requests, and a
cache flushed without an event reaching the gateway shows as a counted mismatch in /status and metrics."""

from __future__ import annotations

import re
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from cacheon.sim.launch import GatewayProcess, SimProcess, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # slow: workers and a gateway as processes

PROMPT = list(range(20, 20 + 6 * 4))  # six pages of the simulator's default 4


def _complete(gw: GatewayProcess, **body: Any) -> tuple[int | None, int]:
    """Predicted (the gateway's header) and reported cached tokens."""
    r = httpx.post(f"{gw.url}/v1/completions", timeout=30,
                   json={"model": "demo", "prompt": PROMPT, "max_tokens": 1, **body})
    assert r.status_code == 200, r.text
    header = r.headers.get("x-cacheon-predicted-cached-tokens")
    return None if header is None else int(header), r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("fault", [None, "silent_flush"])
def test_a_flush_the_gateway_never_heard_of_is_a_counted_mismatch(tmp_path: Path, profile: tuple[Path, Path],
                                                                  fault: str | None) -> None:
    with ExitStack() as stack:
        sim = SimProcess(stack, tmp_path, profile, "0.5.23", fault=fault)
        sim.ready()
        gw = GatewayProcess(stack, tmp_path, profile, "exact", [{"url": sim.url}])
        assert gw.settled([sim.url])[sim.url]["ladder"]["state"] == "READY"
        blocks = gw.status()[sim.url]["indexed_blocks"]
        assert _complete(gw) == (0, 0)
        wait_until(lambda: gw.status()[sim.url]["indexed_blocks"] == blocks + 6, "the prompt's six pages", 10)
        assert _complete(gw) == (20, 20)  # a repeat: every full page but the one with the last token
        assert _complete(gw, echo=True, logprobs=1) == (0, 0)  # prompt logprobs: nothing reused
        assert httpx.post(f"{sim.url}/flush_cache", timeout=10).status_code == 200
        if fault is None:  # control: the flush's AllBlocksCleared empties the index too
            wait_until(lambda: gw.status()[sim.url]["indexed_blocks"] == 0, "the flush's event", 10)
            assert _complete(gw) == (0, 0)
        else:
            assert _complete(gw) == (20, 0)  # the index still says cached; the engine reuses nothing
        precision = gw.status()[sim.url]["precision"]
        over = 0 if fault is None else 1
        assert (precision["scored"], precision["exact"], precision["over"], precision["under"]) == (4, 4 - over, over, 0)
        metrics = httpx.get(f"{gw.url}/metrics", timeout=10).text
        wid = gw.status()[sim.url]["id"]
        assert re.search(rf'cacheon_prediction_scored_total{{match="over",worker="{wid}"}} {over}\.0', metrics)
        if fault is not None:
            assert (precision["last_mismatch"]["predicted"], precision["last_mismatch"]["reported"]) == (20, 0)

"""The event plane in front of a real SGLang server on CPU: ``cacheon kv relay`` follows the 0.5.23
server's ZMQ publisher and publishes to a real nats-server's JetStream; gateways on the plane attest
the worker through it (the hash challenge's echoes come back over the stream), predict its cached
tokens exactly, and agree with a gateway subscribed to the worker directly, a late one from the
relay's snapshot. The server is the pool's (test_real_gateway's 0.5.23 one, run just before)."""

from __future__ import annotations

import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import openai
import pytest
import yaml

from cacheon.sim.launch import GatewayProcess, wait_until
from tests.engines.conftest import serve
from tests.engines.server import SERVED_MODEL_NAME, EngineSpec
from tests.fleet.natsd import NatsServer

pytestmark = [pytest.mark.slow, pytest.mark.fleet, pytest.mark.timeout(600)]

LATEST, PAGE = "0.5.23", 16


def _relay(stack: ExitStack, tmp: Path, plane: dict[str, str], url: str) -> subprocess.Popen[bytes]:
    config = tmp / "relay.yaml"
    config.write_text(yaml.safe_dump({"event_plane": plane, "workers": [{"url": url}], "relay_id": "real",
                                      "heartbeat_s": 0.5, "snapshot_interval_s": 1.0}))
    log = (tmp / "relay.log").open("wb")
    stack.callback(log.close)
    proc = subprocess.Popen([sys.executable, "-m", "cacheon", "kv", "relay", "--config", str(config)],
                            stdout=log, stderr=subprocess.STDOUT)

    def stop() -> None:
        proc.terminate()
        proc.wait(30)

    stack.callback(stop)
    return proc


def test_gateways_on_the_event_plane_match_a_direct_one_on_a_real_server(engine_pool, tmp_path: Path) -> None:
    server = serve(engine_pool, EngineSpec(LATEST, PAGE))
    model_dir = server.model["path"]
    with ExitStack() as stack:
        nats = stack.enter_context(NatsServer(tmp_path / "nats"))
        plane = {"url": nats.url, "stream": "REAL_KV", "snapshot_bucket": "real-snapshots"}
        relay = _relay(stack, tmp_path, plane, server.url)

        def gateway(**extra: object) -> GatewayProcess:
            return GatewayProcess(stack, tmp_path, None, "exact", [{"url": server.url}],
                                  models={SERVED_MODEL_NAME: {"tokenizer": model_dir}}, health_interval_s=1.0,
                                  challenge_timeout_s=20, request_timeout_s=120, **extra)

        relay_log = tmp_path / "relay.log"
        # the relay follows before any gateway's hash challenge, so that it sees what the direct one sees
        wait_until(lambda: "relay follows worker" in relay_log.read_text(), f"the relay: {relay_log}", 60)
        direct = gateway()
        assert direct.settled([server.url])[server.url]["ladder"]["state"] == "READY"
        on_plane = gateway(event_plane=plane)
        status = on_plane.settled([server.url])[server.url]
        assert status["ladder"]["state"] == "READY", (status, relay_log.read_text()[-3000:])

        client = openai.OpenAI(base_url=f"{on_plane.url}/v1", api_key="unused", timeout=120, max_retries=0)
        tokens = [0] + [10 + (7 * 53 + i * 29) % 900 for i in range(3 * PAGE - 1)]
        client.completions.create(model=SERVED_MODEL_NAME, prompt=tokens, max_tokens=2, temperature=0)

        def predicted_hit() -> tuple[int, int] | None:
            raw = client.completions.with_raw_response.create(model=SERVED_MODEL_NAME, prompt=tokens, max_tokens=2,
                                                              temperature=0)
            details = raw.parse().usage.prompt_tokens_details
            got = (int(raw.headers["x-cacheon-predicted-cached-tokens"]), details.cached_tokens if details else 0)
            return got if got[0] == 2 * PAGE else None

        # the first turn's pages reach the plane gateway's index through relay and stream: then a hit, exact
        assert wait_until(predicted_hit, "the plane gateway to predict the repeat", 30) == (2 * PAGE, 2 * PAGE)

        late = gateway(event_plane=plane)  # from the relay's snapshot and the stream after it
        gateways = [on_plane, direct, late]

        def agreed() -> tuple[str, int] | None:
            seen = {(gw.status()[server.url]["index_digest"], gw.status()[server.url]["indexed_blocks"])
                    for gw in gateways}
            only = seen.pop() if len(seen) == 1 else None
            return only if only is not None and only[1] > 0 else None

        wait_until(agreed, f"the three gateways to agree: {[gw.status()[server.url] for gw in gateways]}", 30)
        assert relay.poll() is None

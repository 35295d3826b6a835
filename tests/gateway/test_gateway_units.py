"""In-process parts of the gateway: config, policies, discovery."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from cacheon.errors import UsageError
from cacheon.gateway import config
from cacheon.gateway.config import WorkerSpec, load
from cacheon.gateway.http import session
from cacheon.gateway.policy import POLICIES, Approx, make_policy
from cacheon.gateway.workers import Discovery, Worker, WorkerState, discover
from cacheon.kv.index import BlockIndex
from cacheon.tokens.chains import ChainCache
from tests.gateway.snapshots import choose


def _config(tmp_path: Path, text: str, name: str = "gw.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_config_yaml_and_toml_agree(tmp_path: Path, profile: tuple[Path, Path]) -> None:
    yaml_cfg = load(_config(tmp_path, f"listen: 127.0.0.1:9\npolicy: exact\nworkers:\n  - url: http://127.0.0.1:1/\n"
                                      f"models:\n  demo: {{tokenizer: {profile[0]}, completions_bos: true, bos_token: '<s>'}}\n"))
    toml_cfg = load(_config(tmp_path, f'listen = "127.0.0.1:9"\npolicy = "exact"\n[[workers]]\nurl = "http://127.0.0.1:1/"\n'
                                      f'[models.demo]\ntokenizer = "{profile[0]}"\ncompletions_bos = true\nbos_token = "<s>"\n',
                                      "gw.toml"))
    assert yaml_cfg == toml_cfg
    assert yaml_cfg.workers[0].url == "http://127.0.0.1:1"
    assert (yaml_cfg.host, yaml_cfg.port) == ("127.0.0.1", 9)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("policy: fastest\n", "policy: invalid enum value 'fastest' (one of rr, exact, approx)"),
        ("policy: rr\nworkers: [{url: 'ftp://x'}]\n", "workers[0].url: 'ftp://x' is not http(s)://HOST:PORT"),
        ("policy: rr\nworkers: [{url: 'http://x:1', page_size: 0}]\n", "workers[0].page_size: expected int >= 1"),
        ("policy: rr\nworkers: [{url: 'http://x:1', kv_port: '5'}]\n", "workers[0].kv_port: expected int | null, got str"),
        ("policy: rr\nworkers: [{url: 'http://x:1', pagesize: 4}]\n",
         "workers[0]: unknown key pagesize (allowed: dp_size, id, kv_port"),
        ("policy: rr\nworkers: [{id: a}]\n", "workers[0]: missing required key url"),
        ("policy: exact\n", "policy exact tokenizes requests: configure at least one model"),
        ("listen: nowhere\n", "listen: 'nowhere' is not HOST:PORT"),
        ("policy: rr\nadmin: {listen: x}\n", "admin.listen: 'x' is not HOST:PORT"),
        ("policy: rr\nmodels: {demo: {tokenizer: t.json, template: x}}\n", "models.demo: unknown key template"),
        ("policy: rr\nkv_wire: {max_block_size: 0}\n", "kv_wire.max_block_size: expected int >= 1"),
        ("policy: rr\nrequest_timeout_s: true\n", "request_timeout_s: expected float, got bool"),
        ("policy: rr\nmin_match_ratio: 1.5\n", "min_match_ratio: expected float <= 1.0"),
        ("[oops\n", "not valid YAML: expected ',' or ']', but got '<stream end>' (line 2, column 1)"),
        ("- a list\n", "config: expected a mapping of keys, got list"),
    ],
)
def test_config_errors_say_where(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(UsageError) as raised:
        load(_config(tmp_path, text), {})
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_environment_overrides_keys_and_errors_name_the_variable(tmp_path: Path) -> None:
    path = _config(tmp_path, "policy: rr\nrequest_timeout_s: 9\n")
    env = {"CACHEON_GATEWAY_REQUEST_TIMEOUT_S": "5", "CACHEON_GATEWAY_ADMIN__TOKEN": "s3cret",
           "CACHEON_GATEWAY_WORKERS": "[{url: 'http://w:30000/'}]", "OTHER": "ignored"}
    cfg = load(path, env)
    assert (cfg.request_timeout_s, cfg.admin.token, cfg.admin.listen) == (5.0, "s3cret", "127.0.0.1:8081")
    assert [w.url for w in cfg.workers] == ["http://w:30000"]
    assert load(path, {}).request_timeout_s == 9.0  # the file's value without the variable
    with pytest.raises(UsageError, match=r"request_timeout_s \(from CACHEON_GATEWAY_REQUEST_TIMEOUT_S\): expected float"):
        load(path, {"CACHEON_GATEWAY_REQUEST_TIMEOUT_S": "soon"})
    with pytest.raises(UsageError, match="CACHEON_GATEWAY_POLCY: no config key 'polcy'"):
        load(path, {"CACHEON_GATEWAY_POLCY": "rr"})


def _worker(wid: str, in_flight: int = 0) -> Worker:
    w = Worker(wid, WorkerSpec(url=f"http://{wid}:1"), discovery=Discovery("0.5.22", "demo", 2, 1, 1))
    w.state, w.in_flight = WorkerState.READY, in_flight
    return w


def test_approx_remembers_where_prefixes_went_within_its_bound() -> None:
    policy = Approx(epsilon=0.25, min_prefix_blocks=1, min_match_ratio=0, max_entries=4, chunk=2)
    a, b = _worker("a"), _worker("b")
    first, reason, _ = choose(policy, [a, b], [1, 2, 3, 4])[:3]
    assert reason == "fallback_miss"
    again = choose(policy, [a, b], [1, 2, 3, 4, 5, 6])
    assert again[:3] == (first, "prefix_hit", 4)
    choose(policy, [a, b], [7, 8, 9, 10, 11, 12])  # 3 new nodes: the LRU bound drops the oldest
    assert choose(policy, [a, b], [1, 2])[1] == "fallback_miss"
    policy.forget(first.id)  # a removed worker's entries go with it
    assert choose(policy, [a, b], [7, 8, 9, 10])[1] == "fallback_miss"


@pytest.mark.parametrize("prefix", ["/", "/get_"])
def test_discovery_reads_server_info_or_its_deprecated_alias(prefix: str) -> None:
    """A real HTTP server answering only one spelling of SGLang's info endpoints."""
    info = {"version": "0.5.22", "served_model_name": "demo", "kv_events_config": '{"replay_endpoint": "tcp://*:7100"}',
            "kv_events": {"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": 7000, "topic": "",
                          "block_size": 16, "dp_size": 2}}

    async def server_info(_: web.Request) -> web.Response:
        return web.json_response(info)

    async def model_info(_: web.Request) -> web.Response:
        return web.json_response({"model_path": "/models/demo"})

    async def run() -> Discovery:
        app = web.Application()
        app.router.add_get(f"{prefix}server_info", server_info)
        app.router.add_get(f"{prefix}model_info", model_info)
        async with TestServer(app) as server, session() as client:
            return await discover(client, str(server.make_url("")).rstrip("/"), 5)

    assert asyncio.run(run()) == Discovery("0.5.22", "demo", 16, 2, 7000, replay_port=7100)


@pytest.mark.parametrize(("page", "dp", "kv", "replay"), [(16, 2, 65535, None), (16, 2, 7000, 65535), (16, 0, 7000, None),
                                                           (0, 1, 7000, None), (16, 1, 0, None)])
def test_a_geometry_no_subscription_could_follow_is_refused_at_discovery(page: int, dp: int, kv: int,
                                                                          replay: int | None) -> None:
    """Rank r listens on ``base + r``: a last port past 65535 (or no rank, or no page) made every subscription
    of the worker fail inside the feeds' construction, after their context, wake pipe and sockets were made
    (leaked at each re-attestation). Discovery refuses it, so the ladder fences the worker as undiscoverable."""
    with pytest.raises(ValueError, match=r"must be at least 1|does not fit TCP ports"):
        Discovery("0.5.22", "demo", page, dp, kv, replay_port=replay)
    Discovery("0.5.22", "demo", 16, 2, 65534, replay_port=65534)  # the last rank on the last port: fine



def test_every_configurable_policy_comes_from_the_registry_under_its_own_name() -> None:
    assert set(POLICIES) == set(config.POLICIES)
    for name in config.POLICIES:
        cfg = msgspec.structs.replace(config.DEFAULTS, policy=name)
        assert make_policy(cfg, BlockIndex(), ChainCache()).name == name

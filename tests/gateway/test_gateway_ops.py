"""The gateway as an operator runs it: probes, errors, the admin listener, request ids, logs, metrics
(parsed with prometheus_client), the Grafana dashboard's queries, tracing, DNS-discovered workers.

Gateways are served in this process on real ports (tests/gateway/inproc.py); one simulated worker
process is shared by the module.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from cacheon.errors import UsageError
from cacheon.gateway.app import admin_token
from cacheon.gateway.config import TracingConfig, parse
from cacheon.gateway.logs import JsonFormatter, TextFormatter
from cacheon.gateway.tracing import Tracing
from cacheon.sim.launch import SimProcess, wait_until
from cacheon.sim.tokenizer import gateway_model
from tests.conftest import REPO
from tests.gateway.inproc import InProcessGateway, LoopThread, Recorder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # a simulated worker process for the module
DASHBOARD = REPO / "deploy" / "grafana" / "cacheon-gateway.json"
PROMPT = "Routing by prefix keeps the KV cache hot across the turns of a conversation. " * 3
TOKEN = "s3cret-admin-token"


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory, profile: tuple[Path, Path]) -> Iterator[SimProcess]:
    with ExitStack() as stack:
        worker = SimProcess(stack, tmp_path_factory.mktemp("sim"), profile, "0.5.23", replay=True, delay_ms=20)
        worker.ready()
        yield worker


@pytest.fixture(scope="module")
def exact(loop: LoopThread, sim: SimProcess, profile: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[InProcessGateway]:
    """An exact gateway over the worker, READY, with an admin token and a small body bound."""
    gw = InProcessGateway(loop, {"policy": "exact", "workers": [{"url": sim.url, "id": "sim0"}],
                                 "models": {"demo": gateway_model(*profile)}, "max_body_bytes": 64 << 10,
                                 "admin": {"listen": "127.0.0.1:0", "token": TOKEN}},
                          tmp_path_factory.mktemp("gw"))
    wait_until(lambda: httpx.get(f"{gw.url}/readyz").status_code == 200, "the exact gateway to be ready", 30)
    yield gw
    gw.close()


def complete(url: str, headers: dict[str, str] | None = None, **body: object) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"model": "demo", "prompt": PROMPT, "max_tokens": 2, **body},
                      headers=headers, timeout=30)


def test_probes_tell_a_live_gateway_from_a_ready_one(loop: LoopThread, exact: InProcessGateway,
                                                     profile: tuple[Path, Path], tmp_path: Path) -> None:
    assert httpx.get(f"{exact.url}/livez").json() == {"status": "ok"}
    ready = httpx.get(f"{exact.url}/readyz")
    assert ready.status_code == 200 and ready.json()["usable"] == 1
    assert httpx.get(f"{exact.url}/health").status_code == 200  # an alias of readiness
    # Every worker down: alive, not ready, and it says why.
    down = InProcessGateway(loop, {"policy": "exact", "workers": [{"url": "http://127.0.0.1:9"}],
                                   "models": {"demo": gateway_model(*profile)}}, tmp_path)
    try:
        assert httpx.get(f"{down.url}/livez").status_code == 200
        not_ready = httpx.get(f"{down.url}/readyz")
        assert not_ready.status_code == 503 and not_ready.json()["reason"].startswith(
            "no READY workers with live KV subscriptions")
        assert httpx.get(f"{down.url}/health").status_code == 503
    finally:
        down.close()


@pytest.mark.parametrize(
    ("method", "path", "content", "status", "message"),
    [
        ("POST", "/v1/completions", b"{not json", 400, "the request body is not valid JSON"),
        ("POST", "/v1/completions", b"", 400, "the request body is empty: send a JSON object"),
        ("POST", "/v1/completions", b"[1, 2]", 400, "the request body must be a JSON object, got an array"),
        ("POST", "/v1/completions", b'{"prompt": "x"}', 400, "'model' is required"),
        ("POST", "/v1/completions", b'{"model": 7, "prompt": "x"}', 400, "'model' must be a string, got a number"),
        ("POST", "/v1/completions", b'{"model": "nope", "prompt": "x"}', 404, "The model 'nope' does not exist"),
        ("POST", "/v1/completions", b'{"model": "demo", "prompt": "x", "stream": "yes"}', 400,
         "'stream' must be a boolean, got a string"),
        ("POST", "/v1/chat/completions", b'{"model": "demo", "messages": "hi"}', 400,
         "'messages' must be a list of messages, got a string"),
        ("POST", "/v1/chat/completions", b'{"model": "demo", "messages": [{"content": "hi"}]}', 400,
         "messages[0] must be an object with a string 'role'"),
        ("POST", "/v1/completions", b'{"model": "demo", "prompt": "' + b"x" * (70 << 10) + b'"}', 413,
         "larger than the gateway's max_body_bytes (65536)"),
        ("GET", "/v1/embeddings", None, 404, "no route GET /v1/embeddings"),
        ("GET", "/v1/completions", None, 405, "GET is not allowed on /v1/completions (use POST)"),
        ("POST", "/workers", b"{}", 404, "no route POST /workers"),  # admin lives on its own listener
    ],
)
def test_every_error_is_openai_shaped_and_says_what_is_wrong(exact: InProcessGateway, method: str, path: str,
                                                             content: bytes | None, status: int,
                                                             message: str) -> None:
    r = httpx.request(method, f"{exact.url}{path}", content=content, timeout=30,
                      headers={"content-type": "application/json"})
    assert r.status_code == status
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and message in error["message"], error


def test_the_admin_listener_needs_its_token(exact: InProcessGateway) -> None:
    admin, auth = exact.admin_url, {"Authorization": f"Bearer {TOKEN}"}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        r = httpx.get(f"{admin}/workers", headers=headers)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
        assert r.json()["error"]["code"] == "unauthorized"
    listed = httpx.get(f"{admin}/workers", headers=auth).json()
    assert [w["id"] for w in listed] == ["sim0"]
    one = httpx.get(f"{admin}/workers/sim0", headers=auth).json()
    assert one["ladder"]["state"] == "READY" and re.fullmatch(r"[0-9a-f]{16}", one["index_digest"])
    assert httpx.get(f"{admin}/workers/nobody", headers=auth).json()["error"]["code"] == "worker_not_found"
    bad = httpx.post(f"{admin}/workers", headers=auth, json={"url": "ftp://x"})
    assert bad.status_code == 400 and "url: 'ftp://x' is not http(s)://HOST:PORT" in bad.json()["error"]["message"]
    bad = httpx.post(f"{admin}/workers/sim0/drain", headers=auth, json={"deadline_s": "soon"})
    assert bad.status_code == 400 and "deadline_s must be a number" in bad.json()["error"]["message"]
    assert httpx.get(f"{admin}/nothing", headers=auth).status_code == 404


def test_an_admin_listener_off_loopback_must_have_a_token(tmp_path: Path) -> None:
    exposed = parse({"policy": "rr", "admin": {"listen": "0.0.0.0:8081"}}, tmp_path, {})
    with pytest.raises(UsageError, match=re.escape("admin.listen 0.0.0.0:8081 is not a loopback address: set")):
        admin_token(exposed)
    (tmp_path / "token").write_text("from-a-file\n")
    assert admin_token(parse({"policy": "rr", "admin": {"listen": "0.0.0.0:8081", "token_file": str(
        tmp_path / "token")}}, tmp_path, {})) == "from-a-file"
    assert admin_token(parse({"policy": "rr"}, tmp_path, {})) is None  # loopback: no token needed


def test_request_ids_reach_the_worker_and_come_back(loop: LoopThread, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder(loop)
    gw = InProcessGateway(loop, {"policy": "rr", "workers": [{"url": recorder.url, "id": "rec"}]}, tmp_path)
    try:
        wait_until(lambda: httpx.get(f"{gw.url}/readyz").status_code == 200, "the recorder to be healthy", 20)
        with caplog.at_level(logging.INFO, logger="cacheon.access"):
            given = complete(gw.url, {"x-request-id": "req-42"})
            fresh = complete(gw.url, stream=True)
            hostile = complete(gw.url, {"x-request-id": "x" * 500})
            # A line is written once its answer is (a client may read the answer first): wait for the three.
            wait_until(lambda: sum(r.name == "cacheon.access" for r in caplog.records) == 3, "three access lines", 10)
        assert given.headers["x-request-id"] == "req-42" and recorder.headers[0]["x-request-id"] == "req-42"
        assert re.fullmatch(r"[0-9a-f]{32}", fresh.headers["x-request-id"])
        assert recorder.headers[1]["x-request-id"] == fresh.headers["x-request-id"]
        assert hostile.headers["x-request-id"] != "x" * 500  # not a sane token: a fresh one instead
        lines = [r for r in caplog.records if r.name == "cacheon.access"]
        fields = {r.fields["request_id"]: r.fields for r in lines}  # type: ignore[attr-defined]  # set by extra=
        first = fields["req-42"]
        assert (first["status"], first["model"], first["route"], first["worker"], first["stream"]) == (
            200, "demo", "rr:round_robin", "rec", False)
        assert first["latency_ms"] > 0 and first["predicted_cached_tokens"] == 0
        streamed = fields[fresh.headers["x-request-id"]]
        assert 0 < streamed["route_ms"] < streamed["ttft_ms"] <= streamed["latency_ms"]
        assert 0 < first["route_ms"] < first["latency_ms"]
    finally:
        gw.close()
        recorder.close()


def test_a_worker_answering_requests_is_not_probed_a_quiet_one_is(loop: LoopThread, tmp_path: Path) -> None:
    """A health probe is skipped while the worker answered within the interval (on SGLang a probe generates a
    token): under steady traffic none go out; once it is quiet they come back at the cadence."""
    recorder = Recorder(loop)
    gw = InProcessGateway(loop, {"policy": "rr", "health_interval_s": 0.2,
                                 "workers": [{"url": recorder.url, "id": "rec"}]}, tmp_path)
    try:
        wait_until(lambda: httpx.get(f"{gw.url}/readyz").status_code == 200, "the recorder to be healthy", 20)
        busy_until, before = time.monotonic() + 1.2, recorder.probes
        while time.monotonic() < busy_until:
            assert complete(gw.url).status_code == 200
            time.sleep(0.02)
        busy = recorder.probes - before
        time.sleep(1.2)
        quiet = recorder.probes - before - busy
        assert busy <= 1 and quiet >= 3, (busy, quiet)  # one may start before the first answer lands
    finally:
        gw.close()
        recorder.close()


def test_log_lines_as_text_and_as_json() -> None:
    record = logging.LogRecord("cacheon.access", logging.INFO, __file__, 1, "POST /v1/completions 200", None, None)
    record.fields = {"request_id": "r1", "latency_ms": 1.5, "route": "exact:prefix_hit", "error": None,
                     "detail": "two words"}
    parsed = json.loads(JsonFormatter().format(record))
    assert parsed["message"] == "POST /v1/completions 200" and parsed["level"] == "info"
    assert parsed["request_id"] == "r1" and parsed["latency_ms"] == 1.5 and parsed["logger"] == "cacheon.access"
    text = TextFormatter().format(record)
    assert text.endswith('request_id=r1 latency_ms=1.5 route=exact:prefix_hit detail="two words"')


def _families(url: str) -> dict[str, list]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


# The series names a family of each type exposes, whether or not it has a sample yet.
SERIES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count"), "info": ("_info",),
          "summary": ("_sum", "_count", ""), "unknown": ("",)}


def test_metrics_cover_latency_state_index_and_rejects(exact: InProcessGateway) -> None:
    assert complete(exact.url).status_code == 200
    with httpx.stream("POST", f"{exact.url}/v1/completions", timeout=30,
                      json={"model": "demo", "prompt": PROMPT, "max_tokens": 3, "stream": True}) as r:
        assert r.status_code == 200 and list(r.iter_lines())
    complete(exact.url, model=7)  # a refusal
    wait_until(lambda: httpx.get(f"{exact.admin_url}/workers/sim0", headers={"Authorization": f"Bearer {TOKEN}"})
               .json()["indexed_blocks"] > 0, "KV events indexed", 20)
    got = _families(exact.url)
    latency = [s for s in got["cacheon_request_duration_seconds"] if s.name.endswith("_count")]
    assert {(s.labels["worker"], s.labels["model"]) for s in latency} == {("sim0", "demo")}
    assert {s.labels["route"].split(":")[0] for s in latency} == {"exact"}
    ttft = [s for s in got["cacheon_time_to_first_token_seconds"] if s.name.endswith("_count")]
    assert sum(s.value for s in ttft) == 1  # the one stream
    states = {s.labels["state"]: s.value for s in got["cacheon_worker_state"] if s.labels["worker"] == "sim0"}
    assert len(states) == 6 and states["READY"] == 1 and sum(states.values()) == 1
    assert [s.value for s in got["cacheon_worker_in_flight"]] == [0]
    assert got["cacheon_index_blocks"][0].value > 0 and got["cacheon_index_digest"][0].value > 0
    assert 0 <= got["cacheon_kv_event_lag_seconds"][0].value < 60
    rejects = {s.labels["reason"]: s.value for s in got["cacheon_request_rejects"] if s.name.endswith("_total")}
    assert rejects["bad_request"] >= 1
    assert got["process_cpu_seconds"][0].value > 0 and "process_resident_memory_bytes" in got


def test_every_dashboard_query_names_an_exported_metric(exact: InProcessGateway) -> None:
    text = httpx.get(f"{exact.url}/metrics", timeout=30).text
    exported = {f.name + suffix for f in text_string_to_metric_families(text) for suffix in SERIES[f.type]}
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        names = {n for t in panel["targets"] for n in re.findall(r"\b(?:cacheon|process)_[a-z0-9_]+", t["expr"])}
        assert names, f"panel {panel['title']!r} queries no gateway metric"
        missing = names - exported
        assert not missing, f"panel {panel['title']!r} queries {sorted(missing)}, not exported"


def test_a_span_per_request_carries_the_route_and_its_context_goes_upstream(loop: LoopThread,
                                                                           tmp_path: Path) -> None:
    spans = InMemorySpanExporter()
    tracing = Tracing(TracingConfig(enabled=True), processor=SimpleSpanProcessor(spans))
    recorder = Recorder(loop)
    gw = InProcessGateway(loop, {"policy": "rr", "workers": [{"url": recorder.url, "id": "rec"}]}, tmp_path,
                          tracing=tracing)
    try:
        wait_until(lambda: httpx.get(f"{gw.url}/readyz").status_code == 200, "the recorder to be healthy", 20)
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        assert complete(gw.url, {"traceparent": parent, "x-request-id": "traced"}).status_code == 200
        # The span ends where the outcome is recorded, once the answer is written: a client may read it first.
        wait_until(lambda: len(spans.get_finished_spans()) == 1, "the request's span", 10)
        (span,) = spans.get_finished_spans()
        assert span.name == "POST /v1/completions" and f"{span.context.trace_id:032x}" == parent.split("-")[1]
        attrs = dict(span.attributes or {})
        assert (attrs["cacheon.route"], attrs["cacheon.worker"], attrs["http.response.status_code"],
                attrs["cacheon.request_id"]) == ("rr:round_robin", "rec", 200, "traced")
        upstream = recorder.headers[-1]["traceparent"]
        assert upstream.split("-")[1] == parent.split("-")[1] and upstream.split("-")[2] == f"{span.context.span_id:016x}"
    finally:
        gw.close()
        recorder.close()


def test_workers_from_a_dns_name_come_and_go(loop: LoopThread, sim: SimProcess, tmp_path: Path) -> None:
    """A headless Service's name resolves to its pods' addresses: here localhost to 127.0.0.1 (and maybe ::1)."""
    gw = InProcessGateway(loop, {"policy": "rr", "workers_dns": [{"name": "localhost", "port": sim.port,
                                                                  "interval_s": 0.2}]}, tmp_path)
    try:
        def found() -> dict | None:
            workers = {w["url"]: w for w in gw.loop.call(_status(gw))["workers"]}
            return workers.get(sim.url)

        worker = wait_until(found, "the DNS-discovered worker", 20)
        assert worker["origin"] == "dns:localhost"
        assert complete(gw.url).headers["x-cacheon-worker"] in {sim.url, sim.url.replace("127.0.0.1", "[::1]")}
    finally:
        gw.close()


async def _status(gw: InProcessGateway) -> dict:
    return await gw.gateway.status()


def test_ladder_transitions_are_logged_with_their_reasons(loop: LoopThread, sim: SimProcess,
                                                          profile: tuple[Path, Path], tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="cacheon.gateway"):
        gw = InProcessGateway(loop, {"policy": "exact", "models": {"demo": gateway_model(*profile)},
                                     "workers": [{"url": sim.url, "id": "good"}, {"url": "http://127.0.0.1:9",
                                                                                 "id": "gone"}]}, tmp_path)
        try:
            wait_until(lambda: httpx.get(f"{gw.url}/readyz").status_code == 200, "the worker READY", 30)
            wait_until(lambda: any(r.fields.get("to") == "FENCED" for r in caplog.records  # type: ignore[attr-defined]
                                   if hasattr(r, "fields")), "the unreachable one fenced", 30)
        finally:
            gw.close()
    moves = [(r.fields["worker"], r.fields["from"], r.fields["to"], r.fields["reason"])  # type: ignore[attr-defined]
             for r in caplog.records if r.name == "cacheon.gateway" and "to" in getattr(r, "fields", {})]
    assert [m[2] for m in moves if m[0] == "good"] == ["PROFILE_VALIDATED", "TOKEN_PARITY_VERIFIED",
                                                       "ENGINE_HASH_ATTESTED", "READY"]
    assert ("gone", "PENDING", "FENCED", "unreachable") in moves
    fenced = next(r for r in caplog.records if getattr(r, "fields", {}).get("to") == "FENCED")
    assert fenced.levelno == logging.WARNING and fenced.fields["detail"]  # type: ignore[attr-defined]

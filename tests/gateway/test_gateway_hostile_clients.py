"""Clients that never finish, web pages that reach for the admin API, worker URLs that are not one,
and the gateway named as its own worker (issue 21). Gateways are served in this process on real ports
(tests/gateway/inproc.py) in front of a header-recording worker; the sockets below are raw TCP."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cacheon.errors import UsageError
from cacheon.gateway.config import parse, worker_spec
from cacheon.sim.launch import wait_until
from tests.gateway.inproc import InProcessGateway, LoopThread, Recorder

DEADLINE_S = 0.5  # keepalive_timeout_s and body_timeout_s of the gateway below
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def recorder(loop: LoopThread) -> Iterator[Recorder]:
    worker = Recorder(loop)
    yield worker
    worker.close()


@pytest.fixture(scope="module")
def gw(loop: LoopThread, recorder: Recorder, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessGateway]:
    gateway = InProcessGateway(loop, {"policy": "rr", "workers": [{"url": recorder.url, "id": "rec"}],
                                      "keepalive_timeout_s": DEADLINE_S, "body_timeout_s": DEADLINE_S},
                               tmp_path_factory.mktemp("gw"))
    wait_until(lambda: httpx.get(f"{gateway.url}/readyz").status_code == 200, "the recorder to be healthy", 20)
    yield gateway
    gateway.close()


def _open(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def _closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> float | None:
    """Seconds until the server closed ``sock`` (None: still open after ``seconds``), sending ``trickle``
    one byte every 0.1 s meanwhile. Whatever the server answers before closing is read and dropped."""
    start = time.monotonic()
    sent = 0
    while time.monotonic() - start < seconds:
        readable, _, _ = select.select([sock], [], [], 0.1)
        if readable:
            try:
                if not sock.recv(65536):
                    return time.monotonic() - start
            except ConnectionResetError:
                return time.monotonic() - start
        if sent < len(trickle):
            try:
                sock.send(trickle[sent:sent + 1])
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - start
            sent += 1
    return None


HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


@pytest.mark.parametrize(
    ("listener", "opening", "trickle"),
    [
        ("traffic", HEAD, b""),  # headers that never end
        ("traffic", HEAD, b"X-Slow: " + b"a" * 100),  # headers that keep coming, a byte at a time
        ("traffic", HEAD + b"Content-Length: 1000\r\n\r\n{\"model\"", b""),  # a body that never ends
        ("traffic", HEAD + b"Content-Length: 1000\r\n\r\n{\"model\"", b": " + b" " * 100),  # nor ends slowly
        ("traffic", HEAD + b"Transfer-Encoding: chunked\r\n\r\n10\r\n{\"model\"", b""),  # chunks that never end
        ("traffic", b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b""),  # idle after its answer
        ("admin", b"POST /workers HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{", b""),
        ("admin", b"GET /workers HTTP/1.1\r\nHost: 127.0.0", b""),
    ],
    ids=["partial-head", "trickled-head", "partial-body", "trickled-body", "partial-chunked-body", "idle-keep-alive", "admin-partial-body",
         "admin-partial-head"],
)
def test_connections_that_never_finish_a_request_are_closed(gw: InProcessGateway, listener: str, opening: bytes,
                                                            trickle: bytes) -> None:
    with _open(gw.url if listener == "traffic" else str(gw.admin_url)) as sock:
        sock.sendall(opening)
        took = _closed_within(sock, 10 * DEADLINE_S + 2, trickle)
    assert took is not None, f"{listener}: still open after {10 * DEADLINE_S + 2} s"
    assert took >= DEADLINE_S * 0.8
    assert httpx.get(f"{gw.url}/livez").status_code == 200  # and the gateway serves on


def test_a_request_that_finishes_in_time_is_served(gw: InProcessGateway) -> None:
    body = b'{"model": "m", "prompt": "hi", "max_tokens": 1}'
    with _open(gw.url) as sock:
        sock.sendall(HEAD + f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:10])
        time.sleep(DEADLINE_S / 4)
        sock.sendall(body[10:])
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://w:99999", "port out of range 0-65535"),
        ("http://w:abc", "port could not be cast to integer value as 'abc'"),
        ("http://w:1\r\nX-Injected: 1", "whitespace or a control character"),
        ("http://w:1\n", "whitespace or a control character"),
        ("http://[::1:1", "invalid ipv6 url"),
        ("http://[w]:1", "'w' does not appear to be an ipv4 or ipv6 address"),
        ("http://[v1.x]:1", "'v1.x' is not an IPv6 address"),
        ("http://[::1]x:1", "'[::1]x:1' is not [IPv6]:PORT"),
        ("http://a[::1]:1", "'a[::1]:1' is not [IPv6]:PORT"),
        ("http://[1.2.3.4]:1", "an ipv4 address cannot be in brackets"),
        ("ftp://w:1", "scheme 'ftp'"),
        ("unix:///run/sglang.sock", "scheme 'unix'"),
        ("w:1", "scheme 'w'"),
        ("//w:1", "no scheme"),
        ("http://:1", "no host"),
        ("http://w:0", "port 0"),
        ("http://user:pw@w:1", "user info"),
        ("http://w:1/v1?x=1", "a path, query or fragment"),
        ("http://w:1#f", "a path, query or fragment"),
        ("http://w w:1", "whitespace or a control character"),
        ("http://w..x:1", "host 'w..x'"),
        ("http://-w:1", "host '-w'"),
        ("http://wörker:1", "whitespace or a control character"),
    ],
)
def test_a_worker_url_that_is_not_one_is_a_config_and_an_admin_error(gw: InProcessGateway, url: str,
                                                                      why: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError) as raised:
        parse({"policy": "rr", "workers": [{"url": url}]}, tmp_path, {})
    assert str(raised.value) == f"workers[0].url: {url!r} is not http(s)://HOST:PORT ({why})", raised.value
    r = httpx.post(f"{gw.admin_url}/workers", json={"url": url})
    assert r.status_code == 400 and why in r.json()["error"]["message"], r.text


def test_worker_urls_that_are_one() -> None:
    for url, kept in [("http://w0:30000/", "http://w0:30000"), ("https://10.0.0.2", "https://10.0.0.2"),
                      ("http://[::1]:30000", "http://[::1]:30000"), ("http://sglang-0.sglang.ns.svc:30000",
                                                                     "http://sglang-0.sglang.ns.svc:30000")]:
        assert worker_spec({"url": url}).url == kept


def _admin(gw: InProcessGateway, method: str, path: str, **kwargs: object) -> httpx.Response:
    return httpx.request(method, f"{gw.admin_url}{path}", timeout=10, **kwargs)  # type: ignore[arg-type]


def test_the_gateway_refuses_itself_as_a_worker(gw: InProcessGateway, tmp_path: Path) -> None:
    port = gw.url.rsplit(":", 1)[1]
    admin_port = str(gw.admin_url).rsplit(":", 1)[1]
    for url in (gw.url, f"http://localhost:{port}", f"http://0.0.0.0:{port}", str(gw.admin_url),
                f"http://[::ffff:127.0.0.1]:{port}", f"http://127.1:{port}", f"http://2130706433:{port}"):
        r = _admin(gw, "POST", "/workers", json={"url": url})
        assert r.status_code == 400 and "is this gateway's own listener" in r.json()["error"]["message"], (url, r.text)
    assert [w["id"] for w in _admin(gw, "GET", "/workers").json()] == ["rec"]
    # In the config file too: the start fails in one line, naming the entry.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    with pytest.raises(UsageError, match=r"^workers\[0\]: http://localhost:\d+ is this gateway's own listener"):
        InProcessGateway(gw.loop, {"policy": "rr", "listen": f"0.0.0.0:{free}",
                                   "workers": [{"url": f"http://localhost:{free}"}]}, tmp_path)
    assert admin_port != port


def test_the_same_engine_under_another_name_is_refused(gw: InProcessGateway, recorder: Recorder) -> None:
    port = recorder.url.rsplit(":", 1)[1]
    for alias in (f"http://localhost:{port}", f"http://127.0.0.1:{port}/"):
        r = _admin(gw, "POST", "/workers", json={"url": alias})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"] in (
            "worker rec (" + recorder.url + ") is already registered",
            f"{alias} is worker rec ({recorder.url}) under another name: both reach 127.0.0.1:{port}")
    assert [w["id"] for w in _admin(gw, "GET", "/workers").json()] == ["rec"]


def test_the_traffic_port_status_shows_no_worker_urls_reasons_or_ids(gw: InProcessGateway,
                                                                     recorder: Recorder) -> None:
    public = httpx.get(f"{gw.url}/status").json()
    assert public == {"ready": True, "policy": "rr", "workers": 1, "available": 1, "usable": 1, "models": [],
                      "states": {"PENDING": 1}}
    assert recorder.url.split("//")[1] not in httpx.get(f"{gw.url}/status").text
    full = _admin(gw, "GET", "/status").json()
    assert [w["url"] for w in full["workers"]] == [recorder.url]


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        ({"content-type": "text/plain"}, 415, "needs 'Content-Type: application/json' (got 'text/plain')"),
        ({"content-type": "application/x-www-form-urlencoded"}, 415, "needs 'Content-Type: application/json'"),
        ({}, 415, "needs 'Content-Type: application/json' (got 'application/octet-stream')"),
        ({**JSON, "origin": "https://evil.example"}, 403, "cross-origin request from 'https://evil.example'"),
        ({**JSON, "origin": "null"}, 403, "cross-origin request from 'null'"),
        ({**JSON, "sec-fetch-site": "cross-site"}, 403, "a cross-site request from a web page"),
        ({**JSON, "host": "evil.example:8081"}, 403, "Host 'evil.example:8081' is not this loopback listener"),
        ({**JSON, "host": "evil.example:8081", "origin": "http://evil.example:8081"}, 403,
         "Host 'evil.example:8081' is not this loopback listener"),  # DNS rebinding: same-origin, wrong host
        ({**JSON, "host": "127.0.0.1.evil.example"}, 403, "is not this loopback listener"),
        ({**JSON, "host": "evil@127.0.0.1:8081"}, 403, "is not this loopback listener"),
        ({**JSON, "host": "localhost.evil.example:8081"}, 403, "is not this loopback listener"),
    ],
)
def test_the_admin_api_refuses_what_a_web_page_can_send(gw: InProcessGateway, headers: dict[str, str], status: int,
                                                        message: str) -> None:
    for method, path in (("POST", "/workers"), ("POST", "/workers/rec/drain?deadline_s=0"),
                         ("POST", "/config/reload")):
        r = _admin(gw, method, path, content=b'{"url": "http://127.0.0.1:9"}', headers=headers)
        assert r.status_code == status and message in r.json()["error"]["message"], (path, r.text)
    listed = _admin(gw, "GET", "/workers").json()
    assert [(w["id"], w["draining"]) for w in listed] == [("rec", False)]


def test_the_admin_api_takes_what_an_operator_sends(gw: InProcessGateway) -> None:
    admin = str(gw.admin_url)
    same_origin = {**JSON, "origin": admin, "sec-fetch-site": "same-origin"}  # a page the admin listener served
    assert _admin(gw, "GET", "/workers", headers=same_origin).status_code == 200
    for host in ("localhost", "127.0.0.1", "[::1]"):
        assert _admin(gw, "GET", "/status", headers={"host": f"{host}:{admin.rsplit(':', 1)[1]}"}).status_code == 200
    r = _admin(gw, "POST", "/config/reload", headers=JSON)
    assert r.status_code == 409 and r.json()["error"]["code"] == "no_config_file"  # served without a file


def test_a_missing_token_file_is_created_with_a_fresh_token_only_its_owner_reads(loop: LoopThread,
                                                                                  tmp_path: Path) -> None:
    path = tmp_path / "admin-token"
    gateway = InProcessGateway(loop, {"policy": "rr", "admin": {"listen": "127.0.0.1:0", "token_file": str(path)}},
                               tmp_path)
    try:
        token = path.read_text().strip()
        assert len(token) >= 32 and (path.stat().st_mode & 0o777) == 0o600
        assert httpx.get(f"{gateway.admin_url}/workers").status_code == 401
        assert httpx.get(f"{gateway.admin_url}/workers", headers={"Authorization": f"Bearer {token}"}).json() == []
    finally:
        gateway.close()
    again = InProcessGateway(loop, {"policy": "rr", "admin": {"listen": "127.0.0.1:0", "token_file": str(path)}},
                             tmp_path)  # an existing file is read, never replaced
    try:
        assert path.read_text().strip() == token and again.server.token == token
    finally:
        again.close()

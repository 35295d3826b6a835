"""The gateway's dashboard in a real browser: Debian's headless Chromium, driven by Playwright.

Two simulated workers behind an exact gateway served in this process; the page is opened on the
admin listener with its token, shows both workers READY with their contract, page size, index
and digest, the charts and a refusal by its request id, and, without a reload, shows a worker
DRAINING once the admin API drains it. The screenshot it takes is the one docs/operations.md
shows (``CACHEON_DOCS_SCREENSHOT=1`` writes it to docs/assets/).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from cacheon.sim.launch import SimProcess, wait_until
from cacheon.sim.tokenizer import gateway_model
from tests.conftest import REPO
from tests.gateway.inproc import InProcessGateway, LoopThread

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
TOKEN = "dashboard-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CHROMIUM = "/usr/bin/chromium"  # scripts/install_system_packages.sh installs Debian's
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOT = REPO / "docs" / "assets" / "gateway-dashboard.png"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, profile: tuple[Path, Path]) -> Iterator[InProcessGateway]:
    access = logging.getLogger("cacheon.access")
    level = access.level
    access.setLevel(logging.INFO)  # as `cacheon gateway` logs by default (--log-level info)
    loop = LoopThread()
    with ExitStack() as stack:
        sims = [SimProcess(stack, tmp_path_factory.mktemp("sim"), profile, "0.5.23") for _ in range(2)]
        for sim in sims:
            sim.ready()
        gw = InProcessGateway(loop, {"policy": "exact", "models": {"demo": gateway_model(*profile)},
                                     "workers": [{"url": s.url, "id": f"sim{i}"} for i, s in enumerate(sims)],
                                     "admin": {"listen": "127.0.0.1:0", "token": TOKEN}},
                              tmp_path_factory.mktemp("gw"))
        try:
            wait_until(lambda: all(w["ladder"]["state"] == "READY" for w in
                                   httpx.get(f"{gw.admin_url}/workers", headers=AUTH).json()), "both READY", 30)
            yield gw
        finally:
            gw.close()
            loop.close()
            access.setLevel(level)


def test_the_state_needs_the_token_and_the_page_carries_no_data(gateway: InProcessGateway) -> None:
    admin = gateway.admin_url
    assert httpx.get(f"{admin}/dashboard/state").status_code == 401
    assert httpx.get(f"{admin}/dashboard/state", headers={"Authorization": "Bearer wrong"}).status_code == 401
    page = httpx.get(f"{admin}/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert "sim0" not in page.text
    assert httpx.get(f"{gateway.url}/dashboard").status_code == 404  # the traffic listener has none
    state = httpx.get(f"{admin}/dashboard/state", headers=AUTH).json()
    assert [w["id"] for w in state["workers"]] == ["sim0", "sim1"]
    assert [w["page_size"] for w in state["workers"]] == [4, 4]


def test_the_dashboard_renders_the_live_workers_and_follows_a_drain(gateway: InProcessGateway,
                                                                     tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    prompt = "Routing by prefix keeps the KV cache hot across the turns of a conversation. "
    for turn in range(6):
        ok = httpx.post(f"{gateway.url}/v1/completions", json={"model": "demo", "prompt": prompt * (turn + 1),
                                                              "max_tokens": 2}, timeout=30)
        assert ok.status_code == 200, ok.text
    refused = httpx.post(f"{gateway.url}/v1/completions", json={"model": "nobody", "prompt": "hi"},
                         headers={"x-request-id": "dashboard-refused-1"}, timeout=30)
    assert refused.status_code in (400, 404), refused.text

    admin = gateway.admin_url
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            errors: list[str] = []
            asked: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: asked.append(r.url))
            page.goto(f"{admin}/dashboard#token={TOKEN}")
            for wid in ("sim0", "sim1"):
                page.wait_for_selector(f"tr[data-worker={wid}] td.state:text-is('READY')", timeout=15_000)
            assert page.locator("#login").is_hidden()  # the token was taken: no prompt for it
            row = page.locator("tr[data-worker=sim0]")
            assert row.locator("td.contract").inner_text().startswith("sglang")
            assert row.locator("td.page").inner_text() == "4"
            assert int(page.locator("tr[data-worker=sim0] td.blocks").inner_text()) + int(
                page.locator("tr[data-worker=sim1] td.blocks").inner_text()) > 0
            assert len(row.locator("td.digest").inner_text()) == 16
            assert row.locator("td.breaker").inner_text() == "closed"
            page.wait_for_selector("#refusals td.request-id:text-is('dashboard-refused-1')")
            assert page.locator("#rate polyline.series").count() == 1
            assert page.locator("#latency rect.bar").count() > 0
            assert "token" not in page.url  # taken from the fragment, then dropped from the address bar
            page.evaluate("window.notReloaded = true")

            drained = httpx.post(f"{admin}/workers/sim1/drain", headers=AUTH, json={"deadline_s": 0})
            assert drained.status_code == 200, drained.text
            page.wait_for_selector("tr[data-worker=sim1] td.state:text-is('DRAINING')", timeout=15_000)
            assert page.evaluate("window.notReloaded") is True  # the page updated itself
            assert page.locator("tr[data-worker=sim0] td.state").inner_text() == "READY"
            shot = tmp_path / "gateway-dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            assert errors == []
            assert asked and all(url.startswith(admin) for url in asked), asked  # nothing from elsewhere
        finally:
            browser.close()
    assert shot.read_bytes().startswith(b"\x89PNG")
    if os.environ.get("CACHEON_DOCS_SCREENSHOT") == "1":
        shutil.copyfile(shot, SCREENSHOT)

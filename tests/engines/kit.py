"""The conformance kit: captures from real servers, committed under tests/fixtures/engines/.

One file per (release, page size): the scenario's requests (the tokens behind every frame), every
frame the server published (base64 payloads, in seq order), and what the engine's own events say
each request's full pages are called (``published``: read from the frames, not from Cacheon's
hashing). Known-answer tests replay them without a server (tests/engines/test_conformance_kit.py);
scripts/record_engine_captures.py records them again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.engines import captures
from tests.engines.server import EngineServer

KIT = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
PAGE_SIZES = (1, 16)
SCHEMA = 1


def kit_path(release: str, page_size: int) -> Path:
    return KIT / f"sglang-{release}-p{page_size}.json"


def record(server: EngineServer) -> dict[str, Any]:
    """Run the scenario on a fresh server and describe it as a kit file."""
    capture = captures.run(server, salted=True)
    pages = captures.pages(capture.payloads())
    for step in capture.steps:
        step["published"] = captures.engine_chain(pages, step["input_ids"], capture.page_size, salt=step["cache_salt"])
        if step["cache_salt"] is not None and not step["published"]:
            # A release that puts no salt on the wire (the pin) stores salted pages as plain ones.
            step["published"] = captures.engine_chain(pages, step["input_ids"], capture.page_size)
            step["salt_on_wire"] = False
        elif step["cache_salt"] is not None:
            step["salt_on_wire"] = True
    info = server.get("/server_info")
    return {
        "schema": SCHEMA,
        "release": capture.release,
        "page_size": capture.page_size,
        "model": {k: server.model[k] for k in ("family", "architecture", "vocab_size", "bos_token_id", "seed")},
        "server_info": {"version": info.get("version"), "kv_events": info.get("kv_events")},
        "steps": capture.steps,
        "frames": [{k: f[k] for k in ("topic", "seq", "step", "payload")} for f in capture.frames],
    }


def write(data: dict[str, Any]) -> Path:
    path = kit_path(data["release"], data["page_size"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))

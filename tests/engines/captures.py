"""One fixed KV-event scenario against a real server, and what its frames say, derived from the frames alone.

The same scenario feeds the live hash-parity tests and the conformance kit
(tests/fixtures/engines/, re-recorded by scripts/record_engine_captures.py). What a capture
"expects" is read from the server's own events (which block id the engine gave each page of
tokens after which parent), never from Cacheon's hashing, so comparing the two is a real check.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import msgspec

from tests.engines.server import TOPIC, EngineServer

SALT = "tenant-a"


def prompt(seed: int, length: int, bos: int) -> list[int]:
    """A deterministic prompt of ``length`` token ids (BOS first) inside the tiny vocabulary."""
    return [bos] + [10 + (seed * 131 + i * 37) % 900 for i in range(length - 1)]


@dataclass(frozen=True)
class Step:
    name: str
    input_ids: list[int]
    cache_salt: str | None = None


def scenario(page_size: int, bos: int, *, salted: bool) -> list[Step]:
    """Cold prompt, its exact repeat, a branch after two pages, and (where the release takes it) a
    salted copy: at least three full pages at page size 16 plus a partial page."""
    base = prompt(1, 3 * 16 + 5, bos)
    other = prompt(2, 2 * 16 + 7, bos)
    steps = [
        Step("cold", base),
        Step("repeat", base),
        Step("branch", base[: 2 * 16] + other[1:]),
    ]
    if salted:
        steps.append(Step("salted", base, SALT))
    return steps


@dataclass
class Capture:
    release: str
    page_size: int
    steps: list[dict[str, Any]] = field(default_factory=list)
    frames: list[dict[str, Any]] = field(default_factory=list)  # {topic, seq, payload(base64)}

    def payloads(self) -> list[bytes]:
        return [base64.b64decode(f["payload"]) for f in self.frames]

    def to_json(self) -> dict[str, Any]:
        return {"release": self.release, "page_size": self.page_size, "steps": self.steps, "frames": self.frames}


def run(server: EngineServer, *, salted: bool, max_new_tokens: int = 4) -> Capture:
    """Drive the scenario through ``/v1/completions`` (token-id prompts, greedy), one step at a time,
    then collect every frame it published (gapless: holes filled by replay), each tagged with the
    step after which it arrived."""
    capture = Capture(server.spec.release, server.spec.page_size)
    bos = int(server.model["bos_token_id"])
    last_seq: list[tuple[int, str]] = []  # (highest seq seen after the step, step)
    for step in scenario(server.spec.page_size, bos, salted=salted):
        mark = server.feed.mark()
        body: dict[str, Any] = {
            "model": "tiny",
            "prompt": step.input_ids,
            "max_tokens": max_new_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        if step.cache_salt is not None:
            body["cache_salt"] = step.cache_salt
        answer = server.post("/v1/completions", body)
        arrived = server.feed.wait_quiet(mark)
        last_seq.append((max((seq for _, seq, _ in arrived), default=-1), step.name))
        capture.steps.append(
            {
                "name": step.name,
                "input_ids": step.input_ids,
                "cache_salt": step.cache_salt,
                # SGLang answers prompt_tokens_details: null when nothing was cached.
                "cached_tokens": (answer["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0),
                "prompt_tokens": answer["usage"]["prompt_tokens"],
                "usage": answer["usage"],
            }
        )
    for seq, payload in server.frames():
        name = next((n for top, n in last_seq if seq <= top), last_seq[-1][1])
        capture.frames.append({"topic": TOPIC, "seq": seq, "payload": base64.b64encode(payload).decode(), "step": name})
    return capture


def raw_events(payload: bytes) -> list[Any]:
    """The events of one payload, schema-free (tagged arrays or tagged maps)."""
    return list(msgspec.msgpack.decode(payload)[1])


def stored_blocks(event: Any) -> tuple[list[int], int | None, list[int], int, str | None] | None:
    """(block_hashes, parent, token_ids, block_size, cache_salt) of a BlockStored, else None."""
    if isinstance(event, dict):
        if event.get("type") != "BlockStored":
            return None
        return (event["block_hashes"], event["parent_block_hash"], event["token_ids"], event["block_size"],
                event.get("cache_salt"))  # fmt: skip
    if not event or event[0] != "BlockStored":
        return None
    metadata = event[7] if len(event) > 7 else None
    salt = metadata.get("cache_salt") if isinstance(metadata, dict) else None
    return event[1], event[2], event[3], event[4], salt


@dataclass(frozen=True)
class Page:
    """One page the engine stored: its id, its parent's id, its tokens and namespace."""

    block: int
    parent: int | None
    tokens: tuple[int, ...]
    salt: str | None


def pages(payloads: list[bytes]) -> list[Page]:
    """Every stored page in wire order, a merged BlockStored split into its pages."""
    out = []
    for payload in payloads:
        for event in raw_events(payload):
            stored = stored_blocks(event)
            if stored is None:
                continue
            hashes, parent, tokens, size, salt = stored
            assert len(tokens) == size * len(hashes), f"BlockStored with {len(tokens)} tokens for {len(hashes)} x {size}"
            for i, block in enumerate(hashes):
                out.append(Page(block, parent, tuple(tokens[i * size : (i + 1) * size]), salt))
                parent = block
    return out


def engine_chain(all_pages: list[Page], tokens: list[int], page_size: int, salt: str | None = None) -> list[int]:
    """The ids the engine published for ``tokens``' full pages, walking its own events from the root."""
    by_key = {(p.parent, p.tokens, p.salt): p.block for p in all_pages}
    chain: list[int] = []
    parent: int | None = None
    for start in range(0, len(tokens) - len(tokens) % page_size, page_size):
        block = by_key.get((parent, tuple(tokens[start : start + page_size]), salt))
        if block is None:
            break
        chain.append(block)
        parent = block
    return chain


def prefixes(all_pages: list[Page]) -> dict[int, tuple[int, ...]]:
    """Each published id -> every token from the root through its page (following parents)."""
    known: dict[int, tuple[int, ...]] = {}
    for page in all_pages:
        head = () if page.parent is None else known.get(page.parent)
        if head is None:
            raise AssertionError(f"block {page.block} names parent {page.parent}, which no earlier event stored")
        known[page.block] = head + page.tokens
    return known

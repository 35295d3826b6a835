"""Exact, self-checking tokenization cache for the repeated parts of prompts (chat history).

HF ``tokenizers`` splits text at added tokens before normalizing, pre-tokenizing and running the
model on each piece alone, so without added specials ``encode(text)`` is the concatenation over
pieces. A piece can still depend on its neighbours (Metaspace's prepend on the piece at offset 0,
an added token's lstrip/rstrip eating its whitespace), so each piece is encoded in a *window*
with its real neighbouring anchors, ``prev_anchor + piece + next_anchor``, and the window must
encode to ids that start and end with those anchors' ids. When any window fails that check the
whole text is encoded uncached: the cache can be slow, never wrong.

Anchors are added tokens matched before normalization (so the split above happens at them),
not touching whitespace (so no neighbour's strip reaches across them) and contained in no other
added token (so no longer match can span a window edge unseen by both windows).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from tokenizers import Tokenizer

from cacheon.gateway.hashing import Segment, Tokens
from cacheon.gateway.lru import BoundedLRU

Affixes = tuple[Segment, Segment]
WindowKey = tuple[int | None, int | None, str]  # previous anchor id, next anchor id, window text


def anchors(config: dict[str, Any], template: str, named: Iterable[str | None]) -> dict[str, int] | None:
    """Anchor text -> id from a tokenizer.json; None when the tokenizer must not be cached at all.

    Candidates are the specials the chat template writes and the ``named`` (bos/eos) tokens.
    single_word tokens depend on the characters around them, truncation and padding on the
    whole text: windows cannot reproduce either.
    """
    added = config.get("added_tokens") or []
    if any(t.get("single_word") for t in added) or config.get("truncation") or config.get("padding"):
        return None
    wanted = {name for name in named if name}
    contents = [t["content"] for t in added]
    return {t["content"]: t["id"] for t in added if _anchorable(t, contents) and (
        (t.get("special") and t["content"] in template) or t["content"] in wanted)}


def _anchorable(token: dict[str, Any], contents: list[str]) -> bool:
    """Matched before normalization, no whitespace at its ends, inside no other added token."""
    text = token["content"]
    return (not token.get("normalized") and bool(text) and text == text.strip()
            and not any(text in other and text != other for other in contents))


def _template_affixes(processor: dict[str, Any]) -> Affixes | None:
    """Ids around ``$A`` in a TemplateProcessing's single template, if it is specials, A, specials."""
    around: tuple[list[int], list[int]] = ([], [])
    side = 0
    for piece in processor.get("single", []):
        if "Sequence" in piece and side == 0 and piece["Sequence"].get("id") == "A":
            side = 1
        elif "SpecialToken" in piece:
            around[side].extend(processor["special_tokens"][piece["SpecialToken"]["id"]]["ids"])
        else:
            return None
    return (tuple(around[0]), tuple(around[1])) if side == 1 else None


def affixes(config: dict[str, Any]) -> Affixes | None:
    """The ids the post-processor puts around a single sequence; None when it does anything else.

    Absent and ByteLevel processors change offsets only; a Sequence may hold ByteLevels and one
    template.
    """
    processor = config.get("post_processor")
    if processor is None:
        return ((), ())
    steps = processor.get("processors", []) if processor.get("type") == "Sequence" else [processor]
    templates = [step for step in steps if step.get("type") == "TemplateProcessing"]
    if len(templates) > 1 or any(step.get("type") not in ("ByteLevel", "TemplateProcessing") for step in steps):
        return None
    return _template_affixes(templates[0]) if templates else ((), ())


def _strip(key: WindowKey, ids: list[int]) -> Segment | None:
    """The window's own ids (its leading anchor cut, its trailing one kept), None if the check fails."""
    prev, nxt, _text = key
    if len(ids) < (prev is not None) + (nxt is not None):
        return None
    if (prev is not None and ids[0] != prev) or (nxt is not None and ids[-1] != nxt):
        return None
    return tuple(ids[1:] if prev is not None else ids)


class WindowEncoder:
    """``tokenizer.encode(text, add_special_tokens=False)`` with windows cached in a bounded LRU."""

    def __init__(self, tokenizer: Tokenizer, anchor_ids: dict[str, int] | None,
                 max_entries: int = 1 << 16, max_tokens: int = 1 << 21) -> None:
        self.tokenizer = tokenizer
        self.enabled = anchor_ids is not None
        self._ids = anchor_ids or {}
        pattern = "|".join(map(re.escape, sorted(self._ids, key=len, reverse=True)))
        self._split = re.compile(pattern) if pattern else None
        self._cache: BoundedLRU[Segment] = BoundedLRU(max_entries, max_tokens)
        self.hits = self.misses = self.fallbacks = 0

    def clear(self) -> None:
        """Forget every window (a benchmark's cold start, a tokenizer reload)."""
        self._cache.clear()

    def encode(self, text: str, affix: Affixes = ((), ())) -> list[int]:
        """``affix[0] + encode(text).ids + affix[1]``; a ``Tokens`` when built from cached windows."""
        segments = self._segments(text) if self.enabled else None
        if segments is None:
            return [*affix[0], *self.tokenizer.encode(text, add_special_tokens=False).ids, *affix[1]]
        return Tokens([s for s in (affix[0], *segments, affix[1]) if s])

    def _windows(self, text: str) -> list[WindowKey]:
        keys: list[WindowKey] = []
        start, prev = 0, None
        for match in self._split.finditer(text) if self._split else ():
            nxt = self._ids[match.group()]
            keys.append((prev, nxt, text[start : match.end()]))
            start, prev = match.start(), nxt
        keys.append((prev, None, text[start:]))
        return keys

    def _segments(self, text: str) -> list[Segment] | None:
        """Each window's ids, encoding the missing ones; None after a failed check.

        One by one: ``encode_batch``'s thread pool measured slower than a loop on a small host.
        """
        keys = self._windows(text)
        found = {key: ids for key in keys if (ids := self._cache.get(key)) is not None}
        missing = [key for key in dict.fromkeys(keys) if key not in found]
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        for key in missing:
            ids = _strip(key, self.tokenizer.encode(key[2], add_special_tokens=False).ids)
            if ids is None:
                self.fallbacks += 1
                return None
            found[key] = ids
            self._cache.put(key, ids, len(ids))
        return [found[key] for key in keys]

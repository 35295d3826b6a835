"""Exact, self-checking tokenization cache for the repeated parts of prompts (chat history).

HF ``tokenizers`` splits text at added tokens before normalizing, pre-tokenizing and running the
model on each piece alone, so without added specials ``encode(text)`` is the concatenation over
pieces. A piece can still depend on its neighbours (Metaspace's prepend on the piece at offset 0,
an added token's lstrip/rstrip eating its whitespace), so each piece is encoded in a *window*
with its real neighbouring anchors, ``prev_anchor + piece + next_anchor``, and the window must
encode to ids that start and end with those anchors' ids. When any window fails that check the
whole text is encoded uncached: the cache can be slow, never wrong.

A prompt that extends an earlier one past one of its anchors (the next turn of a chat re-sends
the history) resumes from that prompt's state at its last anchor, a ``Stem``: the windows before
it are the same windows, because a regex scan resumes after each match and no anchor is part of
another, so the scan of any text starting with ``text[:end of that anchor]`` matches the same
anchors up to there. A stem is found by an exact string comparison, never by a hash alone.

Anchors are added tokens matched before normalization (so the split above happens at them),
not touching whitespace (so no neighbour's strip reaches across them) and contained in no other
added token (so no longer match can span a window edge unseen by both windows).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

from tokenizers import Tokenizer

from cacheon.tokens.chains import Segment, Stem, Tokens
from cacheon.tokens.lru import BoundedLRU

Affixes = tuple[Segment, Segment]
WindowKey = tuple[int | None, int | None, str]  # previous anchor id, next anchor id, window text
# A batch of one on rayon's pool costs a cross-thread hand-off per call, and the event loop waits on
# it; the tokenizers library reads this at every call, and an operator's own setting is kept.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
STEM_PROBES = 16  # anchors tried from a prompt's end when looking for the earlier prompt it extends


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


def encode_ids(tokenizer: Tokenizer, text: str, add_special_tokens: bool = False) -> list[int]:
    """``tokenizer.encode(text).ids``, through ``encode_batch_fast``: the same ids without the offsets
    nothing here reads (12-20 % less CPU on this project's prompts, benchmarks/README.md), and it lets
    go of the GIL while it runs, so a long prompt tokenized on a thread of its own leaves the event
    loop running meanwhile. It runs on the calling thread (``TOKENIZERS_PARALLELISM``, below): on
    rayon's pool the caller would block on another thread's wake-up for every call."""
    ids: list[int] = tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids
    return ids


def _stem_key(head: Segment, text: str, end: int) -> tuple[Segment, int, str]:
    """A stem's LRU key: leading affix, text length, its last characters (the whole text is compared on a hit)."""
    return head, end, text[max(0, end - 32) : end]


class _Resume:
    """Where a stem leaves off in the text: the last anchor's start and id, and its end (the stem's text)."""

    __slots__ = ("anchor", "start", "stem", "text")

    def __init__(self, stem: Stem, text: str, start: int, anchor: int) -> None:
        self.stem, self.text, self.start, self.anchor = stem, text, start, anchor


class WindowEncoder:
    """``tokenizer.encode(text, add_special_tokens=False)`` with windows cached in a bounded LRU."""

    def __init__(self, tokenizer: Tokenizer, anchor_ids: dict[str, int] | None,
                 max_entries: int = 1 << 16, max_tokens: int = 1 << 21, max_stem_chars: int = 1 << 24) -> None:
        self.tokenizer = tokenizer
        self.enabled = anchor_ids is not None
        self._ids = anchor_ids or {}
        pattern = "|".join(map(re.escape, sorted(self._ids, key=len, reverse=True)))
        self._split = re.compile(pattern) if pattern else None
        self._cache: BoundedLRU[Segment] = BoundedLRU(max_entries, max_tokens)
        # Keyed by ``_stem_key``; weighted by the characters of text each keeps, which dominate its memory.
        self._stems: BoundedLRU[_Resume] = BoundedLRU(max_entries, max_stem_chars)
        self.hits = self.misses = self.fallbacks = self.stem_hits = 0

    def clear(self) -> None:
        """Forget every window and stem (a benchmark's cold start, a tokenizer reload)."""
        self._cache.clear()
        self._stems.clear()

    def encode(self, text: str, affix: Affixes = ((), ())) -> list[int]:
        """``affix[0] + encode(text).ids + affix[1]``; a ``Tokens`` when built from cached windows."""
        tokens = self._cached(text, affix) if self.enabled else None
        if tokens is None:
            return [*affix[0], *encode_ids(self.tokenizer, text), *affix[1]]
        return tokens

    def _cached(self, text: str, affix: Affixes) -> Tokens | None:
        resume = self._find_stem(text, affix[0])
        stem = resume.stem if resume is not None else None
        if resume is None:
            keys, last = self._windows(text, 0, None, 0)
        else:
            self.stem_hits += 1
            keys, last = self._windows(text, resume.start, resume.anchor, len(resume.text))
        segments = self._segments(keys)
        if segments is None:
            return None
        head: tuple[Segment, ...] = (affix[0],) if affix[0] else ()
        new = (() if stem else head) + tuple(s for s in segments if s)
        final = segments[-1]  # the window after the last anchor: not part of this prompt's stem
        mark = None
        if last is not None:
            mark = Stem(stem, new[: len(new) - (1 if final else 0)])
            self._remember(text, affix[0], mark, *last)
        tail = (affix[1],) if affix[1] else ()
        return Tokens((stem.segments() if stem else ()) + new + tail, stem, mark)

    def _find_stem(self, text: str, head: Segment) -> _Resume | None:
        """The stem of an earlier prompt that this text extends, trying its last anchors from the end.

        Keeps each anchor's last occurrence and searches again only for the one just tried, so the
        probes scan the text once per anchor, not once per probe.
        """
        ends = {a: i + len(a) for a in self._ids if (i := text.rfind(a)) >= 0}
        for _ in range(STEM_PROBES):
            if not ends:
                return None
            anchor = max(ends, key=ends.__getitem__)
            end = ends[anchor]
            found = self._stems.get(_stem_key(head, text, end))
            if found is not None and text.startswith(found.text):
                return found
            i = text.rfind(anchor, 0, end - 1)
            if i < 0:
                del ends[anchor]
            else:
                ends[anchor] = i + len(anchor)
        return None

    def _remember(self, text: str, head: Segment, stem: Stem, start: int, end: int, anchor: int) -> None:
        self._stems.put(_stem_key(head, text, end), _Resume(stem, text[:end], start, anchor), end)

    def _windows(self, text: str, start: int, prev: int | None,
                 scan: int) -> tuple[list[WindowKey], tuple[int, int, int] | None]:
        """Window keys from ``start`` (an anchor with id ``prev`` ending at ``scan``, or the text's start),
        and the (start, end, id) of the last anchor after ``scan``, if any."""
        keys: list[WindowKey] = []
        last = None
        for match in self._split.finditer(text, scan) if self._split else ():
            nxt = self._ids[match.group()]
            keys.append((prev, nxt, text[start : match.end()]))
            start, prev = match.start(), nxt
            last = (match.start(), match.end(), nxt)
        keys.append((prev, None, text[start:]))
        return keys, last

    def _segments(self, keys: list[WindowKey]) -> list[Segment] | None:
        """Each window's ids, encoding the missing ones; None after a failed check.

        One by one: a batch on the tokenizers' thread pool measured slower than a loop on a small host.
        """
        found = {key: ids for key in keys if (ids := self._cache.get(key)) is not None}
        missing = [key for key in dict.fromkeys(keys) if key not in found]
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        for key in missing:
            ids = _strip(key, encode_ids(self.tokenizer, key[2]))
            if ids is None:
                self.fallbacks += 1
                return None
            found[key] = ids
            self._cache.put(key, ids, len(ids))
        return [found[key] for key in keys]

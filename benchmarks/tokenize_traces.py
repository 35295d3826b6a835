"""Tokenizing alone, per request of each trace, as the gateway tokenizes a chat (``TokenizerProfile.encode_chat``:
the template rendered, the window and stem caches kept across the replay), in process CPU; ``encode`` (with
offsets) beside ``encode_batch_fast`` (without), the one the gateway uses. The assistant's turns are one fixed
sentence (a simulated worker's 16 tokens). No sockets, no other process: the floor of what any tokenizing
router pays for these prompts.

    python benchmarks/tokenize_traces.py [--traces chat,system,forks] [--seed 7] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _traces import TRACES, Message, Trace
from tokenizers import Tokenizer

import cacheon.tokens.windows as windows
from cacheon.sim.tokenizer import BOS_TOKEN, write_profile
from cacheon.tokens.profile import TokenizerProfile, TokenizerSpec

REPLY = "The quick brown fox jumps over the lazy dog"
Encode = Callable[[Tokenizer, str, bool], list[int]]


def _plain(tokenizer: Tokenizer, text: str, add_special_tokens: bool = False) -> list[int]:
    ids: list[int] = tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
    return ids


ENCODERS: dict[str, Encode] = {"encode": _plain, "encode_batch_fast": windows.encode_ids}


def requests_of(trace: Trace) -> list[list[Message]]:
    """Every request's messages, in the order the waves send them."""
    history: dict[int, list[Message]] = {}
    out = []
    for wave in range(trace.waves):
        for i in trace.active(wave):
            session = trace.sessions[i]
            turn = wave - session.start
            messages = list(session.opening) if turn == 0 else [
                *history[i], {"role": "user", "content": session.follow_ups[turn - 1]}]
            out.append(messages)
            history[i] = [*messages, {"role": "assistant", "content": REPLY}]
    return out


def cost(files: tuple[Path, Path], requests: list[list[Message]], encode: Encode, repeats: int) -> tuple[float, float]:
    """Best process CPU ms per request over ``repeats`` fresh profiles, and tokens per request."""
    windows.encode_ids = encode  # type: ignore[assignment]  # the windows' encoder, swapped for the run
    best, tokens = float("inf"), 0
    for _ in range(repeats):
        profile = TokenizerProfile(TokenizerSpec(files[0], chat_template=files[1], bos_token=BOS_TOKEN))
        bodies: list[dict[str, Any]] = [{"messages": m, "add_generation_prompt": True} for m in requests]
        start = time.process_time()
        tokens = sum(len(profile.encode_chat(body)) for body in bodies)
        best = min(best, time.process_time() - start)
    return best * 1e3 / len(requests), tokens / len(requests)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default="chat,system,forks")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    unknown = sorted(set(args.traces.split(",")) - set(TRACES))
    if unknown:
        sys.exit(f"unknown traces {unknown}; choose from {sorted(TRACES)}")
    with tempfile.TemporaryDirectory() as tmp:
        files = write_profile(Path(tmp))
        original = windows.encode_ids
        for name in args.traces.split(","):
            requests = requests_of(TRACES[name](args.seed))
            for label, encode in ENCODERS.items():
                ms, tokens = cost(files, requests, encode, args.repeats)
                print(f"{name:<7} {label:<18} {ms:6.3f} ms/request  "
                      f"({len(requests)} requests, {tokens:.0f} tokens each)")
            windows.encode_ids = original


if __name__ == "__main__":
    main()

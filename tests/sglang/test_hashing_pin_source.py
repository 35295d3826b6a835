"""Block-hash prediction against the pin's own ``get_hash_str`` / ``hash_str_to_int64`` source.

The two functions are pure (hashlib only), so they are taken from the pinned release's
``sglang/srt/mem_cache/utils.py`` by AST and run as written, without importing the rest of
SGLang (torch, torchvision). tests/sglang/test_hashing_radix.py checks the same prediction
against hashes a real RadixCache publishes when the full pin is importable.
"""

from __future__ import annotations

import ast
import hashlib
import random
from typing import Any, Optional

import pytest

from cacheon.kv.hashing import page_hashes
from cacheon.runtime.pin import SGLANG_PIN
from tests.interop.kv_interop import release_dir

WANTED = ("get_hash_str", "hash_str_to_int64")


@pytest.fixture(scope="module")
def pin_functions() -> dict[str, Any]:
    source = release_dir(SGLANG_PIN) / "sglang" / "srt" / "mem_cache" / "utils.py"
    tree = ast.parse(source.read_text())
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in WANTED]
    assert sorted(d.name for d in defs) == sorted(WANTED), f"{source} no longer defines {WANTED}"
    namespace: dict[str, Any] = {"hashlib": hashlib, "List": list, "Optional": Optional}
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(source), "exec"), namespace)
    return namespace


def sglang_chain(fns: dict[str, Any], tokens: list[int], page_size: int) -> list[int]:
    """What SGLang's radix cache computes page by page: chained hex digests, then int64."""
    out, prior = [], None
    for start in range(0, len(tokens) - len(tokens) % page_size, page_size):
        prior = fns["get_hash_str"](tokens[start : start + page_size], prior)
        out.append(fns["hash_str_to_int64"](prior))
    return out


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_prediction_is_bit_exact_with_the_pin(pin_functions: dict[str, Any], page_size: int) -> None:
    rng = random.Random(page_size)
    for length in (0, 1, page_size - 1, page_size, 5 * page_size + 3, 300):
        tokens = [rng.randrange(2**32) for _ in range(length)]
        assert page_hashes(tokens, page_size) == sglang_chain(pin_functions, tokens, page_size)


def test_token_extremes_and_sign(pin_functions: dict[str, Any]) -> None:
    tokens = [0, 2**32 - 1, 1, 2**31, 151_643, 7] * 40
    predicted = page_hashes(tokens, 1)
    assert predicted == sglang_chain(pin_functions, tokens, 1)
    assert any(h < 0 for h in predicted) and any(h > 0 for h in predicted)

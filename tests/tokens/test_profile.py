"""Tokenization profiles: sha256 pins and the completions BOS quirk."""

from __future__ import annotations

from pathlib import Path

import pytest

from cacheon.errors import UsageError
from cacheon.tokens.profile import TokenizerProfile, TokenizerSpec


def test_profile_pins_and_the_bos_quirk(profile: tuple[Path, Path]) -> None:
    plain = TokenizerProfile(TokenizerSpec(profile[0], profile[1], bos_token="<s>"))
    quirk = TokenizerProfile(TokenizerSpec(profile[0], profile[1], completions_bos=True, bos_token="<s>"))
    text = "Routing by prefix"
    assert quirk.encode_completion(text) == [quirk.bos_id, *plain.encode_completion(text)]
    chat = plain.render_chat({"messages": [{"role": "user", "content": "hi"}]})[0]
    assert chat == "<s><|user|>hi</s><|assistant|>"
    with pytest.raises(UsageError, match="sha256"):
        TokenizerProfile(TokenizerSpec(profile[0], tokenizer_sha256="0" * 64))
    assert TokenizerProfile(TokenizerSpec(profile[0], tokenizer_sha256=plain.tokenizer_sha256)).encode(text) == plain.encode(text)

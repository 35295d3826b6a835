"""A profile takes BOS, EOS and the chat template from the model directory, as the engine does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cacheon.errors import UsageError
from cacheon.sim.tokenizer import BOS_TOKEN
from cacheon.tokens.model_dir import read_model_dir
from cacheon.tokens.profile import TokenizerProfile, TokenizerSpec

TEMPLATE = "{{ bos_token }}{% for m in messages %}[{{ m['content'] }}]{% endfor %}"


def _model_dir(tmp_path: Path, profile: tuple[Path, Path], config: dict[str, object]) -> Path:
    directory = tmp_path / "model"
    directory.mkdir()
    shutil.copy(profile[0], directory / "tokenizer.json")
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "config.json").write_text(json.dumps({"vocab_size": 400}))
    return directory


def test_bos_and_the_template_come_from_tokenizer_config(tmp_path: Path, profile: tuple[Path, Path]) -> None:
    directory = _model_dir(tmp_path, profile, {"bos_token": {"content": BOS_TOKEN, "lstrip": False},
                                               "eos_token": "</s>", "chat_template": TEMPLATE})
    found = read_model_dir(directory)
    assert (found.bos_token, found.eos_token, found.vocab_size) == (BOS_TOKEN, "</s>", 400)
    for given in (directory, directory / "tokenizer.json"):  # the directory, or the file in it
        p = TokenizerProfile(TokenizerSpec(given, completions_bos=True))
        assert p.bos_id is not None and p.encode_completion("hi")[0] == p.bos_id
        assert p.render_chat({"messages": [{"role": "user", "content": "hi"}]})[0] == f"{BOS_TOKEN}[hi]"
    bare = TokenizerProfile(TokenizerSpec(profile[0]))  # control: a tokenizer.json with nothing beside it
    assert (bare.bos_id, bare.template) == (None, None)
    override = TokenizerProfile(TokenizerSpec(directory, bos_token="</s>"))  # the config's own value wins
    assert override.bos_id == override.tokenizer.token_to_id("</s>")


def test_a_template_file_beats_the_config_entry_and_pins_hold(tmp_path: Path, profile: tuple[Path, Path]) -> None:
    directory = _model_dir(tmp_path, profile, {"chat_template": [{"name": "default", "template": TEMPLATE}]})
    assert read_model_dir(directory).chat_template == TEMPLATE
    (directory / "chat_template.jinja").write_text("<{{ messages[0]['content'] }}>")
    p = TokenizerProfile(TokenizerSpec(directory))
    assert p.render_chat({"messages": [{"role": "user", "content": "hi"}]})[0] == "<hi>"
    with pytest.raises(UsageError, match=r"chat_template\.jinja has sha256"):
        TokenizerProfile(TokenizerSpec(directory, chat_template_sha256="0" * 64))
    (directory / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(UsageError, match="cannot read"):
        read_model_dir(directory)

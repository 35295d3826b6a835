"""What a Hugging Face model directory says about tokenization, read the way the engine reads it.

SGLang loads the tokenizer with transformers from the model directory: ``tokenizer.json``, the
special tokens named in ``tokenizer_config.json`` (the chat template's ``bos_token`` and
``eos_token``), the chat template (``chat_template.jinja``, or ``chat_template`` inside
``tokenizer_config.json``), and the model's ``vocab_size`` in ``config.json``. A gateway profile
that took these from an operator by hand drifts from the engine the day the model changes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cacheon.errors import UsageError

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
MODEL_CONFIG = "config.json"


@dataclass(frozen=True)
class ModelFiles:
    """The tokenization facts of one directory; None where the directory does not say."""

    bos_token: str | None = None
    eos_token: str | None = None
    chat_template: str | None = None  # the template's text
    chat_template_path: Path | None = None  # where that text came from
    vocab_size: int | None = None  # the model's embedding rows (ids at or past it are not tokens)


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not a JSON object")
    return data


def _token(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken object."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _template(config: dict[str, Any]) -> str | None:
    """``chat_template`` in tokenizer_config.json: a string, or named templates (transformers uses "default")."""
    value = config.get("chat_template")
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    return value if isinstance(value, str) else None


def read_model_dir(directory: Path) -> ModelFiles:
    """The facts ``directory`` states; a file that exists but does not parse is a usage error."""
    config = _json(directory / TOKENIZER_CONFIG) or {}
    template, template_path = _template(config), directory / TOKENIZER_CONFIG
    jinja = directory / TEMPLATE_FILE
    if jinja.is_file():  # transformers prefers the separate file when both exist
        template, template_path = jinja.read_text(encoding="utf-8"), jinja
    model = _json(directory / MODEL_CONFIG) or {}
    vocab = model.get("vocab_size")
    return ModelFiles(
        bos_token=_token(config.get("bos_token")),
        eos_token=_token(config.get("eos_token")),
        chat_template=template,
        chat_template_path=template_path if template is not None else None,
        vocab_size=vocab if isinstance(vocab, int) and vocab > 0 else None,
    )

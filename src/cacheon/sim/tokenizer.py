"""A small byte-level BPE tokenizer and chat template, trained on the spot (demos, tests; never a hub).

Training is deterministic (same corpus, same trainer settings): every process writes a byte-identical
tokenizer.json, so a simulated worker and a gateway given this built-in profile tokenize alike.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS = [
    "You are a helpful assistant. Answer briefly and cite the manual.",
    "The quick brown fox jumps over the lazy dog while the cache warms up.",
    "Routing by prefix keeps the KV cache hot across turns of a conversation.",
] * 20

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
BOS_TOKEN = "<s>"  # what TEMPLATE's bos_token must be set to, in the worker and in a gateway profile


def write_profile(directory: Path) -> tuple[Path, Path]:
    """tokenizer.json and template.jinja under ``directory``."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<unk>", BOS_TOKEN, "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,  # it writes to stdout, where `cacheon sim profile` prints its YAML
    )
    tok.train_from_iterator(CORPUS, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer, template = directory / "tokenizer.json", directory / "template.jinja"
    tok.save(str(tokenizer))
    template.write_text(TEMPLATE)
    return tokenizer, template


def gateway_model(tokenizer: Path, template: Path) -> dict[str, str]:
    """A gateway config's ``models.<name>`` entry for these files, pinned by sha256 so drift fails loudly."""
    return {
        "tokenizer": str(tokenizer.resolve()),
        "chat_template": str(template.resolve()),
        "bos_token": BOS_TOKEN,
        "tokenizer_sha256": hashlib.sha256(tokenizer.read_bytes()).hexdigest(),
        "chat_template_sha256": hashlib.sha256(template.read_bytes()).hexdigest(),
    }

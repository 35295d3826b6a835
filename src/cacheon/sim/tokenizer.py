"""A small byte-level BPE tokenizer and chat template, trained on the spot (demos, tests; never a hub)."""

from __future__ import annotations

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


def write_profile(directory: Path) -> tuple[Path, Path]:
    """tokenizer.json and template.jinja under ``directory``."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer, template = directory / "tokenizer.json", directory / "template.jinja"
    tok.save(str(tokenizer))
    template.write_text(TEMPLATE)
    return tokenizer, template

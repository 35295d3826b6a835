#!/usr/bin/env python3
"""Make a tiny random-initialised causal LM that a real SGLang server can load, with no hub access.

The model is a test subject, not a language model: its weights are random (seeded), so what it
generates is noise, but it is a real checkpoint of a real architecture (``LlamaForCausalLM`` or
``Qwen2ForCausalLM``, hidden 64, 2 layers, 4 heads / 2 KV heads) saved with ``transformers`` as
safetensors, with a byte-level BPE tokenizer trained with ``tokenizers`` on the corpus the project
ships (scripts/engines/corpus.txt), a chat template and BOS named in ``tokenizer_config.json``.
The same arguments make the same files on every machine (seeded weights, deterministic training).
``--tokenizer DIR`` puts the model on a real tokenizer and chat template instead (a directory that
scripts/make_real_vocab.py wrote), with its vocabulary size and embeddings tied (a 262k vocabulary);
use ``--family llama`` with it: transformers loads a qwen2 model's tokenizer as ``Qwen2Tokenizer``
(its own pre-tokenizer), whatever the tokenizer files say.

Run it with a Python that has torch, transformers and tokenizers (a server venv from
scripts/install_sglang_servers.py has them):

    .engines/0.5.23/bin/python scripts/make_tiny_model.py --family llama OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "engines" / "corpus.txt"
FAMILIES = ("llama", "qwen2")
BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
# A role-tagged template that starts with BOS, like Llama's: a chat is tokenized without special
# tokens, and a plain prompt gets its BOS from the tokenizer's post-processor, so both start with one.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE = 64, 2, 4, 2, 128
MAX_POSITIONS = 4096


def train_tokenizer(corpus: Path, vocab_size: int):  # -> tokenizers.Tokenizer
    """A byte-level BPE trained on ``corpus``; every byte is in the alphabet, so any text encodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[BOS, EOS, PAD, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus.read_text(encoding="utf-8").splitlines(), trainer=trainer)
    bos = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos)]
    )
    return tokenizer


def model_config(family: str, vocab_size: int, ids: dict[str, int], tied: bool = False):  # -> PretrainedConfig
    from transformers import LlamaConfig, Qwen2Config

    common = {
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": MAX_POSITIONS,
        "bos_token_id": ids[BOS],
        "eos_token_id": ids[EOS],
        "pad_token_id": ids[PAD],
        "tie_word_embeddings": tied,
        # A wider init than the default 0.02 makes greedy decoding depend strongly on every layer,
        # so a kernel that computes the wrong thing changes the tokens instead of hiding in noise.
        "initializer_range": 0.2,
    }
    config = (LlamaConfig if family == "llama" else Qwen2Config)(**common)
    config.dtype = "float32"  # exact on CPU: a faithful fp32 kernel reproduces stock bit for bit
    return config


def make(family: str, out: Path, *, seed: int = 0, vocab_size: int = 2000, corpus: Path = CORPUS,
         tokenizer_dir: Path | None = None) -> dict:
    """Write the model to ``out``; returns a short description (what the CLI prints as JSON)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r} (choose from {', '.join(FAMILIES)})")
    if tokenizer_dir is not None:
        real = AutoTokenizer.from_pretrained(tokenizer_dir)
        ids = {BOS: real.bos_token_id, EOS: real.eos_token_id, PAD: real.pad_token_id}
        config = model_config(family, len(real), ids, tied=True)
    else:
        tokenizer = train_tokenizer(corpus, vocab_size)
        ids = {token: tokenizer.token_to_id(token) for token in (BOS, EOS, PAD)}
        config = model_config(family, tokenizer.get_vocab_size(), ids)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    if tokenizer_dir is not None:
        # A GGUF conversion leaves transformers' "no limit" (1e30), which SGLang's /v1/tokenize cannot
        # serialize (orjson: past 64 bits); the model's own bound is the true one.
        real.model_max_length = MAX_POSITIONS
        real.save_pretrained(out)
        return _described(family, config, model, out, ids, seed)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_TOKENS),
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    _name_bos(out / "tokenizer_config.json")
    return _described(family, config, model, out, ids, seed)


def _described(family: str, config, model, out: Path, ids: dict[str, int], seed: int) -> dict:
    return {
        "family": family,
        "architecture": config.architectures[0] if config.architectures else type(model).__name__,
        "path": str(out),
        "vocab_size": config.vocab_size,
        "bos_token_id": ids[BOS],
        "eos_token_id": ids[EOS],
        "seed": seed,
    }


def _name_bos(path: Path) -> None:
    """State BOS explicitly in tokenizer_config.json (a gateway reads it from there), whatever the
    transformers version wrote by default."""
    config = json.loads(path.read_text(encoding="utf-8"))
    config.update({"bos_token": BOS, "eos_token": EOS, "add_bos_token": True})
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="directory to write the model into (created)")
    parser.add_argument("--family", choices=FAMILIES, default="llama", help="architecture (default llama)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    parser.add_argument("--vocab-size", type=int, default=2000, help="BPE vocabulary bound (default 2000)")
    parser.add_argument("--tokenizer", type=Path, help="a real tokenizer directory (scripts/make_real_vocab.py) "
                        "to use instead of training one")
    args = parser.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()):
        print(f"make_tiny_model: {args.out} is not empty; give a new directory", file=sys.stderr)
        return 1
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        print(f"make_tiny_model: this Python lacks {exc.name}; run it with a server venv's Python", file=sys.stderr)
        return 1
    print(json.dumps(make(args.family, args.out, seed=args.seed, vocab_size=args.vocab_size,
                                 tokenizer_dir=args.tokenizer), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

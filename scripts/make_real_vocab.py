#!/usr/bin/env python3
"""Write a real model's tokenizer and chat template, offline: Gemma 4's, from the llama-cpp-python sdist.

No model hub is reachable, but PyPI's ``llama-cpp-python`` sdist ships llama.cpp's vocab-only GGUF
files (``vendor/llama.cpp/models/ggml-vocab-*.gguf``) with the original HF tokenizers' encodings of a
test text (``.inp``/``.out``). Gemma 4's carries its chat template, one that renders tools, tool
calls and thinking: what the gateway must render as SGLang does (tests/engines/test_real_chat.py).
transformers (``integrations.gguf``, 5.19 or later: the 0.5.23 server venv has it) converts the
GGUF to ``tokenizer.json`` + ``tokenizer_config.json`` + ``chat_template.jinja``; the conversion is
accepted only if it reproduces every vector. A tiny model on it: scripts/make_tiny_model.py --tokenizer.

Idempotent (a stamp names the sdist and its digest). Usage, from ``make engines``:

    .engines/0.5.23/bin/python scripts/make_real_vocab.py [--out .engines/vocab]  # writes OUT/gemma-4/
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SDIST = "llama-cpp-python==0.3.36"
VOCAB = "gemma-4"
MEMBER = f"vendor/llama.cpp/models/ggml-vocab-{VOCAB}.gguf"
STAMP = ".cacheon-vocab.json"
SEPARATOR = "\n__ggml_vocab_test__\n"


def download(into: Path) -> Path:
    """The sdist, through pip (PyPI's ordinary client; it prepares the metadata, builds nothing)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                    SDIST, "-d", str(into)], check=True)
    return next(into.glob("llama_cpp_python-*.tar.gz"))


def extract(sdist: Path, into: Path) -> Path:
    with tarfile.open(sdist) as tar:
        for suffix in ("", ".inp", ".out"):
            member = next(m for m in tar.getmembers() if m.name.endswith(MEMBER + suffix))
            member.name = Path(member.name).name
            tar.extract(member, into, filter="data")
    return into / Path(MEMBER).name


def convert(gguf: Path, out: Path) -> int:
    """Write the converted tokenizer to ``out``; returns the number of vectors it reproduced (all)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer

    architecture, tokens, config = get_gguf_tokenizer(str(gguf))
    backend, _ = convert_gguf_tokenizer(architecture, tokens)
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, **{k: v for k, v in config.items() if v is not None})
    texts = Path(f"{gguf}.inp").read_text(encoding="utf-8").split(SEPARATOR)
    expected = [line.strip() for line in Path(f"{gguf}.out").read_text(encoding="utf-8").split("\n")]
    wrong = [t for t, ids in zip(texts, expected, strict=False)
             if " ".join(map(str, fast.encode(t, add_special_tokens=False))) != ids]
    if wrong:
        raise SystemExit(f"make_real_vocab: the converted {VOCAB} tokenizer differs on {len(wrong)} of "
                         f"{len(texts)} vectors, first {wrong[0]!r}")
    fast.save_pretrained(out)
    return len(texts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(".engines") / "vocab", help="parent directory")
    args = parser.parse_args(argv)
    out = args.out / VOCAB
    stamp = out / STAMP
    if stamp.is_file() and json.loads(stamp.read_text()).get("sdist") == SDIST:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        sdist = download(Path(tmp))
        digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
        vectors = convert(extract(sdist, Path(tmp)), out)
    stamp.write_text(json.dumps({"sdist": SDIST, "sha256": digest, "vocab": VOCAB, "vectors": vectors}) + "\n")
    print(f"make_real_vocab: {out} ({VOCAB} from {SDIST}, {vectors} vectors reproduced)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

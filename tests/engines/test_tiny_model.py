"""The tiny-model tool is deterministic and writes what a server and a gateway read: the same bytes for
the same arguments, BOS named in tokenizer_config.json and put first by the tokenizer and the template."""

from __future__ import annotations

import json
import subprocess

from tests.engines.conftest import require_release
from tests.engines.server import make_model, venv_python

RELEASE = "0.5.13.post1"

ENCODE = """
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
print(json.dumps({"plain": tok("The capital of France is").input_ids, "chat": chat, "bos": tok.bos_token_id}))
"""


def test_the_same_arguments_make_the_same_files_with_bos_first(tmp_path) -> None:
    require_release(RELEASE)
    first, second = (make_model(RELEASE, "qwen2", tmp_path / name) for name in ("a", "b"))
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(files)
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert first["architecture"] == "Qwen2ForCausalLM" and first == {**second, "path": first["path"]}
    config = json.loads((tmp_path / "a" / "tokenizer_config.json").read_text())
    assert config["bos_token"] == "<s>"
    done = subprocess.run(
        [str(venv_python(RELEASE)), "-W", "ignore", "-c", ENCODE, str(tmp_path / "a")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    encoded = json.loads(done.stdout.strip().splitlines()[-1])
    assert encoded["bos"] == first["bos_token_id"]
    assert encoded["plain"][0] == encoded["bos"] and encoded["plain"].count(encoded["bos"]) == 1
    assert encoded["chat"].startswith("<s><|user|>hi<|end|><|assistant|>")

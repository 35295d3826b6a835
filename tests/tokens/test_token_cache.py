"""The window tokenization cache and the chain cache give exactly what uncached encoding and hashing give."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

from cacheon.kv.hashing import page_hashes
from cacheon.sim.tokenizer import CORPUS, write_profile
from cacheon.tokens import chains as chains_module
from cacheon.tokens.chains import ChainCache, Tokens
from cacheon.tokens.lru import BoundedLRU
from cacheon.tokens.profile import TokenizerProfile, TokenizerSpec
from cacheon.tokens.windows import affixes, anchors

ANCHORS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>", "[CLS]", "[SEP]", "x</s"]
WORDS = ["hello", "fox", "Fox", "the", "cache", "a", "s>", "<", "|", ">", "é", "日本語", "🙂", "x"]
SPACE = [" ", "  ", "\n", "\n\n", "\t", " \n "]
CHAINS = ChainCache()  # what a gateway owns: cached prompts hash through it
TEXT = st.lists(st.sampled_from(ANCHORS + WORDS + SPACE), max_size=40).map("".join)


def _profile(directory: Path, tok: Tokenizer, template: str, bos: str | None = None) -> TokenizerProfile:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(tok.to_str())
    (directory / "template.jinja").write_text(template)
    return TokenizerProfile(TokenizerSpec(directory / "tokenizer.json", directory / "template.jinja", bos_token=bos))


def _bytelevel(root: Path, sequence: bool) -> TokenizerProfile:
    path, template = write_profile(root / f"bl{sequence}")
    tok = Tokenizer.from_file(str(path))
    if sequence:  # Llama-3 style: ByteLevel offsets, then a BOS template
        tok.post_processor = processors.Sequence(
            [processors.ByteLevel(), processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])])
    return _profile(root / f"blp{sequence}", tok, template.read_text(), bos="<s>")


def _metaspace(root: Path) -> TokenizerProfile:
    """Unigram behind Metaspace(prepend first), added tokens that strip whitespace, a normalized added token."""
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=120, special_tokens=["<unk>"], unk_token="<unk>"))
    tok.add_special_tokens([AddedToken("<|im_start|>", rstrip=True, normalized=False),
                            AddedToken("<|im_end|>", lstrip=True, normalized=False)])
    tok.add_tokens([AddedToken("fox", normalized=True)])
    template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    return _profile(root / "ms", tok, template)


def _wordpiece(root: Path) -> TokenizerProfile:
    """BERT-like: BertNormalizer, WordPiece and a [CLS] $A [SEP] template for plain encoding."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=150, special_tokens=["[UNK]", "[CLS]", "[SEP]"]))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    return _profile(root / "wp", tok, "[CLS]{% for m in messages %}{{ m.content }}[SEP]{% endfor %}")


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> list[TokenizerProfile]:
    root = tmp_path_factory.mktemp("tokcache")
    return [_bytelevel(root, False), _bytelevel(root, True), _metaspace(root), _wordpiece(root)]


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(TEXT, min_size=1, max_size=3))
def test_cached_encoding_equals_uncached(profiles: list[TokenizerProfile], texts: list[str]) -> None:
    for profile in profiles:
        assert profile.windows.enabled
        for text in texts * 2:  # cold, then warm
            plain = profile.tokenizer.encode(text, add_special_tokens=False).ids
            assert profile.windows.encode(text) == plain
            assert profile.encode(text) == profile.tokenizer.encode(text).ids
            assert CHAINS.chain(profile.windows.encode(text), 1) == page_hashes(plain, 1)


def test_metaspace_prepends_on_the_first_piece_only(profiles: list[TokenizerProfile]) -> None:
    ms = profiles[2]
    text = "hello<|im_start|>hello"
    ids = ms.tokenizer.encode(text, add_special_tokens=False).ids
    assert ids[: len(ids) // 2] != ids[len(ids) // 2 + 1 :]  # the windows must carry this difference
    assert ms.windows.encode(text) == ids


def test_a_failed_window_check_falls_back_to_whole_text(profile: tuple[Path, Path], tmp_path: Path) -> None:
    # "x</s" is an added token overlapping the anchor "</s>": the window "ax</s>" cannot end with </s>.
    tok = Tokenizer.from_file(str(profile[0]))
    tok.add_tokens([AddedToken("x</s", normalized=False)])
    overlap = _profile(tmp_path, tok, profile[1].read_text(), bos="<s>")
    text = "<s>ax</s>b</s>"
    assert overlap.windows.encode(text) == tok.encode(text, add_special_tokens=False).ids
    assert overlap.windows.fallbacks == 1
    assert not isinstance(overlap.windows.encode(text), Tokens)


def _check(profile: TokenizerProfile, text: str) -> None:
    """Cached encoding (windows, stems) and cached hashing equal their uncached forms."""
    plain = profile.tokenizer.encode(text, add_special_tokens=False).ids
    assert profile.windows.encode(text) == plain
    assert profile.encode(text) == profile.tokenizer.encode(text).ids
    for page in (1, 3):
        assert CHAINS.chain(profile.windows.encode(text), page) == page_hashes(plain, page)


@settings(max_examples=200, deadline=None)
@given(pieces=st.lists(TEXT, min_size=1, max_size=5), forks=st.lists(TEXT, max_size=3))
def test_prompts_that_extend_earlier_ones_resume_exactly(profiles: list[TokenizerProfile], pieces: list[str],
                                                         forks: list[str]) -> None:
    for profile in profiles:
        text = ""
        for piece in pieces:  # each prompt extends the one before, as chat turns do
            text += piece
            _check(profile, text)
        for fork in forks:  # and prompts that leave the conversation part way
            _check(profile, pieces[0][: len(pieces[0]) // 2] + fork)


@pytest.mark.parametrize("depth", [64, 2])  # 2: stems start over flat every third turn
def test_multi_turn_history_resumes_from_the_previous_turn(profile: tuple[Path, Path], depth: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chains_module, "STEM_DEPTH", depth)
    chat = TokenizerProfile(TokenizerSpec(profile[0], profile[1], bos_token="<s>", eos_token="</s>"))
    chains = ChainCache()
    history = [{"role": "system", "content": "You are a helpful assistant."}]
    for turn in range(6):
        history += [{"role": "user", "content": f"Question {turn}: the quick brown fox?"}]
        stems, looked, walked = chat.windows.stem_hits, chat.windows.hits + chat.windows.misses, chains.hits + chains.misses
        tokens = chat.encode_chat({"messages": history})
        assert isinstance(tokens, Tokens)
        assert tokens == chat.tokenizer.encode(chat.render_chat({"messages": history})[0], add_special_tokens=False).ids
        for page in (1, 2):
            assert chains.page_hashes(tokens.segments, page, tokens.stem, tokens.mark) == page_hashes(list(tokens), page)
        assert tokens.mark is not None and tokens.mark.depth == (turn if depth > 6 else turn % (depth + 1))
        if turn:  # the cost follows the new text: the answer, the question and the generation prompt
            assert chat.windows.stem_hits - stems == 1
            assert chat.windows.hits + chat.windows.misses - looked == 3
            assert chains.hits + chains.misses - walked == 2 * 3
        history += [{"role": "assistant", "content": f"Answer {turn}."}]
    # An edited earlier message is not the same conversation: no stem, still exact, windows reused.
    history[1] = {"role": "user", "content": "Question 0: the lazy dog?"}
    stems, misses = chat.windows.stem_hits, chat.windows.misses
    assert chat.encode_chat({"messages": history}) == chat.tokenizer.encode(chat.render_chat({"messages": history})[0], add_special_tokens=False).ids
    assert chat.windows.stem_hits == stems
    assert chat.windows.misses - misses == 2  # the edited message, and the last answer (never sent before)


def _config(**extra: object) -> dict:
    added = [{"id": 1, "content": "<s>", "special": True, "normalized": False, "single_word": False},
             {"id": 2, "content": "</s>", "special": True, "normalized": False, "single_word": False},
             {"id": 3, "content": "<pad>", "special": True, "normalized": False, "single_word": False},
             {"id": 4, "content": " <sep>", "special": True, "normalized": False, "single_word": False}]
    return {"added_tokens": added, **extra}


def test_anchor_choice() -> None:
    assert anchors(_config(), "{{ bos }} x </s> <sep>", ["<s>"]) == {"<s>": 1, "</s>": 2}
    assert anchors(_config(truncation={"max_length": 8}), "</s>", []) is None
    assert anchors(_config(padding={"length": 8}), "</s>", []) is None
    single = _config()
    single["added_tokens"][0]["single_word"] = True
    assert anchors(single, "</s>", []) is None
    contained = _config()
    contained["added_tokens"].append({"id": 5, "content": "</s>\n", "special": False, "normalized": False})
    assert anchors(contained, "</s>", ["<s>"]) == {"<s>": 1}


def test_post_processor_affixes(profile: tuple[Path, Path], tmp_path: Path) -> None:
    template = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                         {"Sequence": {"id": "A", "type_id": 0}}],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    assert affixes({}) == ((), ())
    assert affixes({"post_processor": {"type": "ByteLevel"}}) == ((), ())
    assert affixes({"post_processor": template}) == ((1,), ())
    assert affixes({"post_processor": {"type": "Sequence", "processors": [{"type": "ByteLevel"}, template]}}) == ((1,), ())
    assert affixes({"post_processor": {"type": "RobertaProcessing"}}) is None
    twice = {**template, "single": [*template["single"], {"Sequence": {"id": "A", "type_id": 0}}]}
    assert affixes({"post_processor": twice}) is None
    tok = Tokenizer.from_file(str(profile[0]))
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 1))
    roberta = _profile(tmp_path, tok, "")
    assert not isinstance(roberta.encode("hi"), Tokens)
    assert roberta.encode("hi") == tok.encode("hi").ids


def test_lru_bounds() -> None:
    lru: BoundedLRU[str] = BoundedLRU(max_entries=2, max_weight=10)
    lru.put("a", "A", 4)
    lru.put("b", "B", 4)
    assert lru.get("a") == "A"  # now b is the least recently used
    lru.put("c", "C", 4)
    assert (lru.get("b"), len(lru), lru.weight) == (None, 2, 8)
    lru.put("huge", "H", 11)
    assert lru.get("huge") is None
    lru.put("d", "D", 9)
    assert (len(lru), lru.weight) == (1, 9)
    with pytest.raises(ValueError):
        BoundedLRU(0, 1)


def test_chain_cache_matches_plain_hashing_after_eviction() -> None:
    chains = ChainCache(max_entries=2)
    segments = [(1, 2, 3), (4,), (5, 6, 7, 8, 9)]
    for page in (1, 2, 3, 4):
        for _ in range(2):
            assert chains.page_hashes(segments, page) == page_hashes([t for s in segments for t in s], page)
    with pytest.raises(ValueError):
        chains.page_hashes([(1, -1)], 1)

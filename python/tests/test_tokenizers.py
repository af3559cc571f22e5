"""Tokenizers of real models against Hugging Face `tokenizers`, id for id, on data/tokenizer_test.txt
(2,310 lines: this repository's prose and code, and lines of accents, CJK, Korean, emoji, digits,
URLs, whitespace runs, control and zero-width characters, long words), with padding and truncation
off; decoding as the library decodes. WordPiece on all-MiniLM-L6-v2's tokenizer.json; byte-level
BPE on SmolLM2's (as transformers builds it from the GGUF file) and on variants of its
pre-tokeniser (Llama-3's Split pattern, individual digits) and of its model (ignore_merges)."""

import json
from pathlib import Path

import pytest
import tokenizers
from model_files import MINILM_DIR

import headlight

ROOT = Path(__file__).resolve().parents[2]
LINES = (ROOT / "data" / "tokenizer_test.txt").read_text(encoding="utf-8").split("\n")
MINILM = MINILM_DIR / "tokenizer.json"


@pytest.fixture(scope="module")
def minilm():
    hf = tokenizers.Tokenizer.from_file(str(MINILM))
    hf.no_padding()
    hf.no_truncation()
    return headlight.WordPieceTokenizer.from_file(str(MINILM)), hf


def test_the_test_text_is_large_and_varied():
    assert len(LINES) >= 2000
    text = "\n".join(LINES)
    for sample in ["北京", "한국어", "😀", "é", "\t", "   ", "std::vector", "1,000,000"]:
        assert sample in text


def test_minilm_wordpiece_equals_tokenizers_on_every_line(minilm):
    hl, hf = minilm
    wrong = [(line, hl.encode(line), hf.encode(line).ids) for line in LINES
             if hl.encode(line) != hf.encode(line).ids]
    assert not wrong, f"{len(wrong)} lines differ, first: {wrong[0]}"


def test_minilm_decode_equals_tokenizers(minilm):
    hl, hf = minilm
    for line in LINES[::7]:
        ids = hf.encode(line).ids
        assert hl.decode(ids) == hf.decode(ids), line
        assert hl.decode(ids, skip_special_tokens=False) == hf.decode(ids, skip_special_tokens=False)


def test_minilm_special_tokens_in_text_and_without_the_template(minilm):
    hl, hf = minilm
    for text in ["[CLS] hi [MASK] there[SEP]", "[MASK][MASK]", "a[UNK]b", "[mask] is not special"]:
        assert hl.encode(text) == hf.encode(text).ids, text
        assert hl.encode(text, add_special_tokens=False) == \
            hf.encode(text, add_special_tokens=False).ids, text
    assert hl.vocab_size == hf.get_vocab_size() == 30522


def test_a_tokenizer_of_another_kind_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text('{"model": {"type": "BPE", "vocab": {}, "merges": []}}')
    with pytest.raises(ValueError, match=f"{path}.*BPE.*not WordPiece"):
        headlight.WordPieceTokenizer.from_file(str(path))
    path.write_text("{not json")
    with pytest.raises(ValueError, match=f"{path}: not JSON"):
        headlight.WordPieceTokenizer.from_file(str(path))


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.fixture(scope="module")
def smollm2_json(tmp_path_factory):
    """SmolLM2's tokenizer as transformers builds it from the GGUF file's metadata, as a
    tokenizer.json (the oracle of what a GGUF tokenizer means)."""
    from transformers import AutoTokenizer

    from model_files import SMOLLM2_GGUF
    tok = AutoTokenizer.from_pretrained(str(SMOLLM2_GGUF.parent), gguf_file=SMOLLM2_GGUF.name)
    return json.loads(tok.backend_tokenizer.to_str())


def pair(spec, tmp_path, name):
    path = tmp_path / name
    path.write_text(json.dumps(spec), encoding="utf-8")
    hf = tokenizers.Tokenizer.from_file(str(path))
    hf.no_padding()
    hf.no_truncation()
    return headlight.ByteLevelBPETokenizer.from_file(str(path)), hf


def assert_same_on_every_line(hl, hf):
    wrong = [(line, hl.encode(line), hf.encode(line).ids) for line in LINES
             if hl.encode(line) != hf.encode(line).ids]
    assert not wrong, f"{len(wrong)} lines differ, first: {wrong[0]}"
    for line in LINES[::5]:
        ids = hf.encode(line).ids
        assert hl.decode(ids) == hf.decode(ids), line


def test_smollm2_byte_level_bpe_equals_tokenizers_on_every_line(smollm2_json, tmp_path):
    hl, hf = pair(smollm2_json, tmp_path, "smollm2.json")
    assert hl.vocab_size == hf.get_vocab_size() == 49152
    assert_same_on_every_line(hl, hf)
    chat = "<|im_start|>user\nWho is Maria?<|im_end|>\n<|im_start|>assistant\n"
    assert hl.encode(chat) == hf.encode(chat).ids
    ids = hf.encode(chat).ids
    assert hl.decode(ids, skip_special_tokens=False) == hf.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("variant", ["llama3_split", "digits", "ignore_merges"])
def test_other_byte_level_pre_tokenisers_equal_tokenizers(smollm2_json, tmp_path, variant):
    spec = json.loads(json.dumps(smollm2_json))
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    if variant == "llama3_split":
        spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated",
             "invert": False}, dict(byte_level, use_regex=False)]}
    elif variant == "digits":
        spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, byte_level]}
    else:
        spec["model"]["ignore_merges"] = True
    assert_same_on_every_line(*pair(spec, tmp_path, f"{variant}.json"))


def test_a_byte_level_tokenizer_it_cannot_read_is_refused(smollm2_json, tmp_path):
    spec = json.loads(json.dumps(smollm2_json))
    spec["pre_tokenizer"] = {"type": "Whitespace"}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=f"{path}.*Whitespace.*not supported"):
        headlight.ByteLevelBPETokenizer.from_file(str(path))


def test_smollm2_tokenizer_from_the_gguf_metadata_equals_transformers(smollm2_json, tmp_path):
    from model_files import SMOLLM2_GGUF
    hl = headlight.ByteLevelBPETokenizer.from_gguf(str(SMOLLM2_GGUF))
    _, hf = pair(smollm2_json, tmp_path, "smollm2.json")
    assert hl.vocab_size == 49152
    assert_same_on_every_line(hl, hf)
    chat = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
    assert hl.encode(chat) == hf.encode(chat).ids


def test_a_gguf_without_a_byte_level_tokenizer_is_refused(tmp_path):
    import gguf
    path = tmp_path / "sp.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("tokenizer.ggml.model", "llama")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=f'{path}: tokenizer.ggml.model "llama" is not supported'):
        headlight.ByteLevelBPETokenizer.from_gguf(str(path))

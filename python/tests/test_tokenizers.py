"""Tokenizers of real models against Hugging Face `tokenizers`, id for id, on data/tokenizer_test.txt
(2,310 lines: this repository's prose and code, and lines of accents, CJK, Korean, emoji, digits,
URLs, whitespace runs, control and zero-width characters, long words), with padding and truncation
off; decoding as the library decodes."""

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

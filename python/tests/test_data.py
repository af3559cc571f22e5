"""The shipped data files are what data/README.md says they are."""

import json
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "data"


def test_coreference_passages_are_consistent():
    doc = json.loads((DATA / "coreference.json").read_text(encoding="utf-8"))
    passages = doc["passages"]
    assert len(passages) >= 60
    assert len({p["text"] for p in passages}) == len(passages)
    for p in passages:
        text, at = p["text"], p["pronoun_at"]
        assert text[at:at + len(p["pronoun"])] == p["pronoun"], p
        assert p["pronoun"].lower() in {"he", "she", "it", "they", "him", "her", "his", "them"}
        names = [p["antecedent"]] + p["distractors"]
        assert len(p["distractors"]) >= 1
        assert len({n["name"].lower() for n in names}) == len(names), p
        for n in names:
            assert 0 <= n["at"] < at, (p, n)
            assert text[n["at"]:n["at"] + len(n["name"])] == n["name"], (p, n)
            assert text.find(n["name"]) == n["at"], (p, n)  # the first mention


def test_the_prose_corpus_is_genesis_as_data_readme_says():
    """data/genesis.txt: 1,533 verses one per line without references, 38,265 words; its two halves
    (importance, held out) each over 20,000 SmolLM2 tokens."""
    from model_files import SMOLLM2_GGUF  # noqa: F401 (the tokenizer comes through headlight)
    import headlight
    lines = (DATA / "genesis.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1533 and all(lines)
    assert lines[0] == "In the beginning God created the heaven and the earth."
    assert lines[-1].startswith("So Joseph died, being an hundred and ten years old")
    assert not any(line[:2] == "Ge" and ":" in line.split()[0] for line in lines)
    assert sum(len(line.split()) for line in lines) == 38265
    tok = headlight.load(str(SMOLLM2_GGUF)).tokenizer
    half = len(lines) // 2
    for part in (lines[:half], lines[half:]):
        assert len(tok.encode("\n".join(part) + "\n", add_special_tokens=False)) > 20000

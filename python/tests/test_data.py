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

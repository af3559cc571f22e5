#!/usr/bin/env python3
"""Writes data/tokenizer_test.txt: the text on which headlight's tokenizers are compared with
Hugging Face `tokenizers`, id for id. Deterministic (seeded). Three parts:
  1. prose and code of this repository as it was when the file was made (Markdown, C++ and Python
     lines: punctuation, operators, indentation, arrows and other symbols);
  2. lines assembled at random from fragments in many scripts and styles: accents and case, CJK,
     Korean, Greek, Cyrillic, Arabic, Devanagari, emoji with modifiers and joiners, digits and
     numbers, URLs, whitespace runs, tabs, control and zero-width characters, long words;
  3. the same fragments one per line.
Run: python3 data/make_tokenizer_text.py (from the repository root)."""

import random
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FRAGMENTS = [
    "Héllo Wörld", "naïve café", "Ñandú", "façade", "Ærøskøbing", "Œuvre", "İstanbul", "ǅemal",
    "straße", "ﬁnance", "ÀÉÎÕÜ", "北京是中国的首都。", "東京タワー", "日本語のテキスト", "한국어 텍스트",
    "Ελληνικά γράμματα", "Привет, мир!", "مرحبا بالعالم", "नमस्ते दुनिया", "ภาษาไทย", "עברית",
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "✨🎉", "x² + y³ = z⁴", "½ ¼ ¾", "1234567890",
    "3.14159", "1,000,000", "-42", "0x1F", "1e-9", "2026-12-04", "12:30:45", "$19.99", "€5", "¥1000",
    "https://example.com/path?q=1&r=2", "user@example.org", "C:\\Program Files\\x", "/usr/local/bin",
    "def f(x):", "return x**2", "for (int i = 0; i < n; ++i) {", "}", "a->b", "a::b", "#include <map>",
    "std::vector<int>", "if x != y and not z:", "print(f'{x:>8.3f}')", "<div class=\"a\">", "&amp;",
    "   ", "\t", "\t\t", "  \t  ", "\u00a0", "\u2003", "\u200b", "\u200d", "\ufeff", "\u3000",
    "don't", "it's", "we're", "I'm", "you've", "can't", "O'Neil", "rock'n'roll", "--", "...", "…",
    "“quoted”", "‘single’", "«guillemets»", "(parens)", "[brackets]", "{braces}", "a/b", "a\\b",
    "supercalifragilisticexpialidocious", "antidisestablishmentarianism", "x" * 101, "y" * 40,
    "CamelCaseWord", "snake_case_name", "kebab-case-name", "ALLCAPS", "MiXeD", "Ⅻ", "ℌ", "ℕ",
    "\u0301e", "e\u0301", "a\u0308", "Å", "Å", "ﬀ", "ﬃ", "ǆ", "ß", "ẞ", "Σσς", "ΐ", "ﬅ",
]


def generated(rng, n):
    lines = []
    for _ in range(n):
        k = rng.randint(1, 9)
        seps = [" ", " ", " ", "  ", "\t", "", "   ", ", ", ". "]
        parts = [rng.choice(FRAGMENTS) + rng.choice(seps) for _ in range(k)]
        lines.append("".join(parts).rstrip("\n"))
    return lines


def repository_lines():
    out = []
    for pattern in ["README.md", "docs/*.md", "models/README.md", "src/**/*.cc", "python/tests/*.py"]:
        for path in sorted(ROOT.glob(pattern)):
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    out.append(line)
    return out


def main():
    rng = random.Random(20261204)
    repo = repository_lines()
    rng.shuffle(repo)
    lines = repo[:1400] + generated(rng, 800) + FRAGMENTS
    text = "\n".join(line.replace("\r", "") for line in lines) + "\n"
    (ROOT / "data" / "tokenizer_test.txt").write_text(text, encoding="utf-8")
    print(f"wrote data/tokenizer_test.txt: {len(lines)} lines")


if __name__ == "__main__":
    main()

"""The digest docs/heads.md shows of a real model's head table: the best heads of each role beside
the score of a head attending uniformly, how many heads take each role, and the best heads on the
natural coreference passages beside the nearest-name rule.

    headlight heads MODEL --corpus data/genesis.txt --coreference data/coreference.json --json \\
        > heads.json
    python3 bench/heads_digest.py heads.json
"""

import json
import sys
from collections import Counter

ROLES = ["previous_token", "first_token", "induction", "local", "self", "previous_token_text"]


def digest(doc, top=3):
    heads, uniform = doc["heads"], doc["uniform"]
    print("| role score | best heads (layer.head score) | uniform head |")
    print("|---|---|---:|")
    for role in ROLES:
        best = sorted(heads, key=lambda h: -h["scores"][role])[:top]
        cells = ", ".join(f"{h['layer']}.{h['head']} {h['scores'][role]:.2f}" for h in best)
        print(f"| {role} | {cells} | {uniform[role]:.2f} |")
    roles = Counter(h["role"] for h in heads)
    print("\nroles: " + ", ".join(f"{k} {v}" for k, v in roles.most_common()) +
          f" (of {len(heads)} heads)")
    imp = [h for h in heads if h["importance"] is not None]
    if imp:
        low = sorted(imp, key=lambda h: h["importance"])[:top]
        high = sorted(imp, key=lambda h: -h["importance"])[:top]
        print("most important: " + ", ".join(f"{h['layer']}.{h['head']} ({h['role']})" for h in high)
              + "; least: " + ", ".join(f"{h['layer']}.{h['head']} ({h['role']})" for h in low))
    coref = doc.get("coreference")
    if coref:
        acc = coref["accuracy"]
        ranked = sorted(((a, l, h) for l, row in enumerate(acc) for h, a in enumerate(row)),
                        reverse=True)[:5]
        print(f"\nnatural coreference, {coref['passages']} passages: best heads " +
              ", ".join(f"{l}.{h} {100 * a:.0f}%" for a, l, h in ranked) +
              f"; nearest-name rule {100 * coref['nearest_name_accuracy']:.0f}%")


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        digest(json.load(f))

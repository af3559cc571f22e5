#!/usr/bin/env python3
"""What seeing SmolLM2's heads costs, headlight against transformers in one run (fp32, 2 threads,
medians of --runs runs each).

    .venv/bin/python bench/capture.py [--threads 2] [--runs 5] [--long 8192] [--only NAME]

capture-512: a forward of 512 tokens of data/genesis.txt through the blocks (`Model.capture(ids,
stats=False)`: the forward without the logits, which a capture does not need, and nothing kept),
with every layer's and head's exact attention (`Model.attention`, [30, 9, 512, 512], into a new
array or into one reused through `out=`), and with the per-row statistics of every head
(`Model.capture`); transformers' default forward (SDPA) and its eager path with
output_attentions=True on the same GGUF weights dequantised to fp32, with the logits (`model(x)`)
and through the blocks (`model.model(x)`, as headlight's capture).

capture-long: the same at --long tokens (SmolLM2's context, 8192, by default): plain, and with
every head's per-row statistics plus the exact attention of two chosen heads (each recomputed
from the forward's saved queries and keys). The extra memory is the difference of the peak
resident sizes of two child processes that load the model and run one variant each (run first,
while this process holds no model). transformers'
eager path would have to hold 30 · 9 · T² fp32 weights (72 GB at 8192) and is not run.

importance-2048: gradient importance of every head (Michel et al.: one window at a time, the
|gate · ∂L/∂gate| of each head) over 2,048 tokens (8 windows of 256): `Model.head_importance`
against the same computation in transformers (gates on each head's slice of o_proj's input,
autograd), which python/tests/test_models_real.py checks equal.

GFLOP/s count, per token, 2·(the blocks' weights) plus causal attention 2·T·H·hd per layer
(the average row sees T/2 keys), and 2·n_embd·vocab for the logits when computed, as a fraction of the FMA peak measured in the same run
(`headlight bench peak`).
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from compare import cli_json, median_seconds  # bench/compare.py, beside this file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python" / "tests"))
from model_files import SMOLLM2_GGUF  # noqa: E402

L, H, G, HD, C, F = 30, 9, 3, 64, 576, 1536
BLOCK_WEIGHTS = L * (C * (H + 2 * G) * HD + H * HD * C + 3 * C * F)


def forward_flops(T):
    return 2 * T * BLOCK_WEIGHTS + 2 * T * 49152 * C + L * 2 * T * T * H * HD


def genesis_ids(model, n):
    ids = model.tokenizer.encode((ROOT / "data" / "genesis.txt").read_text(encoding="utf-8"))
    return np.array([ids[:n]], dtype=np.int32)


def reference():
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(ARGS.threads)

    def load(impl):
        return AutoModelForCausalLM.from_pretrained(
            str(SMOLLM2_GGUF.parent), gguf_file=SMOLLM2_GGUF.name, dtype=torch.float32,
            attn_implementation=impl).eval()
    return torch, load


def capture_512(model, peak, rows):
    ids = genesis_ids(model, 512)
    T = ids.shape[1]
    flops, blocks = forward_flops(T), forward_flops(T) - 2 * T * 49152 * C

    def row(name, sec, base, work=blocks):
        rows.append(("capture-512", name, f"{sec:.3f} s", f"{work / sec / 1e9 / peak:.2f}",
                     f"{sec / base:.2f}×"))
        return sec

    plain = median_seconds(lambda: model.capture(ids, stats=False), ARGS.runs)
    row("headlight forward through the blocks (no logits)", plain, plain)
    row("headlight forward with logits", median_seconds(lambda: model.forward(ids), ARGS.runs),
        plain, flops)
    row("headlight + every head's attention (a new array each time)", median_seconds(
        lambda: model.attention(ids), ARGS.runs), plain)
    out = np.empty((L, H, T, T), np.float32)
    every = row("headlight + every head's attention (into one array, out=)", median_seconds(
        lambda: model.attention(ids, out=out), ARGS.runs), plain)
    row("headlight + every head's row statistics", median_seconds(
        lambda: model.capture(ids), ARGS.runs), plain)
    torch, load = reference()
    x = torch.tensor(ids, dtype=torch.long)
    with torch.no_grad():
        sdpa = load("sdpa")
        row("transformers forward with logits (SDPA)", median_seconds(lambda: sdpa(x), ARGS.runs),
            plain, flops)
        del sdpa
        eager = load("eager")
        with_logits = row("transformers eager, output_attentions, with logits", median_seconds(
            lambda: eager(x, output_attentions=True), ARGS.runs), plain, flops)
        blocks_only = row("transformers eager, output_attentions, through the blocks",
                          median_seconds(lambda: eager.model(x, output_attentions=True),
                                         ARGS.runs), plain)
    rows.append(("capture-512", "→ every head's attention, headlight against transformers' eager "
                 "path through the blocks (its logits too)", "", "",
                 f"{blocks_only / every:.2f}× ({with_logits / every:.2f}×) faster"))


CHILD = """
import json, resource, sys
import numpy as np
sys.path.insert(0, {tests!r})
import headlight
from model_files import SMOLLM2_GGUF
m = headlight.load(str(SMOLLM2_GGUF), threads={threads})
ids = np.array([m.tokenizer.encode(open({prose!r}, encoding="utf-8").read())[:{T}]], dtype=np.int32)
heads = {heads!r}
m.capture(ids, heads=heads, stats={stats})
print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
"""


def peak_rss(T, heads, stats):
    code = CHILD.format(tests=str(ROOT / "python" / "tests"), threads=ARGS.threads,
                        prose=str(ROOT / "data" / "genesis.txt"), T=T, heads=heads, stats=stats)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return int(out.stdout.strip().splitlines()[-1])


def long_memory():
    """The extra peak memory of the long capture: two child processes, run before this one holds
    a model (the machine has 24 GiB and each holds about 10 at 8192 tokens)."""
    chosen = [(16, 0), (18, 6)]
    return peak_rss(ARGS.long, chosen, True) - peak_rss(ARGS.long, [], False)


def capture_long(model, peak, rows, extra):
    T = ARGS.long
    ids = genesis_ids(model, T)
    assert ids.shape[1] == T, f"data/genesis.txt has {ids.shape[1]} tokens, fewer than {T}"
    flops = forward_flops(T) - 2 * T * 49152 * C  # through the blocks: no logits
    chosen = [(16, 0), (18, 6)]  # SmolLM2's previous-token and induction heads (docs/heads.md)
    runs = max(3, ARGS.runs)
    plain = median_seconds(lambda: model.capture(ids, stats=False), runs)
    seen = median_seconds(lambda: model.capture(ids, heads=chosen), runs)
    rows.append((f"capture-{T}", "headlight forward through the blocks (no logits)", f"{plain:.2f} s",
                 f"{flops / plain / 1e9 / peak:.2f}", "1.00×"))
    rows.append((f"capture-{T}", "+ every head's row statistics + 2 heads' exact attention",
                 f"{seen:.2f} s", f"{flops / seen / 1e9 / peak:.2f}", f"{seen / plain:.2f}×"))
    rows.append((f"capture-{T}", "extra memory of that capture (peak RSS difference)",
                 f"{extra / 2**20:.0f} MiB", "", f"outputs {4 * T * (3 * L * H + 2 * T) / 2**20:.0f} MiB"))
    rows.append((f"capture-{T}", "transformers eager, output_attentions",
                 f"would hold {4 * L * H * T * T / 1e9:.0f} GB of weights", "", "not run"))


def importance_2048(model, peak, rows):
    ids = genesis_ids(model, 2049)[0]
    seq, windows = 256, 8
    flops = windows * 3 * forward_flops(seq)  # a backward is about twice a forward
    hl = median_seconds(lambda: model.head_importance(ids, seq), ARGS.runs)
    torch, load = reference()
    ref = load("eager")
    gates = torch.ones(L, H, requires_grad=True)
    for layer, block in enumerate(ref.model.layers):
        def hook(module, args, layer=layer):
            return (args[0] * gates[layer].repeat_interleave(HD),)
        block.self_attn.o_proj.register_forward_pre_hook(hook)

    def torch_importance():
        score = torch.zeros(L, H)
        for w in range(windows):
            x = torch.tensor(ids[None, w * seq:(w + 1) * seq], dtype=torch.long)
            y = torch.tensor(ids[w * seq + 1:(w + 1) * seq + 1], dtype=torch.long)
            loss = torch.nn.functional.cross_entropy(ref(x).logits[0], y)
            (g,) = torch.autograd.grad(loss, gates)
            score += (gates * g).abs().detach()
        return score / score.norm(dim=1, keepdim=True)

    tr = median_seconds(torch_importance, ARGS.runs)
    agree = np.abs(torch_importance().numpy() - model.head_importance(ids, seq)).max()
    rows.append(("importance-2048", "headlight", f"{hl:.2f} s", f"{flops / hl / 1e9 / peak:.2f}",
                 f"{tr / hl:.2f}× faster"))
    rows.append(("importance-2048", "transformers (gates + autograd)", f"{tr:.2f} s",
                 f"{flops / tr / 1e9 / peak:.2f}", f"max difference {agree:.1e}"))


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--long", type=int, default=8192)
    p.add_argument("--only", choices=["capture-512", "capture-long", "importance-2048"])
    ARGS = p.parse_args()
    extra = long_memory() if ARGS.only in (None, "capture-long") else None
    import headlight
    peak = cli_json("bench", "peak", "--threads", ARGS.threads)["peak_gflops"]
    model = headlight.load(str(SMOLLM2_GGUF), threads=ARGS.threads)
    rows = []
    if ARGS.only in (None, "capture-512"):
        capture_512(model, peak, rows)
    if ARGS.only in (None, "capture-long"):
        capture_long(model, peak, rows, extra)
    if ARGS.only in (None, "importance-2048"):
        importance_2048(model, peak, rows)
    print(f"FMA peak {peak:.0f} GFLOP/s ({ARGS.threads} threads); medians of {ARGS.runs} runs\n")
    print("| measure | what | time / size | fraction of peak | ratio |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print("\n" + json.dumps({"peak_gflops": peak, "rows": rows}))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Training throughput of headlight and PyTorch 2.13 on the same model and data, in one run.

    .venv/bin/python bench/train_compare.py [--threads 2] [--steps 30] [--rounds 5] [--compile] [--bf16]

The model is the issue's: 4 layers, 4 heads, n_embd 128, block 128, batch 16, byte-level
vocabulary (256), learned positions, pre-norm LayerNorm, tied embeddings; AdamW with gradient
clipping. headlight trains through `headlight train` (its own loop); PyTorch through
an eager nanoGPT-style model (F.scaled_dot_product_attention, is_causal) on the same detective
corpus, and with torch.compile when --compile is given and it works here. Rounds alternate between
the two, and the table gives the median tokens/s of each and the ratio. Every trainer is timed
the same way: WARMUP untimed steps, then --steps timed steps (headlight's from the elapsed times
its metrics log records after each step, so its final evaluation and checkpoint are not counted).

With --bf16 two more trainers join the rounds: headlight in mixed precision (`headlight train --dtype
bf16`: bf16 products with fp32 accumulation, fp32 master weights and AdamW state) and PyTorch under
`torch.autocast("cpu", dtype=torch.bfloat16)` (its products in bf16, fp32 weights and optimizer),
and the final losses of the runs are printed beside each other.

It also prints what the machine allows: the FLOPs of a training step from explicit formulas (the
dense products 6·P·tokens, P the weights of the products: 12·n_embd² per layer and the tied
lm_head's vocab·n_embd; causal attention 2·B·T²·n_embd per layer forward, 2.5× that backward),
the FP32 FMA peak measured by `headlight bench peak` in the same run, and so the most tokens/s any
trainer could reach here, as a multiple of each measured trainer's. With --bf16 the mixed-precision
trainers are held against the bf16 peak (`headlight bench peak --dtype bf16`, measured in the same
run: the most a trainer whose every FLOP ran in bf16 could reach), the others against the FMA peak.
"""

import argparse
import json
import math
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / "build" / "release" / "apps" / "cli" / "headlight"
N_LAYER, N_HEAD, N_EMBD, BLOCK, BATCH, VOCAB = 4, 4, 128, 128, 16, 256
WARMUP = 3  # untimed steps of every trainer (first calls: allocation, oneDNN's kernel generation)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(N_EMBD), nn.LayerNorm(N_EMBD)
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD)
        self.c_fc = nn.Linear(N_EMBD, 4 * N_EMBD)
        self.mlp_proj = nn.Linear(4 * N_EMBD, N_EMBD)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, N_EMBD), nn.Embedding(BLOCK, N_EMBD)
        self.h = nn.ModuleList([Block() for _ in range(N_LAYER)])
        self.ln_f = nn.LayerNorm(N_EMBD)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.T
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def corpus_tokens():
    out = subprocess.run([str(CLI), "corpus", "detective", "--stories", "20000"], check=True,
                         capture_output=True)
    return np.frombuffer(out.stdout, dtype=np.uint8).astype(np.int64)


def torch_tokens_per_second(data, steps, compiled, autocast=False):
    torch.manual_seed(0)
    model = GPT()
    step_fn = torch.compile(model) if compiled else model
    decay = [p for p in model.parameters() if p.dim() == 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.95))
    rng = np.random.default_rng(0)

    def step():
        starts = rng.integers(0, len(data) - BLOCK - 1, size=BATCH)
        x = torch.from_numpy(np.stack([data[s:s + BLOCK] for s in starts]))
        y = torch.from_numpy(np.stack([data[s + 1:s + BLOCK + 1] for s in starts]))
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(WARMUP):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * BATCH * BLOCK / (time.perf_counter() - t0)


def headlight_tokens_per_second(steps, threads, dtype="f32"):
    """Timed as PyTorch is: WARMUP steps first, then `steps` steps, from the elapsed times the
    metrics log gives after each step (so the final evaluation and checkpoint are not counted)."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [str(CLI), "train", "--steps", str(WARMUP + steps), "--eval-every",
             str(10 * (WARMUP + steps)), "--eval-batches", "1", "--val-stories", "20",
             "--n-layer", str(N_LAYER), "--n-head", str(N_HEAD), "--n-embd", str(N_EMBD),
             "--block-size", str(BLOCK), "--batch", str(BATCH), "--threads", str(threads),
             "--out", f"{tmp}/m.safetensors", "--json", "--dtype", dtype, "--log-every", "1",
             "--metrics", f"{tmp}/metrics.jsonl"],
            check=True, capture_output=True, text=True)
        elapsed = {}
        with open(f"{tmp}/metrics.jsonl") as f:
            for line in f:
                row = json.loads(line)
                elapsed[row["step"]] = row["elapsed"]
    return steps * BATCH * BLOCK / (elapsed[WARMUP + steps] - elapsed[WARMUP])


def step_flops():
    """FLOPs of one training step: dense products (forward 2·P, backward 4·P per token) and the
    causal attention (forward 4·B·H·T·T·D / 2 = 2·B·T²·n_embd per layer, backward 2.5× that)."""
    tokens = BATCH * BLOCK
    product_weights = N_LAYER * 12 * N_EMBD * N_EMBD + VOCAB * N_EMBD
    products = 6 * product_weights * tokens
    attention = 3.5 * N_LAYER * 2 * BATCH * BLOCK * BLOCK * N_EMBD
    return products, attention


def measured_peak(threads, dtype="f32"):
    """(GFLOP/s, what ran) of `headlight bench peak`: the FP32 FMA peak, or with dtype bf16 that of
    the bf16 engine the kernels use (AMX tiles, else vdpbf16ps)."""
    out = subprocess.run([str(CLI), "bench", "peak", "--threads", str(threads), "--dtype", dtype,
                          "--json"], check=True, capture_output=True, text=True)
    j = json.loads(out.stdout)
    return j["peak_gflops"], j["simd_target"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--bf16", action="store_true",
                    help="also headlight --dtype bf16 and PyTorch under bf16 autocast")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data = corpus_tokens()
    dtypes = ["f32", "bf16"] if args.bf16 else ["f32"]
    probes = {dt: [measured_peak(args.threads, dt)] for dt in dtypes}
    rows = {"headlight": [], "PyTorch eager": []}
    if args.compile:
        rows["PyTorch torch.compile"] = []
    if args.bf16:
        rows["headlight --dtype bf16 (mixed precision)"] = []
        rows["PyTorch eager, bf16 autocast"] = []
    for _ in range(args.rounds):
        rows["headlight"].append(headlight_tokens_per_second(args.steps, args.threads))
        rows["PyTorch eager"].append(torch_tokens_per_second(data, args.steps, False))
        if args.bf16:
            rows["headlight --dtype bf16 (mixed precision)"].append(
                headlight_tokens_per_second(args.steps, args.threads, "bf16"))
            rows["PyTorch eager, bf16 autocast"].append(
                torch_tokens_per_second(data, args.steps, False, autocast=True))
        if args.compile:
            try:
                rows["PyTorch torch.compile"].append(torch_tokens_per_second(data, args.steps, True))
            except Exception as e:  # noqa: BLE001 - report and go on without it
                print(f"torch.compile failed here: {type(e).__name__}: {e}")
                del rows["PyTorch torch.compile"]
                args.compile = False
    for dt in dtypes:
        probes[dt].append(measured_peak(args.threads, dt))
    base = statistics.median(rows["headlight"])
    print(f"\nTraining {N_LAYER} layers × {N_HEAD} heads, n_embd {N_EMBD}, block {BLOCK}, batch "
          f"{BATCH}, {args.threads} threads, {args.steps} steps per round, {args.rounds} rounds "
          "(median tokens/s):\n")
    print("| trainer | tokens/s | headlight ÷ it |")
    print("|---|---:|---:|")
    for name, values in rows.items():
        med = statistics.median(values)
        print(f"| {name} | {med:,.0f} | {base / med:.2f}× |")
    if args.bf16:  # the two ratios, each the median of same-round ratios (drift cancels)
        mixed = rows["headlight --dtype bf16 (mixed precision)"]
        print()
        for name in ("headlight", "PyTorch eager, bf16 autocast"):
            each = [m / v for m, v in zip(mixed, rows[name])]
            print(f"headlight --dtype bf16 ÷ {name}: {statistics.median(each):.2f}× (median of "
                  f"same-round ratios; rounds {min(each):.2f}–{max(each):.2f})")
    products, attention = step_flops()
    print(f"\nWhat the machine allows: a step is {products / 1e9:.2f} GFLOP of dense products and "
          f"{attention / 1e9:.2f} GFLOP of attention.")
    ceilings = {}
    for dt in dtypes:
        peak, target = max(probes[dt])
        floor_s = (products + attention) / (peak * 1e9)
        ceilings[dt] = (BATCH * BLOCK / floor_s, peak)
        what = "the FP32 FMA peak" if dt == "f32" else f"the bf16 peak ({target})"
        who = "no float32 trainer" if dt == "f32" else "no trainer whose every FLOP ran in bf16"
        print(f"At {what} measured in this run ({peak:.1f} GFLOP/s on {args.threads} threads; "
              f"probes {', '.join(f'{p:.1f}' for p, _ in probes[dt])}) it takes at least "
              f"{floor_s * 1e3:.1f} ms, so {who} can pass {ceilings[dt][0]:,.0f} tokens/s here.")
    print("\n| trainer | against | fraction of that peak over the whole step | the most any trainer "
          "could reach ÷ it |")
    print("|---|---|---:|---:|")
    for name, values in rows.items():
        med = statistics.median(values)
        dt = "bf16" if "bf16" in name else "f32"
        ceiling, peak = ceilings[dt]
        against = f"FMA peak {peak:.0f}" if dt == "f32" else f"bf16 peak {peak:.0f}"
        print(f"| {name} | {against} | {med / ceiling:.3f} | {ceiling / med:.2f}× |")


if __name__ == "__main__":
    main()

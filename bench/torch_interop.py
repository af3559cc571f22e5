#!/usr/bin/env python3
"""headlight inside PyTorch against PyTorch itself, in one run.

    .venv/bin/python bench/torch_interop.py [--threads 2] [--runs 5] [--rounds 3] [--quick]

1. The operator: forward + backward of headlight.torch.scaled_dot_product_attention against
   torch.nn.functional.scaled_dot_product_attention (float32, B = 1, H = 8), N ∈ {512, 2048},
   D ∈ {64, 128}, causal and not; GFLOP/s from 4·B·H·N²·D forward + 2.5× that backward (halved
   when causal), as a fraction of the FMA peak measured in the same run.
   Beside each fp32 row, the time its seven N·N·D products alone take as plain matrix products
   at oneDNN's rate (`headlight bench matmul`, this run), and torch's time over it: the most any
   attention kernel could gain over torch on this machine if its softmax and everything else cost
   nothing.
   The same in bfloat16 (fractions of the bf16 peak, `headlight bench peak --dtype bf16`).
2. Per-call overhead: the operator against the numpy front (headlight.scaled_dot_product_attention)
   on a 1-row, 8-wide problem, where the kernel's own time is negligible: the difference is what
   the PyTorch wrapping costs (custom op dispatch, views of the tensors).
3. A transformers GPT-2-small-shaped model (random weights, 12 layers × 12 heads, 768 wide, one
   sequence of 512 tokens): forward, a training step (forward + backward of the LM loss) with
   attn_implementation "headlight" against "sdpa", and capture of every head
   (headlight.torch.capture) against output_attentions=True with "eager"; beside them the same
   model with an attention that costs nothing (its output is the values), which bounds the
   speed-up any attention implementation can give the whole model.

Each time is the median over --rounds of medians of --runs calls; the things compared take turns
within each round, and each speed-up is the median over the rounds of the same round's ratio (the
machine is shared, and its speed drifts by more than some of the differences measured). Prints
Markdown tables.
"""

import argparse
import copy
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / "build" / "release" / "apps" / "cli" / "headlight"
sys.path.insert(0, str(ROOT / "build" / "release" / "python"))

sys.path.insert(0, str(ROOT / "bench"))

import headlight  # noqa: E402
import headlight.torch as ht  # noqa: E402
from compare import median_seconds  # noqa: E402  (one home for the timing loop)


def rounds(fn, n):
    return statistics.median(fn() for _ in range(n))


def paired(fns, args):
    """Times the callables of `fns` in rounds: each round takes the median of --runs calls of
    each in turn, so that the machine's drifts (it is shared and noisy) fall on all of them alike.
    Returns each one's median over the rounds and, for each one after the first, the median over
    the rounds of (its time ÷ the first's time) in the same round, and those same-round ratios."""
    per_round = [[median_seconds(fn, args.runs) for fn in fns] for _ in range(args.rounds)]
    medians = [statistics.median(r[i] for r in per_round) for i in range(len(fns))]
    each = [[r[i] / r[0] for r in per_round] for i in range(1, len(fns))]
    return medians, [statistics.median(x) for x in each], each


def fma_peak(threads, dtype="f32"):
    out = subprocess.run([str(CLI), "bench", "peak", "--threads", str(threads), "--dtype", dtype,
                          "--json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["peak_gflops"]


def matmul_seconds(args, m, n, k):
    """Median seconds of oneDNN's fp32 product C[m, n] = A[m, k]·B[k, n] (`headlight bench
    matmul`), this run."""
    out = subprocess.run([str(CLI), "bench", "matmul", "--m", str(m), "--n", str(n), "--k", str(k),
                          "--threads", str(args.threads), "--runs", str(max(args.runs, 5)),
                          "--json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["seconds_median"]


def products_floor(args, N, D, heads):
    """Seconds the seven N·N·D products of an attention forward + backward (forward S = QKᵀ and
    O = PV; backward S again, dP = dO·Vᵀ, dV = Pᵀ·dO, dK = dSᵀ·Q, dQ = dS·K) take as plain
    matrix products at oneDNN's rate on this machine: 3 of shape [N, N] ← [N, D]·[D, N] and 4 of
    [N, D] ← [N, N]·[N, D], per head. Nothing else of attention (softmax, exponentials, masks)
    is in it."""
    return heads * (3 * matmul_seconds(args, N, N, D) + 4 * matmul_seconds(args, N, D, N))


def op_rows(args, peak, dtype=torch.float32):
    rows = []
    shapes = [(512, 64), (2048, 64), (512, 128), (2048, 128)]
    if args.quick:
        shapes = [(512, 64)]
    for N, D in shapes:
        for causal in (False, True):
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(1, 8, N, D, generator=g).to(dtype).requires_grad_()
                       for _ in range(3))
            go = torch.randn(1, 8, N, D, generator=g).to(dtype)

            def step(f):
                def run():
                    q.grad = k.grad = v.grad = None
                    f(q, k, v, is_causal=causal).backward(go)
                return run

            ours = step(ht.scaled_dot_product_attention)
            theirs = step(torch.nn.functional.scaled_dot_product_attention)
            (t_ours, t_theirs), (speedup,), _ = paired([ours, theirs], args)
            flops = 4 * 8 * N * N * D * 3.5 * (0.5 if causal else 1.0)
            row = (f"N={N}, D={D}{' causal' if causal else ''}",
                   f"{t_ours * 1e3:.2f} ms", f"{flops / t_ours / 1e9:.0f}",
                   f"{flops / t_ours / 1e9 / peak:.2f}", f"{t_theirs * 1e3:.2f} ms",
                   f"{speedup:.2f}×")
            if dtype == torch.float32:  # causal: half the products
                floor = products_floor(args, N, D, 8) * (0.5 if causal else 1.0)
                row += (f"{floor * 1e3:.2f} ms", f"{t_theirs / floor:.2f}×")
            rows.append(row)
    return rows


def overhead_rows(args):
    q = torch.randn(1, 1, 1, 8)
    qn = q.numpy()
    calls = 2000

    def loop(f, x):
        def run():
            for _ in range(calls):
                f(x, x, x)
        return run

    t_op = rounds(lambda: median_seconds(loop(ht.scaled_dot_product_attention, q), args.runs),
                  args.rounds) / calls
    t_np = rounds(lambda: median_seconds(loop(headlight.scaled_dot_product_attention, qn),
                                         args.runs), args.rounds) / calls
    t_torch = rounds(lambda: median_seconds(
        loop(torch.nn.functional.scaled_dot_product_attention, q), args.runs), args.rounds) / calls
    qg = q.clone().requires_grad_()
    t_grad = rounds(lambda: median_seconds(loop(ht.scaled_dot_product_attention, qg), args.runs),
                    args.rounds) / calls
    t_torch_grad = rounds(lambda: median_seconds(
        loop(torch.nn.functional.scaled_dot_product_attention, qg), args.runs), args.rounds) / calls
    return [("headlight.torch op", f"{t_op * 1e6:.1f} µs", f"{(t_op - t_np) * 1e6:+.1f} µs"),
            ("headlight.torch op, input requires grad (autograd graph)", f"{t_grad * 1e6:.1f} µs",
             f"{(t_grad - t_np) * 1e6:+.1f} µs"),
            ("headlight numpy front", f"{t_np * 1e6:.1f} µs", ""),
            ("torch SDPA", f"{t_torch * 1e6:.1f} µs", ""),
            ("torch SDPA, input requires grad", f"{t_torch_grad * 1e6:.1f} µs", "")]


def gpt2_rows(args):
    from transformers import GPT2Config, GPT2LMHeadModel

    ht.register()
    torch.manual_seed(0)
    config = GPT2Config(n_layer=12 if not args.quick else 2, n_head=12, n_embd=768,
                        n_positions=1024, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    base = GPT2LMHeadModel(config)
    state = base.state_dict()
    ids = torch.randint(0, config.vocab_size, (1, 512), generator=torch.Generator().manual_seed(1))
    # A floor: the same model with attention that costs nothing (its output is value itself),
    # so that what no attention implementation can speed up is measured in the same run.
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(
        "no-attention", lambda module, q, k, v, mask, **kw: (v.transpose(1, 2), None))
    AttentionMaskInterface.register("no-attention", sdpa_mask)
    models = {}
    for impl in ("headlight", "sdpa", "eager", "no-attention"):
        # Each model its own config: a model keeps the config object it was made with, and its
        # layers read the implementation from it at every call, so one shared config would run
        # every model on the implementation set last.
        own = copy.deepcopy(config)
        own._attn_implementation = impl
        m = GPT2LMHeadModel(own)
        m.load_state_dict(state)
        models[impl] = m.eval()
    for impl, m in models.items():
        assert m.transformer.h[0].attn.config._attn_implementation == impl, impl

    def forward(m, **kw):
        def run():
            with torch.no_grad():
                m(ids, **kw)
        return run

    def train_step(m):
        def run():
            m.zero_grad(set_to_none=True)
            m(ids, labels=ids).loss.backward()
        return run

    def capture():
        with torch.no_grad(), ht.capture(models["headlight"]) as heads:
            models["headlight"](ids)
        return heads

    # Each comparison in paired rounds: the ratios are medians of same-round ratios.
    (f_hl, f_sdpa, floor), (f_sdpa_r, floor_r), _ = paired(
        [forward(models["headlight"]), forward(models["sdpa"]), forward(models["no-attention"])],
        args)
    (s_hl, s_sdpa, step_floor), (s_sdpa_r, step_floor_r), (s_each, _) = paired(
        [train_step(models["headlight"]), train_step(models["sdpa"]),
         train_step(models["no-attention"])], args)
    (c_hl, c_eager), (c_eager_r,), _ = paired(
        [capture, forward(models["eager"], output_attentions=True)], args)
    return [("forward", f"{f_hl * 1e3:.0f} ms", "sdpa", f"{f_sdpa * 1e3:.0f} ms",
             f"{f_sdpa_r:.2f}×", f"{floor * 1e3:.0f} ms: ≤ {f_sdpa_r / floor_r:.2f}×"),
            ("training step", f"{s_hl * 1e3:.0f} ms", "sdpa", f"{s_sdpa * 1e3:.0f} ms",
             f"{s_sdpa_r:.3f}× (faster in {sum(x > 1 for x in s_each)} of {len(s_each)} rounds; "
             f"{min(s_each):.3f}–{max(s_each):.3f})",
             f"{step_floor * 1e3:.0f} ms: ≤ {s_sdpa_r / step_floor_r:.2f}×"),
            ("capture of every head", f"{c_hl * 1e3:.0f} ms", "eager, output_attentions",
             f"{c_eager * 1e3:.0f} ms", f"{c_eager_r:.2f}×",
             f"{floor * 1e3:.0f} ms: ≤ {c_eager / floor:.2f}×")]


def table(header, rows):
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one shape, a 2-layer model (a smoke run)")
    ap.add_argument("--only", choices=["op", "overhead", "gpt2"],
                    help="one part: the operator's tables, the per-call cost, or the GPT-2 rows")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    peak = fma_peak(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, FMA peak {peak:.0f} GFLOP/s "
          f"(measured in this run); medians of {args.rounds} rounds × {args.runs} runs\n")
    if args.only in (None, "op"):
        table(["forward + backward, fp32, B=1, H=8", "headlight.torch", "GFLOP/s", "of peak",
               "torch SDPA", "speed-up", "its 7 products alone at oneDNN's rate",
               "torch ÷ that: the most any kernel can gain"], op_rows(args, peak))
    if args.only in (None, "op") and not args.quick:
        peak16 = fma_peak(args.threads, "bf16")
        print(f"bf16 peak {peak16:.0f} GFLOP/s (`headlight bench peak --dtype bf16`, this run)\n")
        table(["forward + backward, bf16, B=1, H=8", "headlight.torch", "GFLOP/s",
               "of bf16 peak", "torch SDPA bf16", "speed-up"],
              op_rows(args, peak16, torch.bfloat16))
    if args.only in (None, "overhead"):
        table(["per call, 1×1×1×8", "time", "over the numpy front"], overhead_rows(args))
    if args.only in (None, "gpt2"):
        table(["GPT-2-small shape, 512 tokens", "headlight", "peer", "peer time", "speed-up",
               "the model without attention: the most any attention can gain"], gpt2_rows(args))


if __name__ == "__main__":
    main()

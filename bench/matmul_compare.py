#!/usr/bin/env python3
"""Dense product throughput of headlight (oneDNN, the Debian package) and PyTorch (torch.matmul,
its own oneDNN) on the same shapes, in one run, as fractions of this machine's peak.

    .venv/bin/python bench/matmul_compare.py [--dtype bf16|f32] [--threads 2] [--runs 9] [--rounds 3]
                                             [--shapes 2048x2048x2048,2048x2048x64,...]

A shape is MxNxK: C[M, N] = A[M, K] · B[K, N], 2·M·N·K FLOP. The default shapes are two squares,
the GPT-2 projection of docs/performance.md, and the five products of attention's backward at
N = 2048 (per head): S and dP are [N, N] over D, dV, dK and dQ [N, D] over N. With --dtype bf16
the peak is `headlight bench peak --dtype bf16` (AMX tile products with their operands already
in tiles, where the CPU has them; else vdpbf16ps; else the FMA peak), measured in the same run;
it bounds what any product can reach, and these rows show how far real products, whose operands
stream from memory, stay below it. Prints a Markdown table; rounds interleave the two libraries
and the table gives the median over rounds of each round's median.
"""

import argparse
import re
import statistics
import sys

import torch

from compare import CLI, cli_json, median_seconds  # bench/compare.py, beside this file

DEFAULT_SHAPES = "2048x2048x2048,1024x1024x1024,512x2304x768,2048x2048x64,2048x64x2048,2048x2048x128,2048x128x2048"


def parse_shapes(text):
    shapes = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", part.strip())
        if not m or min(int(g) for g in m.groups()) <= 0:
            raise SystemExit(f"--shapes: '{part}' is not MxNxK with positive sizes (e.g. 2048x2048x64)")
        shapes.append(tuple(int(g) for g in m.groups()))
    return shapes


def torch_seconds(m, n, k, dtype, runs):
    g = torch.Generator().manual_seed(0)
    a = (torch.rand(m, k, generator=g) * 2 - 1).to(dtype)
    b = (torch.rand(k, n, generator=g) * 2 - 1).to(dtype)
    return median_seconds(lambda: a @ b, runs, warmup=2)  # warm-up: oneDNN's kernel generation


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=9, help="timed runs per round (median)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median of medians)")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated MxNxK")
    args = ap.parse_args()
    if args.threads <= 0 or args.runs <= 0 or args.rounds <= 0:
        raise SystemExit("--threads, --runs and --rounds must be positive")
    shapes = parse_shapes(args.shapes)
    if not CLI.exists():
        raise SystemExit(f"{CLI} is missing: run `make build` first")
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    peak = cli_json("bench", "peak", "--threads", args.threads, "--dtype", args.dtype)
    rows = {s: {"headlight": [], "torch": []} for s in shapes}
    for _ in range(args.rounds):
        for m, n, k in shapes:
            r = cli_json("bench", "matmul", "--m", m, "--n", n, "--k", k, "--dtype", args.dtype,
                         "--threads", args.threads, "--runs", args.runs)
            rows[(m, n, k)]["headlight"].append(r["seconds_median"])
            rows[(m, n, k)]["torch"].append(torch_seconds(m, n, k, dtype, args.runs))

    gflops_peak = peak["peak_gflops"]
    print(f"{args.dtype} peak measured in this run: {gflops_peak:.1f} GFLOP/s on {args.threads} "
          f"threads ({peak['simd_target']}); torch {torch.__version__}; median over "
          f"{args.rounds} interleaved rounds of the median of {args.runs} runs")
    print("| shape (M×N×K) | implementation | ms | GFLOP/s | fraction of peak |")
    print("|---|---|---:|---:|---:|")
    for (m, n, k), r in rows.items():
        flops = 2.0 * m * n * k
        for name, label in (("headlight", "headlight (oneDNN)"), ("torch", "PyTorch matmul")):
            s = statistics.median(r[name])
            g = flops / s * 1e-9
            print(f"| {m}×{n}×{k} | {label} | {s * 1e3:.4g} | {g:.4g} | {g / gflops_peak:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

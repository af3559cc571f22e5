#!/usr/bin/env python3
"""Attention forward throughput of headlight and its peers on the same shapes, in one run.

    .venv/bin/python bench/compare.py [--threads 2] [--runs 5] [--rounds 3] [--shapes 512x64,2048x64,2048x128]
    .venv/bin/python bench/compare.py --dtype bf16 [...]

Rows: headlight's fused kernel and its unfused path (oneDNN products + softmax), measured by
`headlight bench attention`; PyTorch's scaled_dot_product_attention (its CPU flash kernel) and
nn.MultiheadAttention (need_weights=False; the whole module is timed, projections included, and
only the attention FLOPs are counted, so its figure understates its attention kernel);
ONNX Runtime's MultiHeadAttention when `onnxruntime` and
`onnx` are installed. GFLOP/s use 4·B·H·N²·D (halved when causal); the FMA peak is measured by
`headlight bench peak` in the same run. Prints a Markdown table.

With --dtype bf16 the rows are headlight's fused kernel in bf16 and in fp32, and PyTorch's SDPA in
bf16 and in fp32 (q, k, v of that dtype); fractions are of the bf16 peak (`headlight bench peak
--dtype bf16`: AMX tiles where the CPU has them, else vdpbf16ps, else the FMA peak), measured in
the same run, and the FMA peak is printed beside it.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / "build" / "release" / "apps" / "cli" / "headlight"


def cli_json(*args):
    out = subprocess.run([str(CLI), *map(str, args), "--json"], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout)


def median_seconds(fn, runs, warmup=1):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def torch_sdpa(B, H, N, D, causal, runs, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q, k, v = ((torch.rand(B, H, N, D, generator=g) * 2 - 1).to(dtype) for _ in range(3))
    with torch.no_grad():
        return median_seconds(lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal), runs)


def torch_mha(B, H, N, D, causal, runs):
    E = H * D
    m = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
    x = torch.rand(B, N, E)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(N) if causal else None
    with torch.no_grad():
        return median_seconds(lambda: m(x, x, x, need_weights=False, attn_mask=mask, is_causal=causal), runs)


def onnxruntime_mha(B, H, N, D, causal, runs, threads):
    try:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return None
    if causal:
        return None  # the contrib op's causal form needs extra inputs; not compared here
    E = H * D
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["out"], domain="com.microsoft",
                            num_heads=H)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [B, N, E]) for n in "qkv"]
    graph = helper.make_graph([node], "mha", inputs,
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [B, N, E])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feeds = {n: np.random.rand(B, N, E).astype(np.float32) for n in "qkv"}
    return median_seconds(lambda: sess.run(None, feeds), runs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5, help="timed runs per round (median)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median of medians)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--shapes", default="512x64,2048x64,2048x128",
                    help="comma-separated NxD; append c for causal, e.g. 2048x64c; h<H> sets the heads "
                         "of one shape, e.g. 8192x64h1")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    args = ap.parse_args()
    bf16 = args.dtype == "bf16"
    if not CLI.exists():
        sys.exit(f"{CLI} not found: run `make` first")
    torch.set_num_threads(args.threads)
    B, H, T = args.batch, args.heads, args.threads
    # The peak is probed before and after the table (best of 7 repeats each) and the larger is
    # used: on a shared 2-vCPU machine one probe can land while the other vCPU is busy.
    peak_args = ["bench", "peak", "--threads", str(T), "--dtype", args.dtype]
    peaks = [cli_json(*peak_args)["peak_gflops"]]
    fma_peaks = [cli_json("bench", "peak", "--threads", str(T))["peak_gflops"]] if bf16 else peaks
    lines = []
    for spec in args.shapes.split(","):
        H = args.heads
        if "h" in spec:
            spec, heads = spec.split("h")
            H = int(heads)
        causal = spec.endswith("c")
        N, D = (int(x) for x in spec.rstrip("c").split("x"))
        flops = 4.0 * B * H * N * N * D / (2 if causal else 1)
        common = ["bench", "attention", "--batch", str(B), "--heads", str(H), "--seq", str(N),
                  "--head-dim", str(D), "--threads", str(T), "--runs", str(args.runs)]
        if causal:
            common.append("--causal")
        measure = {
            "headlight fused bf16": lambda: cli_json(*common, "--dtype", "bf16")["seconds_median"],
            "headlight fused fp32": lambda: cli_json(*common)["seconds_median"],
            "PyTorch SDPA bf16": lambda: torch_sdpa(B, H, N, D, causal, args.runs, torch.bfloat16),
            "PyTorch SDPA fp32": lambda: torch_sdpa(B, H, N, D, causal, args.runs),
        } if bf16 else {
            "headlight fused": lambda: cli_json(*common)["seconds_median"],
            "headlight unfused (oneDNN + softmax)":
                lambda: cli_json(*common, "--kernel", "unfused")["seconds_median"],
            "PyTorch SDPA": lambda: torch_sdpa(B, H, N, D, causal, args.runs),
            "PyTorch nn.MultiheadAttention (whole module)": lambda: torch_mha(B, H, N, D, causal, args.runs),
            "ONNX Runtime MultiHeadAttention": lambda: onnxruntime_mha(B, H, N, D, causal, args.runs, T),
        }
        # Interleaved rounds: a burst of load from a neighbour on the shared machine then spoils
        # one round of every implementation rather than all runs of one of them.
        results = {name: [] for name in measure}
        for _ in range(args.rounds):
            for name, fn in measure.items():
                results[name].append(fn())
        rows = [(name, None if None in secs else statistics.median(secs)) for name, secs in results.items()]
        fused = rows[0][1]
        label = f"N={N}, D={D}{' causal' if causal else ''}"
        for name, sec in rows:
            lines.append((label, name, sec, None if sec is None else flops / sec * 1e-9, sec and sec / fused))
    peaks.append(cli_json(*peak_args)["peak_gflops"])
    peak = max(peaks)
    kind = "bf16 (" + cli_json(*peak_args)["simd_target"] + ")" if bf16 else "FP32 FMA"
    print(f"{kind} peak measured in this run: {peak:.1f} GFLOP/s on {T} threads (probes: "
          f"{', '.join(f'{p:.1f}' for p in peaks)}); torch {torch.__version__}; B={B}, H={args.heads} "
          f"unless the shape says; median over {args.rounds} interleaved rounds of the median of "
          f"{args.runs} runs\n")
    if bf16:
        print(f"FP32 FMA peak in the same run: {max(fma_peaks):.1f} GFLOP/s\n")
    print("| shape | implementation | ms | GFLOP/s | fraction of peak | headlight fused ÷ this |")
    print("|---|---|---:|---:|---:|---:|")
    for label, name, sec, gflops, ratio in lines:
        if sec is None:
            print(f"| {label} | {name} | n/a | | | |")
        else:
            print(f"| {label} | {name} | {sec * 1e3:.2f} | {gflops:.1f} | {gflops / peak:.3f} | {ratio:.2f}× |")


if __name__ == "__main__":
    main()

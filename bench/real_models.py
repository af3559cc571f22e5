#!/usr/bin/env python3
"""Real models, headlight against its peers in one run (fp32, medians of --runs runs each).

    .venv/bin/python bench/real_models.py [--threads 2] [--runs 5] [--only minilm|smollm2]

all-MiniLM-L6-v2 sentence embeddings: sentences/s over 512 sentences of 6 to 100 words (words drawn
from the project's docs with a fixed seed), batch 32, for headlight (`Model.encode`: a batch's
texts packed end to end, no padding; in float32 and with bf16 products), sentence-transformers
(torch; it sorts by length to cut padding) and ONNX Runtime (the same BertModel exported with torch.onnx, batches in input order,
padded to the batch's longest; mean pooling and normalisation in numpy); and the time to embed one
sentence alone (the median over 50 sentences). GFLOP/s count the useful
work only: per text of T tokens, per layer, 2·T·(4C² + 2CF) for the products and 4·T²·C for
attention (C = 384, F = 1536).

SmolLM2-135M-Instruct: prefill is the time to the first new token from a 512-token prompt
(`generate(prompt, 1)`, logits of the last position only, for both); decode is tokens/s over 128
greedy tokens after a 16-token prompt. transformers runs the same GGUF weights dequantised to
fp32. Prefill GFLOP/s count 2·T·(weights of the blocks) + causal attention 2·T²·H·hd per layer +
the last row's LM head; decode's bandwidth fraction counts the fp32 weights read once per token
(embedding table included: it is the tied LM head). llama.cpp (llama-cpp-python on the GGUF's own
Q4_1/Q8_0 weights) is quoted beside them when installed (bench/requirements.txt).

Limits measured in the same run: the FMA peak (`headlight bench peak`), the memory read bandwidth
(`headlight bench bandwidth`) and, for each model, the time its dense products alone take in
oneDNN (`headlight bench matmul` on each product's shape): no fp32 implementation built on those
products can beat that time, so it bounds every speed-up.
"""

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from compare import cli_json, median_seconds  # bench/compare.py, beside this file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python" / "tests"))
from model_files import MINILM_DIR, SMOLLM2_GGUF  # noqa: E402


def sentences(n=512, seed=0):
    words = re.findall(r"[A-Za-z][a-z']+", " ".join(
        p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))))
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, size=int(rng.integers(6, 101)))) for _ in range(n)]


def products_seconds(shapes, threads):
    """Median seconds of oneDNN's products of these (m, k, n, count) shapes, summed."""
    total = 0.0
    for m, k, n, count in shapes:
        r = cli_json("bench", "matmul", "--m", m, "--k", k, "--n", n, "--threads", threads,
                     "--runs", 5)
        total += count * r["seconds_median"]
    return total


def bench_minilm(args, peak, rows):
    import torch
    import headlight
    from sentence_transformers import SentenceTransformer
    texts = sentences()
    m = headlight.load(str(MINILM_DIR), threads=args.threads)
    lengths = [len(m.tokenizer.encode(t)[:256]) for t in texts]
    C, F, L = 384, 1536, 6
    flops = sum(L * (2 * T * (4 * C * C + 2 * C * F) + 4 * T * T * C) for T in lengths)
    n = len(texts)

    def row(name, sec, note=""):
        gf = flops / sec / 1e9
        rows.append(("MiniLM embeddings", name, f"{n / sec:.1f} sentences/s", f"{gf:.0f}",
                     f"{gf / peak:.2f}", note))
        return sec

    hl = row("headlight", median_seconds(lambda: m.encode(texts, batch_size=32), args.runs))
    # bf16 products (weights packed once for oneDNN, each product's input rounded).
    m.dtype = "bfloat16"
    row("headlight, dtype bfloat16", median_seconds(lambda: m.encode(texts, batch_size=32),
                                                    args.runs),
        "bf16 products; the fraction is of the FP32 peak")
    m.dtype = "float32"
    st = SentenceTransformer(str(MINILM_DIR), device="cpu")
    st_sec = row("sentence-transformers (torch)",
                 median_seconds(lambda: st.encode(texts, batch_size=32), args.runs))

    # One sentence at a time (a search query): the median over the first 50 texts of one call.
    def one_by_one(encode):
        return statistics.median(median_seconds(lambda: encode([t]), args.runs) for t in texts[:50])

    def latency_row(name, sec):
        rows.append(("MiniLM, one sentence", name, f"{sec * 1e3:.2f} ms", "", "", ""))

    latency_row("headlight", one_by_one(m.encode))
    m.dtype = "bfloat16"
    latency_row("headlight, dtype bfloat16", one_by_one(m.encode))
    m.dtype = "float32"
    latency_row("sentence-transformers (torch)", one_by_one(st.encode))
    ort_sec = None
    try:
        ort_sec = row("ONNX Runtime", onnx_minilm_seconds(texts, args))
    except Exception as e:  # noqa: BLE001 - an optional peer
        rows.append(("MiniLM embeddings", "ONNX Runtime", "not run", "", "", str(e)[:80]))
    # The bound: MiniLM's products on the packed rows of each batch of 32, at oneDNN's rate.
    shapes = []
    for i in range(0, n, 32):
        R = sum(lengths[i:i + 32])
        shapes += [(R, C, 3 * C, L), (R, C, C, L), (R, C, F, L), (R, F, C, L)]
    bound = products_seconds(shapes, args.threads)
    row("bound: its products alone in oneDNN", bound, "no fp32 implementation on them beats it")
    best_peer = min(s for s in (st_sec, ort_sec) if s)
    return {"headlight_over_best_peer": best_peer / hl, "bound_over_best_peer": best_peer / bound}


def onnx_minilm_seconds(texts, args):
    import onnxruntime as ort
    import torch
    from transformers import AutoModel, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(MINILM_DIR))
    bert = AutoModel.from_pretrained(str(MINILM_DIR)).eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    path = Path(tempfile.mkdtemp()) / "minilm.onnx"
    dummy = tok(["a b c"], return_tensors="pt")
    torch.onnx.export(Hidden().eval(), (dummy["input_ids"], dummy["attention_mask"]), str(path),
                      input_names=["input_ids", "attention_mask"], output_names=["hidden"],
                      dynamic_axes={"input_ids": {0: "b", 1: "t"},
                                    "attention_mask": {0: "b", 1: "t"}, "hidden": {0: "b", 1: "t"}},
                      opset_version=17, dynamo=False)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    batches = [tok(texts[i:i + 32], padding=True, truncation=True, max_length=256,
                   return_tensors="np") for i in range(0, len(texts), 32)]

    def run():
        out = []
        for b in batches:
            h = sess.run(None, {"input_ids": b["input_ids"].astype(np.int64),
                                "attention_mask": b["attention_mask"].astype(np.int64)})[0]
            mask = b["attention_mask"][..., None].astype(np.float32)
            v = (h * mask).sum(1) / mask.sum(1)
            out.append(v / np.linalg.norm(v, axis=1, keepdims=True))
        return np.concatenate(out)
    return median_seconds(run, args.runs)


def bench_smollm2(args, peak, bandwidth, rows):
    import torch
    import headlight
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(args.threads)
    m = headlight.load(str(SMOLLM2_GGUF), threads=args.threads)
    c = m.config
    C, H, G, F, L, V = c["n_embd"], c["n_head"], c["n_kv_head"], c["mlp_hidden"], c["n_layer"], \
        c["vocab_size"]
    hd = C // H
    T = 512
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, 49000, size=T).astype(np.int32)
    short = prompt[:16]
    block = C * (H + 2 * G) * hd + H * hd * C + 3 * C * F
    pre_flops = 2 * T * L * block + L * 2 * T * T * H * hd + 2 * C * V
    weight_bytes = 4 * (L * block + V * C + (2 * L + 1) * C)
    new = 128

    def prefill_row(name, sec, note=""):
        gf = pre_flops / sec / 1e9
        rows.append(("SmolLM2 prefill (512)", name, f"{T / sec:.0f} tokens/s", f"{gf:.0f}",
                     f"{gf / peak:.2f}", note))
        return sec

    def decode_row(name, sec, note="", bytes_per_token=weight_bytes):
        tps = new / sec
        rows.append(("SmolLM2 decode (128)", name, f"{tps:.1f} tokens/s", "",
                     f"{tps * bytes_per_token / 1e9 / bandwidth:.2f} of bandwidth", note))
        return sec

    hl_pre = prefill_row("headlight", median_seconds(
        lambda: m.generate(prompt, 1, temperature=0, stop_at_eos=False), args.runs))
    hl_dec = decode_row("headlight", median_seconds(
        lambda: m.generate(short, new, temperature=0, stop_at_eos=False), args.runs))
    # bf16 products (weights and each product's input rounded, fp32 accumulation and activations).
    m.dtype = "bfloat16"
    prefill_row("headlight, dtype bfloat16", median_seconds(
        lambda: m.generate(prompt, 1, temperature=0, stop_at_eos=False), args.runs),
        "bf16 products; the fraction is of the FP32 peak")
    decode_row("headlight, dtype bfloat16", median_seconds(
        lambda: m.generate(short, new, temperature=0, stop_at_eos=False), args.runs),
        "bf16 weights: half the bytes per token", weight_bytes // 2)
    m.dtype = "float32"
    ref = AutoModelForCausalLM.from_pretrained(str(SMOLLM2_GGUF.parent), gguf_file=SMOLLM2_GGUF.name,
                                               dtype=torch.float32).eval()
    p = torch.tensor(prompt[None], dtype=torch.long)
    s = torch.tensor(short[None], dtype=torch.long)
    with torch.no_grad():
        tf_pre = prefill_row("transformers (torch)", median_seconds(
            lambda: ref.generate(p, max_new_tokens=1, do_sample=False), args.runs))
        tf_dec = decode_row("transformers (torch)", median_seconds(
            lambda: ref.generate(s, max_new_tokens=new, min_new_tokens=new, do_sample=False),
            args.runs))
    ref16 = AutoModelForCausalLM.from_pretrained(str(SMOLLM2_GGUF.parent), gguf_file=SMOLLM2_GGUF.name,
                                                 dtype=torch.bfloat16).eval()
    with torch.no_grad():
        prefill_row("transformers (torch), bfloat16", median_seconds(
            lambda: ref16.generate(p, max_new_tokens=1, do_sample=False), args.runs),
            "every op in bf16; the fraction is of the FP32 peak")
        decode_row("transformers (torch), bfloat16", median_seconds(
            lambda: ref16.generate(s, max_new_tokens=new, min_new_tokens=new, do_sample=False),
            args.runs), "bf16 weights", weight_bytes // 2)
    del ref16
    bound = products_seconds([(T, C, (H + 2 * G) * hd, L), (T, H * hd, C, L), (T, C, 2 * F, L),
                              (T, F, C, L)], args.threads)
    prefill_row("bound: its products alone in oneDNN", bound,
                "no fp32 implementation on them beats it")
    decode_row("bound: the fp32 weights at the measured bandwidth",
               new * weight_bytes / (bandwidth * 1e9))
    lc = llama_cpp_seconds(prompt, short, new, args)
    if isinstance(lc, str):
        rows.append(("SmolLM2", "llama.cpp", "not run", "", "", lc))
    else:
        prefill_row("llama.cpp (its Q4_1/Q8_0 weights)", lc["prefill"])
        decode_row("llama.cpp (its Q4_1/Q8_0 weights)", lc["decode"],
                   "quantised: fewer bytes per token", SMOLLM2_GGUF.stat().st_size)
    return {"prefill_over_transformers": tf_pre / hl_pre,
            "prefill_bound_over_transformers": tf_pre / bound,
            "decode_over_transformers": tf_dec / hl_dec}


LLAMA_CPP = """
import json, statistics, sys, time
from llama_cpp import Llama
a = json.loads(sys.argv[1])
llm = Llama(a["path"], n_threads=a["threads"], n_ctx=1024, n_batch=512, verbose=False)
def median(fn):
    fn()
    ts = []
    for _ in range(a["runs"]):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts)
def prefill():
    llm.reset(); llm.eval(a["prompt"])
def decode():
    llm.reset()
    for i, _ in enumerate(llm.generate(a["short"], temp=0.0)):
        if i + 1 == a["new"]: break
print(json.dumps({"prefill": median(prefill), "decode": median(decode)}))
"""


def llama_cpp_seconds(prompt, short, new, args):
    """llama.cpp's prefill and decode seconds, measured in a child process (an optional peer: a
    crash or a missing package is reported, not fatal); or why it did not run."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return "not installed (pip install -r bench/requirements.txt)"
    arg = json.dumps({"path": str(SMOLLM2_GGUF), "threads": args.threads, "runs": args.runs,
                      "prompt": prompt.tolist(), "short": short.tolist(), "new": new})
    r = subprocess.run([sys.executable, "-c", LLAMA_CPP, arg], capture_output=True, text=True)
    if r.returncode != 0:
        return f"failed (exit {r.returncode}): {r.stderr.strip()[-80:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", choices=["minilm", "smollm2"])
    args = ap.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    peak = max(cli_json("bench", "peak", "--threads", args.threads)["peak_gflops"] for _ in range(2))
    bandwidth = max(cli_json("bench", "bandwidth", "--threads", args.threads)["gbytes_per_second"]
                    for _ in range(2))
    rows, ratios = [], {}
    if args.only != "smollm2":
        ratios.update(bench_minilm(args, peak, rows))
    if args.only != "minilm":
        ratios.update(bench_smollm2(args, peak, bandwidth, rows))
    print(f"FP32 FMA peak {peak:.0f} GFLOP/s, read bandwidth {bandwidth:.1f} GB/s, {args.threads} "
          f"threads, medians of {args.runs} runs; torch {torch.__version__}")
    print()
    print("| workload | implementation | speed | GFLOP/s | fraction of peak | note |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}×")


if __name__ == "__main__":
    main()

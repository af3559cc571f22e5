"""`headlight train --init`: fine-tuning starts from a checkpoint's weights and tokenizer with a new
optimizer and schedule (the second stage of the bundled model's recipe), and refuses options that
would describe another model."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

import headlight

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "build" / "release" / "apps" / "cli" / "headlight"
SMALL = ["--stories", 200, "--val-stories", 20, "--eval-every", 1000, "--threads", 1]
MODEL = ["--n-layer", 1, "--n-head", 2, "--n-embd", 32, "--block-size", 32]


def train(*args, check=True):
    return subprocess.run([str(CLI), "train", *map(str, SMALL), *map(str, args)], check=check,
                          capture_output=True, text=True)


def first_losses(metrics):
    rows = [json.loads(line) for line in Path(metrics).read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("init")
    train(*MODEL, "--tokenizer", "bpe:300", "--steps", 150, "--warmup", 5, "--lr", 1e-2,
          "--min-lr", 1e-3, "--metrics", d / "base.jsonl", "--out", d / "base.safetensors")
    return d


def test_init_starts_from_the_checkpoint_weights_and_tokenizer(base):
    out = base / "tuned.safetensors"
    train("--init", base / "base.safetensors", "--drills", 0.5, "--steps", 10, "--warmup", 5, "--lr", 1e-3,
          "--metrics", base / "tuned.jsonl", "--out", out)
    a, b = headlight.GPT.load(str(base / "base.safetensors")), headlight.GPT.load(str(out))
    assert a.config == b.config
    text = "The red key for Maria lay in the kitchen."
    assert a.tokenizer.encode(text) == b.tokenizer.encode(text)
    assert b.tokenizer.vocab_size > 256  # the BPE tokenizer, not the default bytes
    tokens = np.array([a.tokenizer.encode(text)], np.int64)
    la, lb = a.forward(tokens), b.forward(tokens)
    assert not np.array_equal(la, lb)  # it trained
    # The fine-tuning's first loss is the base model's level, far below that of the same run
    # from fresh weights.
    train(*MODEL, "--tokenizer", "bpe:300", "--drills", 0.5, "--steps", 10, "--warmup", 5,
          "--lr", 1e-3, "--metrics", base / "fresh.jsonl", "--out", base / "fresh.safetensors")
    base_losses, tuned = first_losses(base / "base.jsonl"), first_losses(base / "tuned.jsonl")
    fresh = first_losses(base / "fresh.jsonl")
    assert tuned[0] < fresh[0] - 1.0
    assert abs(tuned[0] - base_losses[-1]) < 0.5


def test_init_refuses_model_options_and_resume(base):
    init = ["--init", base / "base.safetensors", "--steps", 2, "--out", base / "x.safetensors"]
    for extra in (["--n-layer", 2], ["--tokenizer", "byte"], ["--positional", "rope"]):
        r = train(*init, *extra, check=False)
        assert r.returncode != 0
        assert "--init" in r.stderr and extra[0] in r.stderr and "checkpoint" in r.stderr
    r = train(*init, "--resume", check=False)
    assert r.returncode != 0 and "--resume" in r.stderr
    before = (base / "base.safetensors").read_bytes()
    r = train("--resume", "--n-embd", 64, "--steps", 200, "--out", base / "base.safetensors",
              check=False)
    assert r.returncode != 0 and "--resume" in r.stderr and "--n-embd" in r.stderr
    assert (base / "base.safetensors").read_bytes() == before
    r = train("--init", base / "missing.safetensors", "--steps", 2, "--out", base / "y.safetensors",
              check=False)
    assert r.returncode != 0 and "missing.safetensors" in r.stderr
    assert not (base / "x.safetensors").exists() and not (base / "y.safetensors").exists()


def test_mixed_precision_training_follows_float32_training(tmp_path):
    """`train --dtype bf16` (bf16 products, fp32 master weights and AdamW state) on the detective
    corpus: every logged training loss within 2% of float32 training's, and the validation loss
    within 1%, after 120 steps from the same seed."""
    model = ["--n-layer", 2, "--n-head", 4, "--n-embd", 64, "--block-size", 64]
    losses, val = {}, {}
    for dtype in ("f32", "bf16"):
        out = train(*model, "--tokenizer", "bpe:300", "--steps", 120, "--warmup", 10, "--lr", 5e-3,
                    "--metrics", tmp_path / f"{dtype}.jsonl", "--out", tmp_path / f"{dtype}.safetensors",
                    "--dtype", dtype, "--json")
        losses[dtype] = np.array(first_losses(tmp_path / f"{dtype}.jsonl"))
        val[dtype] = json.loads(out.stdout)["val_loss"]
    assert losses["f32"].size > 5 and losses["f32"][-1] < losses["f32"][0] - 1.0
    assert np.all(np.abs(losses["bf16"] - losses["f32"]) <= 0.02 * losses["f32"]), (losses)
    assert abs(val["bf16"] - val["f32"]) <= 0.01 * val["f32"], val
    assert not np.array_equal(losses["bf16"], losses["f32"])  # bf16 products did run


def test_training_in_micro_batches_follows_whole_batches_with_the_same_bits_on_any_thread_count(
        tmp_path):
    """`train --micro-batches 4` (each part's forward and backward whole on one thread, their
    gradients added in part order) trains as the whole batch does: the first loss within 10⁻⁵,
    every logged loss within 1%; and it writes the same file bit for bit on 1 and 2 threads."""
    model = ["--n-layer", 2, "--n-head", 4, "--n-embd", 64, "--block-size", 64]
    common = ["--stories", 200, "--val-stories", 20, "--eval-every", 1000, *model, "--steps", 30,
              "--warmup", 5, "--lr", 5e-3, "--log-every", 1]

    def run(name, threads, parts):
        subprocess.run([str(CLI), "train", *map(str, common), "--threads", str(threads),
                        "--micro-batches", str(parts), "--metrics", str(tmp_path / f"{name}.jsonl"),
                        "--out", str(tmp_path / f"{name}.safetensors")],
                       check=True, capture_output=True, text=True)
        return np.array(first_losses(tmp_path / f"{name}.jsonl"))

    whole, parts = run("whole", 2, 1), run("parts2", 2, 4)
    assert abs(parts[0] - whole[0]) <= 1e-5 * whole[0], (parts[0], whole[0])
    assert np.all(np.abs(parts - whole) <= 0.01 * whole), (parts, whole)
    run("parts1", 1, 4)
    assert (tmp_path / "parts1.safetensors").read_bytes() == \
        (tmp_path / "parts2.safetensors").read_bytes()


def test_micro_batches_that_do_not_divide_the_batch_are_refused(tmp_path):
    r = train("--batch", 16, "--micro-batches", 3, "--steps", 2, "--out", tmp_path / "m.safetensors",
              check=False)
    assert r.returncode != 0 and "micro_batches: 3 does not divide the batch of 16" in r.stderr
    assert not (tmp_path / "m.safetensors").exists()

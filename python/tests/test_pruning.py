"""Pruned real models. `headlight prune --out` writes a checkpoint that loads with the source's
tokenizer, chat template and pooling, and computes what the unpruned model computes with the
removed heads' outputs zeroed — here transformers' model with a hook that zeroes those heads'
slices of the output projection's input. Grouped-query heads (a Llama folder), an embedding model
judged on its sentence embeddings (MiniLM) and a GGUF file (SmolLM2, whose tokenizer is written
out as tokenizer.json text that the `tokenizers` library reads back)."""

import json
import struct
import subprocess
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

import headlight
from model_files import MINILM_DIR, SMOLLM2_GGUF

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "build" / "release" / "apps" / "cli" / "headlight"
PROSE = ROOT / "data" / "genesis.txt"
TEXTS = ["Maria lost her keys; she found them under the sofa.",
         "In the beginning God created the heaven and the earth.",
         "Prices rose 3.5% in 2024 — déjà vu! 東京 🎉 <|im_start|>user"]


def run(*args, check=True):
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, check=check)


def prune(model, out, *args):
    r = run("prune", model, "--corpus", PROSE, "--threads", 2, "--out", out, "--json", *args)
    return json.loads(r.stdout)


def metadata(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))["__metadata__"]


def with_heads_zeroed(run, projections, removed, head_dim):
    """run() (without gradients) with hooks on each layer's output projection that zero the removed
    heads' slices of its input."""
    hooks = []
    for layer, proj in enumerate(projections):
        gone = [h for (l, h) in removed if l == layer]

        def hook(module, args, gone=gone):
            x = args[0].clone()
            for h in gone:
                x[..., h * head_dim:(h + 1) * head_dim] = 0
            return (x,)
        hooks.append(proj.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            return run()
    finally:
        for h in hooks:
            h.remove()


def test_a_pruned_grouped_query_model_equals_its_heads_zeroed(tmp_path):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg).eval()
    folder = tmp_path / "llama"
    model.save_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(str(SMOLLM2_GGUF.parent), gguf_file=SMOLLM2_GGUF.name)
    tok.save_pretrained(folder)
    out = tmp_path / "pruned.safetensors"
    doc = prune(folder, out, "--fraction", 0.5, "--by", "random", "--seed", 4, "--sequences", 2,
                "--seq", 32)
    removed = [tuple(h) for h in doc["heads_removed"]]
    assert doc["measure"] == "loss" and len(removed) == 12
    original, pruned = headlight.load(str(folder)), headlight.load(str(out))
    assert pruned.config["architecture"] == "LlamaForCausalLM"
    assert pruned.chat_template == original.chat_template
    assert pruned.config["eos_token_ids"] == original.config["eos_token_ids"]
    for text in TEXTS:
        assert pruned.tokenizer.encode(text) == original.tokenizer.encode(text)
    groups = json.loads(metadata(out)["headlight.config"])["layer_groups"]
    assert [sum(g) for g in groups] == [8 - sum(1 for (l, _) in removed if l == i)
                                        for i in range(3)]
    ids = np.array([original.tokenizer.encode(TEXTS[0] + " " + TEXTS[1])], dtype=np.int32)
    want = with_heads_zeroed(lambda: model(torch.tensor(ids, dtype=torch.long)).logits.numpy(),
                             [layer.self_attn.o_proj for layer in model.model.layers], removed, 8)
    got = pruned.forward(ids)
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
    # Decoding through the KV cache (groups of unequal sizes) continues as the forward predicts.
    step = ids[0][:6]
    for token in pruned.generate(step, 4, temperature=0, stop_at_eos=False):
        assert token == int(np.argmax(pruned.forward(step[None])[0, -1]))
        step = np.append(step, token).astype(np.int32)


def test_a_pruned_embedding_model_keeps_its_pooling_and_equals_its_heads_zeroed(tmp_path):
    from transformers import AutoModel
    out = tmp_path / "minilm.safetensors"
    doc = prune(MINILM_DIR, out, "--fraction", 0.25, "--sequences", 4)
    removed = [tuple(h) for h in doc["heads_removed"]]
    assert doc["measure"] == "1 − cosine" and len(removed) == 18
    assert 0 <= doc["loss_before"] < 1e-6 < doc["loss_after"] < 0.2
    pruned = headlight.load(str(out))
    c = pruned.config
    assert (c["architecture"], c["pooling"], c["normalize"], c["max_seq_length"]) == (
        "BertModel", "mean", True, 256)
    ref = AutoModel.from_pretrained(str(MINILM_DIR), attn_implementation="eager").eval()
    ids = np.array([pruned.tokenizer.encode(TEXTS[0])], dtype=np.int32)
    want = with_heads_zeroed(
        lambda: ref(torch.tensor(ids, dtype=torch.long)).last_hidden_state.numpy(),
        [layer.attention.output.dense for layer in ref.encoder.layer], removed, 32)
    got = pruned.forward(ids)
    assert np.abs(got - want).max() < 2e-5 * np.abs(want).max()
    e = pruned.encode(TEXTS)
    full = headlight.load(str(MINILM_DIR)).encode(TEXTS)
    assert np.allclose(np.linalg.norm(e, axis=1), 1, atol=1e-5)
    assert (np.sum(e * full, axis=1) > 0.5).all()


def test_a_pruned_gguf_model_carries_its_tokenizer_as_tokenizer_json(tmp_path):
    out = tmp_path / "smol.safetensors"
    doc = prune(SMOLLM2_GGUF, out, "--fraction", 0.1, "--by", "random", "--sequences", 1, "--seq",
                16)
    assert len(doc["heads_removed"]) == 27
    source, pruned = headlight.load(str(SMOLLM2_GGUF)), headlight.load(str(out))
    lines = (ROOT / "data" / "tokenizer_test.txt").read_text(encoding="utf-8").splitlines()[::7]
    oracle = Tokenizer.from_str(metadata(out)["headlight.hf_tokenizer"])
    for text in TEXTS + lines:
        want = source.tokenizer.encode(text)
        assert pruned.tokenizer.encode(text) == want
        assert oracle.encode(text).ids == want
    assert pruned.chat_template == source.chat_template
    assert pruned.config["eos_token_ids"] == source.config["eos_token_ids"]
    assert pruned.config["architecture"] == "llama"
    r = run("info", out)
    assert "ChatML" in r.stdout and "byte-level BPE" in r.stdout


def test_prune_refuses_bad_requests_naming_the_option(tmp_path):
    for args, message in [
            (["--fraction", 0.5], "--out: the path of the smaller model is required"),
            (["--curve", "--fractions", "0.5,0.2"], "fractions: 0.2 must rise strictly"),
            (["--curve", "--methods", "best"], "by: expected importance, ablation or random"),
            (["--curve", "--corpus", tmp_path / "absent.txt"], "absent.txt")]:
        r = run("prune", MINILM_DIR, "--sequences", 1, *args, check=False)
        assert r.returncode != 0 and message in r.stderr, (args, r.stderr)
    one = tmp_path / "one.txt"
    one.write_text("just one line\n")
    r = run("prune", MINILM_DIR, "--curve", "--corpus", one, check=False)
    assert r.returncode != 0 and "needs at least two non-empty lines" in r.stderr


def test_demo_and_a_pruned_checkpoint_refuse_bad_input_naming_it(tmp_path):
    for args, message in [
            (["demo", "--real-model", tmp_path / "absent.gguf"], "--real-model:"),
            (["demo", "--real-model", MINILM_DIR, "--real-corpus", tmp_path / "absent.txt"],
             "--real-corpus:")]:
        r = run(*args, "--report", tmp_path / "r.html", check=False)
        assert r.returncode != 0 and message in r.stderr and "absent" in r.stderr, r.stderr
        assert not (tmp_path / "r.html").exists()
    # A checkpoint whose headlight.source metadata is not what write_model writes.
    out = tmp_path / "m.safetensors"
    prune(MINILM_DIR, out, "--fraction", 0.1, "--by", "random", "--sequences", 1)
    raw = out.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header["__metadata__"]["headlight.source"] = json.dumps({"architecture": "BertModel"})
    text = json.dumps(header).encode()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])
    r = run("info", bad, check=False)
    assert r.returncode != 0 and "bad.safetensors: headlight.source" in r.stderr, r.stderr

"""headlight.load on Hugging Face folders and GGUF files of small random models that transformers
writes here (odd sizes, grouped-query attention, tied and untied heads), against transformers
itself: outputs, per-head attention, gradients and greedy generation; and the errors bad folders
get."""

import json
import shutil

import gguf
import numpy as np
import pytest
import torch
from transformers import (BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM)

import headlight
from conftest import rel_err

V = 101

CONFIGS = {
    "bert": lambda: BertModel(BertConfig(
        vocab_size=V, hidden_size=36, num_hidden_layers=2, num_attention_heads=3,
        intermediate_size=50, max_position_embeddings=40, type_vocab_size=2,
        hidden_act="gelu", layer_norm_eps=1e-12), add_pooling_layer=True),
    "bert-relu": lambda: BertModel(BertConfig(
        vocab_size=V, hidden_size=20, num_hidden_layers=1, num_attention_heads=5,
        intermediate_size=30, max_position_embeddings=32, type_vocab_size=3,
        hidden_act="relu"), add_pooling_layer=False),
    "gpt2": lambda: GPT2LMHeadModel(GPT2Config(
        vocab_size=V, n_embd=40, n_layer=2, n_head=5, n_positions=48, n_inner=70,
        bos_token_id=0, eos_token_id=1)),
    "gpt2-untied": lambda: GPT2LMHeadModel(GPT2Config(
        vocab_size=V, n_embd=24, n_layer=2, n_head=2, n_positions=48, tie_word_embeddings=False,
        activation_function="gelu", bos_token_id=0, eos_token_id=1)),
    "llama-gqa": lambda: LlamaForCausalLM(LlamaConfig(
        vocab_size=V, hidden_size=48, intermediate_size=70, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64,
        rope_theta=5000.0, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1)),
    "llama-tied": lambda: LlamaForCausalLM(LlamaConfig(
        vocab_size=V, hidden_size=36, intermediate_size=50, num_hidden_layers=3,
        num_attention_heads=3, num_key_value_heads=1, max_position_embeddings=64,
        rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=0,
        eos_token_id=1)),
}


def randomise(model, seed):
    """Weights far from their initial values (norms and biases included), so that every tensor
    matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.ndim > 1 else 0.5)
                    + (1.0 if p.ndim == 1 else 0.0) * 0.5)
    return model.eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    out = {}
    for i, (name, make) in enumerate(CONFIGS.items()):
        torch.manual_seed(i)
        model = randomise(make(), i)
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        out[name] = (path, model)
    return out


def ids_for(name, rng, batch=2, seq=13, low=0):
    ids = rng.integers(low, V, size=(batch, seq)).astype(np.int32)
    types = rng.integers(0, 2, size=ids.shape).astype(np.int32) if name.startswith("bert") else None
    return ids, types


def reference(model, ids, types, **kw):
    args = dict(input_ids=torch.tensor(ids, dtype=torch.long))
    if types is not None:
        args["token_type_ids"] = torch.tensor(types, dtype=torch.long)
    return model(**args, **kw)


def output_of(name, out):
    return out.last_hidden_state if name.startswith("bert") else out.logits


@pytest.mark.parametrize("name", list(CONFIGS))
def test_outputs_and_attention_equal_transformers(folders, name, rng):
    path, model = folders[name]
    m = headlight.load(str(path), threads=2)
    ids, types = ids_for(name, rng)
    got = m.forward(ids, token_types=types)
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        ref = reference(model, ids, types, output_attentions=True)
    want = output_of(name, ref).numpy()
    assert got.shape == want.shape
    assert rel_err(got, want) < 2e-5, name
    att = m.attention(ids[:1]) if types is None else None
    if att is not None:
        for layer, a in enumerate(ref.attentions):
            assert np.abs(att[layer] - a[0].numpy()).max() < 1e-5, (name, layer)


def test_bert_attention_per_head_with_token_types(folders, rng):
    path, model = folders["bert"]
    m = headlight.load(str(path))
    ids, _ = ids_for("bert", rng, batch=1)
    att = m.attention(ids)
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids, dtype=torch.long), output_attentions=True)
    assert att.shape == (2, 3, 13, 13)
    for layer, a in enumerate(ref.attentions):
        assert np.abs(att[layer] - a[0].numpy()).max() < 1e-5


# Gradient names: headlight's ← the transformers parameter(s) (stacked along rows; ".T" for GPT-2's
# Conv1D weights).
GRADS = {
    "bert": {"transformer.wte.weight": ["embeddings.word_embeddings.weight"],
             "transformer.wtt.weight": ["embeddings.token_type_embeddings.weight"],
             "transformer.ln_e.weight": ["embeddings.LayerNorm.weight"],
             "transformer.h.0.attn.c_attn.weight": [
                 "encoder.layer.0.attention.self.query.weight",
                 "encoder.layer.0.attention.self.key.weight",
                 "encoder.layer.0.attention.self.value.weight"],
             "transformer.h.1.mlp.c_fc.weight": ["encoder.layer.1.intermediate.dense.weight"],
             "transformer.h.1.ln_2.bias": ["encoder.layer.1.output.LayerNorm.bias"]},
    "gpt2-untied": {"transformer.wte.weight": ["transformer.wte.weight"],
                    "transformer.wpe.weight": ["transformer.wpe.weight"],
                    "transformer.h.0.attn.c_attn.weight": ["transformer.h.0.attn.c_attn.weight.T"],
                    "transformer.h.1.mlp.c_proj.weight": ["transformer.h.1.mlp.c_proj.weight.T"],
                    "transformer.ln_f.weight": ["transformer.ln_f.weight"],
                    "lm_head.weight": ["lm_head.weight"]},
    "llama-gqa": {"transformer.wte.weight": ["model.embed_tokens.weight"],
                  "transformer.h.0.attn.c_attn.weight": [
                      "model.layers.0.self_attn.q_proj.weight",
                      "model.layers.0.self_attn.k_proj.weight",
                      "model.layers.0.self_attn.v_proj.weight"],
                  "transformer.h.1.mlp.c_fc.weight": ["model.layers.1.mlp.gate_proj.weight",
                                                      "model.layers.1.mlp.up_proj.weight"],
                  "transformer.h.1.mlp.c_proj.weight": ["model.layers.1.mlp.down_proj.weight"],
                  "transformer.h.0.ln_1.weight": ["model.layers.0.input_layernorm.weight"],
                  "transformer.ln_f.weight": ["model.norm.weight"],
                  "lm_head.weight": ["lm_head.weight"]},
    "llama-tied": {"transformer.wte.weight": ["model.embed_tokens.weight"],
                   "transformer.h.2.attn.c_proj.weight": ["model.layers.2.self_attn.o_proj.weight"]},
}


@pytest.mark.parametrize("name", list(GRADS))
def test_gradients_equal_transformers_autograd(folders, name, rng):
    path, model = folders[name]
    m = headlight.load(str(path), threads=2)
    # Ids from 1: BERT's pad token (0) is an nn.Embedding padding_idx, whose row PyTorch leaves
    # without a gradient; headlight gives every row its gradient.
    ids, types = ids_for(name, rng, low=1)
    dout = rng.standard_normal(m.forward(ids, token_types=types).shape).astype(np.float32)
    grads = m.backward(ids, dout, token_types=types)
    ref = model.double()
    try:
        ref.zero_grad()
        out = output_of(name, reference(ref, ids, types))
        (out * torch.from_numpy(dout.astype(np.float64))).sum().backward()
        params = dict(ref.named_parameters())
        for ours, theirs in GRADS[name].items():
            parts = [params[t[:-2]].grad.T if t.endswith(".T") else params[t].grad for t in theirs]
            assert rel_err(grads[ours], torch.cat(parts, dim=0).numpy()) < 1e-4, (name, ours)
    finally:
        model.float()


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa", "llama-tied"])
def test_greedy_generation_equals_transformers(folders, name, rng):
    path, model = folders[name]
    m = headlight.load(str(path))
    prompt = rng.integers(2, V, size=7).astype(np.int32)
    got = m.generate(prompt, 12, temperature=0, stop_at_eos=False)
    with torch.no_grad():
        want = model.generate(torch.tensor(prompt[None], dtype=torch.long), max_new_tokens=12,
                              do_sample=False, eos_token_id=None, pad_token_id=0,
                              min_new_tokens=12)[0, len(prompt):].tolist()
    assert got == want


# --- GGUF files written here the way llama.cpp's converter writes them ---------------------------

def permute(w, heads):
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (rotary halves → interleaved)."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_llama_gguf(path, model):
    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(f"blk.{i}.attn_q.weight",
                     permute(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads))
        w.add_tensor(f"blk.{i}.attn_k.weight",
                     permute(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads))
        w.add_tensor(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        w.add_tensor(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        w.add_tensor(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    if not c.tie_word_embeddings:
        w.add_tensor("output.weight", sd["lm_head.weight"])
    finish(w)


def write_gpt2_gguf(path, model):
    c = model.config
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_block_count(c.n_layer)
    w.add_context_length(c.n_positions)
    w.add_embedding_length(c.n_embd)
    w.add_feed_forward_length(c.n_inner or 4 * c.n_embd)
    w.add_head_count(c.n_head)
    w.add_layer_norm_eps(c.layer_norm_epsilon)
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["transformer.wte.weight"])
    w.add_tensor("position_embd.weight", sd["transformer.wpe.weight"])
    names = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
             "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    for i in range(c.n_layer):
        for hf, ll in names.items():
            wt = sd[f"transformer.h.{i}.{hf}.weight"]
            w.add_tensor(f"blk.{i}.{ll}.weight", wt.T.copy() if wt.ndim == 2 else wt)
            w.add_tensor(f"blk.{i}.{ll}.bias", sd[f"transformer.h.{i}.{hf}.bias"])
    w.add_tensor("output_norm.weight", sd["transformer.ln_f.weight"])
    w.add_tensor("output_norm.bias", sd["transformer.ln_f.bias"])
    finish(w)


@pytest.mark.parametrize("name", ["llama-gqa", "llama-tied", "gpt2"])
def test_gguf_files_equal_their_hugging_face_folder(folders, name, rng, tmp_path):
    path, model = folders[name]
    file = tmp_path / f"{name}.gguf"
    (write_gpt2_gguf if name == "gpt2" else write_llama_gguf)(file, model)
    ids, _ = ids_for(name, rng)
    gguf_model, folder_model = headlight.load(str(file)), headlight.load(str(path))
    assert np.array_equal(gguf_model.forward(ids), folder_model.forward(ids))
    # float32 tensors in both files, every parameter counted once
    total = sum(v.size for v in folder_model.state_dict().values())
    assert gguf_model.stored_dtypes == folder_model.stored_dtypes == {"F32": total}


# --- errors -------------------------------------------------------------------------------------

def copy_folder(folders, name, tmp_path):
    dst = tmp_path / name
    shutil.copytree(folders[name][0], dst)
    return dst


def edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (folder / "config.json").write_text(json.dumps(cfg))


def test_an_unsupported_architecture_is_named_with_the_supported_list(folders, tmp_path):
    f = copy_folder(folders, "gpt2", tmp_path)
    edit_config(f, architectures=["T5ForConditionalGeneration"])
    with pytest.raises(ValueError, match=r"T5ForConditionalGeneration.*BertModel, GPT2LMHeadModel"):
        headlight.load(str(f))


def test_missing_and_contradictory_config_fields_name_the_file_and_field(folders, tmp_path):
    f = copy_folder(folders, "llama-gqa", tmp_path)
    edit_config(f, hidden_size=None)
    with pytest.raises(ValueError, match=r"config\.json: missing \"hidden_size\""):
        headlight.load(str(f))
    edit_config(f, hidden_size=48, num_key_value_heads=4)
    with pytest.raises(ValueError, match=r"num_key_value_heads 4 does not divide"):
        headlight.load(str(f))
    edit_config(f, num_key_value_heads=2, intermediate_size=71)
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor \"model\.layers\.0\.mlp"
                                         r"\.\w+_proj\.weight\" has shape"):
        headlight.load(str(f))


def test_missing_weights_are_named(folders, tmp_path):
    f = copy_folder(folders, "gpt2", tmp_path)
    from safetensors.numpy import load_file, save_file
    sd = load_file(f / "model.safetensors")
    del sd["transformer.h.1.mlp.c_fc.bias"]
    save_file(sd, f / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing tensor \"transformer\.h\.1\.mlp\.c_fc\.bias\""):
        headlight.load(str(f))
    (f / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"no model\.safetensors"):
        headlight.load(str(f))


def test_gguf_of_an_unsupported_architecture_is_named(tmp_path):
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    finish(w)
    with pytest.raises(ValueError, match=r"m\.gguf: general\.architecture \"mamba\" is not "
                                         r"supported \(supported: llama, gpt2\)"):
        headlight.load(str(path))


def test_a_path_that_is_not_a_model(tmp_path):
    with pytest.raises(ValueError, match="no such file or folder"):
        headlight.load(str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="no config.json"):
        headlight.load(str(tmp_path))


def test_a_sharded_folder_loads_as_the_single_file(folders, rng, tmp_path):
    path, model = folders["llama-gqa"]
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert not (tmp_path / "model.safetensors").exists()
    ids, _ = ids_for("llama-gqa", rng)
    sharded, single = headlight.load(str(tmp_path)), headlight.load(str(path))
    assert np.array_equal(sharded.forward(ids), single.forward(ids))
    assert sharded.stored_dtypes == single.stored_dtypes


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama-gqa"])
def test_a_bfloat16_folder_loads_its_exact_weights(folders, name, rng, tmp_path):
    """Most published checkpoints are stored in bfloat16: their weights are read exactly (widened
    to float32), so the outputs are transformers' on those same weights in float32; and the model
    then runs with bf16 products too."""
    import copy
    _, model = folders[name]
    b16 = copy.deepcopy(model).to(torch.bfloat16)
    b16.save_pretrained(tmp_path)
    m = headlight.load(str(tmp_path), threads=2)
    ids, types = ids_for(name, rng)
    # transformers reading the folder in float32 (b16.float() would keep Llama's rotary
    # frequencies rounded to bf16, a buffer the folder does not hold)
    want_model = type(model).from_pretrained(tmp_path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        want = output_of(name, reference(want_model, ids, types)).numpy()
        f32 = output_of(name, reference(model, ids, types)).numpy()
    got = m.forward(ids, token_types=types)
    assert rel_err(got, want) < 2e-5, name
    assert m.stored_dtypes == {"BF16": sum(v.size for v in m.state_dict().values())}
    assert rel_err(got, f32) > 1e-4, name  # the rounded weights, not the float32 ones
    m.dtype = "bfloat16"
    assert rel_err(m.forward(ids, token_types=types), want) < 0.05, name


@pytest.mark.parametrize("name", ["bert", "gpt2-untied", "llama-gqa"])
def test_packed_sequences_equal_separate_runs(folders, name, rng):
    """Sequences of different lengths packed end to end (no padding): each row's output, and the
    gradients, as when every sequence runs alone."""
    path, _ = folders[name]
    m = headlight.load(str(path), threads=2)
    lengths = [5, 1, 12, 7]
    seqs = [rng.integers(1, V, size=n).astype(np.int32) for n in lengths]
    packed = np.concatenate(seqs)[None]
    out = m.forward(packed, lengths=lengths)
    douts = [rng.standard_normal((1, n, out.shape[-1])).astype(np.float32) for n in lengths]
    grads = m.backward(packed, np.concatenate(douts, axis=1), lengths=lengths)
    row, want_grads = 0, None
    for seq, dout in zip(seqs, douts):
        alone = m.forward(seq[None])
        # (oneDNN blocks a 25-row product and a 7-row one differently: fp32 rounding apart)
        assert np.abs(out[:, row:row + len(seq)] - alone).max() < 1e-5 * max(1, np.abs(alone).max())
        g = m.backward(seq[None], dout)
        want_grads = g if want_grads is None else {k: want_grads[k] + g[k] for k in g}
        row += len(seq)
    for k in grads:
        assert rel_err(grads[k], want_grads[k]) < 1e-5, k
    with pytest.raises(ValueError, match="lengths: they add up to 25, the tokens are 26"):
        m.forward(np.concatenate([packed, packed[:, :1]], axis=1), lengths=lengths)



def test_bad_inputs_of_a_loaded_model_name_the_argument(folders, rng, tmp_path):
    import subprocess
    from pathlib import Path
    m = headlight.load(str(folders["bert"][0]))
    ids, types = ids_for("bert", rng)
    with pytest.raises(ValueError, match=r"token_types: shape \[2, 12\] differs from tokens"):
        m.forward(ids, token_types=types[:, :12])
    with pytest.raises(ValueError, match=r"token_types: type 5 at index 0 is outside"):
        m.forward(ids, token_types=np.full_like(types, 5))
    with pytest.raises(ValueError, match=r"doutput: expected shape \[2, 13, 36\]"):
        m.backward(ids, np.zeros((2, 13, 35), dtype=np.float32))
    cli = Path(__file__).resolve().parents[2] / "build" / "release" / "apps" / "cli" / "headlight"
    r = subprocess.run([str(cli), "generate", str(folders["gpt2"][0]), "--system", "be brief"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "--system: needs --chat" in r.stderr

"""headlight as a transformers attention implementation (headlight.torch.register): BERT, GPT-2 and
Llama (grouped-query) models loaded with attn_implementation="headlight" give the logits and the
gradients of "sdpa" and "eager", generate the same tokens with the KV cache, fine-tune, and
capture the attention that output_attentions returns with "eager"."""

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM

import headlight
import headlight.torch as ht
from conftest import grad_floor, rel_err
from test_models_hf import CONFIGS, randomise

NAMES = ["bert", "gpt2", "llama-gqa"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    ht.register()
    out = {}
    for i, name in enumerate(NAMES):
        torch.manual_seed(i)
        path = tmp_path_factory.mktemp(name)
        randomise(CONFIGS[name](), 100 + i).save_pretrained(path)
        out[name] = path
    return out


def load(folders, name, impl):
    auto = AutoModel if name == "bert" else AutoModelForCausalLM
    return auto.from_pretrained(folders[name], attn_implementation=impl).eval()


def batch(name, seed):
    """Two sequences of 13 tokens, the second padded after 9 (right padding)."""
    rng = np.random.default_rng(seed)
    ids = torch.from_numpy(rng.integers(2, 101, size=(2, 13)))
    mask = torch.ones(2, 13, dtype=torch.long)
    mask[1, 9:] = 0
    kw = {"input_ids": ids, "attention_mask": mask}
    if name == "bert":
        kw["token_type_ids"] = torch.from_numpy(rng.integers(0, 2, size=(2, 13)))
    return kw


def output_of(out):
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("name", NAMES)
def test_outputs_and_gradients_equal_sdpa_and_eager(folders, name):
    kw = batch(name, 1)
    keep = kw["attention_mask"].bool()[..., None]  # padded rows are not compared
    results = {}
    for impl in ("headlight", "sdpa", "eager"):
        model = load(folders, name, impl)
        assert model.config._attn_implementation == impl
        out = output_of(model(**kw))
        (out * keep).square().mean().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[impl] = (out.detach(), grads)
    ours, our_grads = results["headlight"]
    for impl in ("sdpa", "eager"):
        want, want_grads = results[impl]
        scale = want.abs().max().item()
        assert ((ours - want) * keep).abs().max().item() <= 1e-5 * scale, impl
        assert our_grads.keys() == want_grads.keys()
        # A gradient that is zero in exact arithmetic (the key bias's) is compared against a
        # floor of a tenth of the largest gradient.
        floor = grad_floor(*(g.numpy() for g in want_grads.values()))
        for n, g in our_grads.items():
            assert rel_err(g.numpy(), want_grads[n].numpy(), floor) <= 1e-4, (impl, n)


@pytest.mark.parametrize("name", NAMES)
def test_capture_equals_eager_output_attentions(folders, name):
    kw = batch(name, 2)
    eager = load(folders, name, "eager")
    want = eager(**kw, output_attentions=True).attentions
    model = load(folders, name, "headlight")
    with ht.capture(model) as heads:
        out = model(**kw)
    got = heads.attentions()
    assert len(got) == len(want) == model.config.num_hidden_layers
    live = kw["attention_mask"].bool()  # padded query rows differ (eager: uniform; ours: zeros)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert (g - w)[live[:, None, :, None].expand_as(g)].abs().max().item() <= 1e-5
    # Capture does not change the output, and ends with the block.
    assert torch.allclose(output_of(out), output_of(model(**kw)), atol=0, rtol=0)
    layer = heads.layers[0]
    stats = heads.statistics(layer)
    p = heads[layer]
    assert torch.equal(stats["argmax"], p.argmax(-1))
    assert torch.allclose(stats["max_weight"], p.max(-1).values)
    with ht.capture(model) as again:
        pass
    assert again.calls == [] and not hasattr(model, "_headlight_capture")


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa"])
def test_greedy_generation_with_the_kv_cache_equals_sdpa(folders, name):
    ids = torch.from_numpy(np.random.default_rng(3).integers(2, 101, size=(1, 7)))
    outs = [load(folders, name, impl).generate(ids, max_new_tokens=12, do_sample=False,
                                                 pad_token_id=0)
            for impl in ("headlight", "sdpa")]
    assert torch.equal(outs[0], outs[1])


def test_fine_tuning_follows_sdpa_step_for_step(folders):
    # A few AdamW steps of GPT-2 on headlight and on SDPA, dropout off: the same losses.
    kw = batch("gpt2", 4)
    losses = {}
    for impl in ("headlight", "sdpa"):
        torch.manual_seed(0)
        model = load(folders, "gpt2", impl)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses[impl] = []
        for _ in range(5):
            opt.zero_grad()
            loss = model(**kw, labels=kw["input_ids"]).loss
            loss.backward()
            opt.step()
            losses[impl].append(loss.item())
    assert losses["headlight"][-1] < losses["headlight"][0]
    np.testing.assert_allclose(losses["headlight"], losses["sdpa"], rtol=1e-5)


def test_role_scores_and_the_report_of_a_model_that_exists_only_in_pytorch(folders, tmp_path):
    # GPT-2 (transformers) on n random tokens repeated twice: the role scores of the captured
    # attention equal the formulas of docs/heads.md applied to eager's output_attentions.
    n = 12
    rng = np.random.default_rng(7)
    half = rng.integers(2, 101, size=n)
    ids = torch.from_numpy(np.concatenate([half, half]))[None]
    model = load(folders, "gpt2", "headlight")
    with ht.capture(model) as heads:
        model(ids)
    rows = heads.roles(repeated=n)
    want = np.stack([a[0].detach().numpy() for a in
                     load(folders, "gpt2", "eager")(ids, output_attentions=True).attentions])
    L, H, T, _ = want.shape
    assert len(rows) == L * H
    for r in rows:
        p = want[r["layer"], r["head"]]
        s = r["scores"]
        i = np.arange(1, T)
        assert abs(s["previous_token"] - p[i, i - 1].mean()) < 1e-5
        assert abs(s["first_token"] - p[i, 0].mean()) < 1e-5
        assert abs(s["self"] - np.trace(p) / T) < 1e-5
        k = np.arange(n - 1)
        assert abs(s["induction"] - p[n + k, k + 1].mean()) < 1e-5
        assert s["coreference"] is None and r["importance"] is None
        assert r["role"] in ("previous_token", "first_token", "induction", "local", "self", "mixed")
    # One text: the scores it cannot give are None.
    assert heads.roles()[0]["scores"]["induction"] is None
    # The report `headlight explain` writes, from the capture alone.
    path = tmp_path / "report.html"
    heads.report(str(path), token_text=[f" t{int(t)}" for t in ids[0]], repeated=n,
                 model_summary="GPT-2 (transformers, random weights) on headlight")
    html = path.read_text()
    assert html.startswith("<!DOCTYPE html>") and "GPT-2 (transformers" in html
    assert '"n_layer":2' in html and '"role":"' in html
    with pytest.raises(ValueError, match="token_text: 3 texts for 24 tokens"):
        heads.report(str(tmp_path / "bad.html"), token_text=["a", "b", "c"])
    assert not (tmp_path / "bad.html").exists()
    with pytest.raises(ValueError, match=r"probs: expected \[n_layer, n_head, T, T\], got 3 dims"):
        headlight.head_roles(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(ValueError, match="repeated: 5 tokens repeated twice make 10"):
        heads.roles(repeated=5)


def test_a_compiled_model_and_a_bf16_model(folders):
    # torch.compile(fullgraph=True) traces the whole model with headlight's operator in it, and
    # computes what eager does; a bf16 model's logits stay within bf16 rounding of "sdpa"'s.
    kw = batch("llama-gqa", 5)
    model = load(folders, "llama-gqa", "headlight")
    want = model(**kw).logits
    torch._dynamo.reset()
    got = torch.compile(model, fullgraph=True, backend="aot_eager")(**kw).logits
    torch._dynamo.reset()
    keep = kw["attention_mask"].bool()[..., None]
    assert ((got - want) * keep).abs().max().item() <= 1e-5 * want.abs().max().item()
    ours = load(folders, "gpt2", "headlight").bfloat16()
    theirs = load(folders, "gpt2", "sdpa").bfloat16()
    kw = batch("gpt2", 6)
    logits16 = ours(**kw).logits
    assert logits16.dtype == torch.bfloat16
    a, b = logits16.float(), theirs(**kw).logits.float()
    exact = load(folders, "gpt2", "sdpa")(**kw).logits
    keep = kw["attention_mask"].bool()[..., None]
    err_ours = ((a - exact) * keep).abs().max().item()
    err_theirs = ((b - exact) * keep).abs().max().item()
    assert err_ours <= 2 * max(err_theirs, 0.02)
    # A float32 model under autocast: its projections and attention in bf16 (transformers' padding
    # mask cast with them), as "sdpa" runs under autocast.
    fp32 = {impl: load(folders, "gpt2", impl) for impl in ("headlight", "sdpa")}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = (fp32[impl](**kw).logits for impl in ("headlight", "sdpa"))
    assert a.dtype == b.dtype == torch.bfloat16
    err_ours = ((a.float() - exact) * keep).abs().max().item()
    err_theirs = ((b.float() - exact) * keep).abs().max().item()
    assert err_ours <= 2 * max(err_theirs, 0.02)


def test_a_sliding_window_model_follows_its_mask():
    # Mistral with a window shorter than the sequence: transformers builds the window into the
    # mask it gives every implementation; headlight's logits equal "sdpa"'s and "eager"'s.
    from transformers import MistralConfig, MistralForCausalLM

    ht.register()
    torch.manual_seed(3)
    config = MistralConfig(vocab_size=101, hidden_size=32, intermediate_size=48,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=64, sliding_window=5, bos_token_id=0,
                           eos_token_id=1)
    base = randomise(MistralForCausalLM(config), 9)
    ids = torch.from_numpy(np.random.default_rng(8).integers(2, 101, size=(1, 16)))
    outs = {}
    for impl in ("headlight", "sdpa", "eager"):
        base.set_attn_implementation(impl)
        with torch.no_grad():
            outs[impl] = base(ids).logits
    full = MistralForCausalLM(MistralConfig(**{**config.to_dict(), "sliding_window": None}))
    full.load_state_dict(base.state_dict())
    with torch.no_grad():
        unwindowed = full.eval()(ids).logits
    scale = outs["sdpa"].abs().max().item()
    assert (outs["headlight"] - outs["sdpa"]).abs().max().item() <= 1e-5 * scale
    assert (outs["headlight"] - outs["eager"]).abs().max().item() <= 1e-5 * scale
    assert (outs["headlight"] - unwindowed).abs().max().item() > 1e-3 * scale  # the window acts

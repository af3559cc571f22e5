"""headlight.MultiheadAttention against torch.nn.MultiheadAttention (float64, same state dict):
outputs, attention weights, input gradients and every parameter gradient, over random
configurations of every option; and the grouped-query extension against a torch formula."""

import math

import numpy as np
import pytest
import torch

import headlight
from conftest import as_t, grad_floor, max_abs, rel_err


def draw_config(rng):
    E = int(rng.choice([4, 6, 8, 12, 16]))
    H = int(rng.choice([h for h in (1, 2, 3, 4) if E % h == 0]))
    separate = rng.random() < 0.3
    return dict(
        E=E, H=H, bias=bool(rng.random() < 0.7), add_bias_kv=bool(rng.random() < 0.3),
        add_zero_attn=bool(rng.random() < 0.3),
        kdim=int(rng.choice([3, 5, E])) if separate else None,
        vdim=int(rng.choice([2, 7, E])) if separate else None,
        batch_first=bool(rng.random() < 0.5), unbatched=bool(rng.random() < 0.15),
        N=int(rng.integers(1, 4)), L=int(rng.choice([1, 3, 6])), S=int(rng.choice([1, 4, 7])),
        self_attention=bool(rng.random() < 0.25),
    )


def draw_masks(rng, c):
    """key_padding_mask and attn_mask in PyTorch's MHA convention (bool True = masked). Key 0 is
    never masked, so no row is fully masked here (that case has its own test)."""
    N, H, L, S = c["N"], c["H"], c["L"], c["S"]
    kpm = None
    kind = rng.choice(["none", "bool", "float"])
    kshape = (S,) if c["unbatched"] else (N, S)
    if kind == "bool":
        kpm = rng.random(kshape) < 0.3
        kpm[..., 0] = False
    elif kind == "float":
        kpm = rng.standard_normal(kshape).astype(np.float32)
        kpm[rng.random(kshape) < 0.2] = -np.inf
        kpm[..., 0] = 0.0
    am, is_causal = None, False
    kind = rng.choice(["none", "bool2", "float2", "bool3", "float3", "causal"])
    lead = () if kind.endswith("2") or kind == "causal" else ((H,) if c["unbatched"] else (N * H,))
    shape = lead + (L, S)
    if kind.startswith("bool"):
        am = rng.random(shape) < 0.3
        am[..., 0] = False
    elif kind.startswith("float"):
        am = rng.standard_normal(shape).astype(np.float32)
        am[rng.random(shape) < 0.2] = -np.inf
        am[..., 0] = 0.0
    elif kind == "causal":
        am = ~np.tril(np.ones((L, S), dtype=bool))  # True above the diagonal: masked
        is_causal = True
    return kpm, am, is_causal


def inputs(rng, c):
    E, N, L, S = c["E"], c["N"], c["L"], c["S"]
    kdim, vdim = c["kdim"] or E, c["vdim"] or E

    def shaped(length, dim):
        if c["unbatched"]:
            return rng.standard_normal((length, dim)).astype(np.float32)
        if c["batch_first"]:
            return rng.standard_normal((N, length, dim)).astype(np.float32)
        return rng.standard_normal((length, N, dim)).astype(np.float32)

    q = shaped(L, E)
    if c["self_attention"] and kdim == E and vdim == E:
        c["S"] = L
        return q, q, q
    return q, shaped(S, kdim), shaped(S, vdim)


def torch_mask(m):
    if m is None:
        return None
    return torch.from_numpy(m) if m.dtype == bool else torch.from_numpy(m.astype(np.float64))


@pytest.mark.parametrize("kernel", ["fused", "reference"])
@pytest.mark.parametrize("case", range(110))
def test_matches_torch_multihead_attention(case, kernel):
    rng = np.random.default_rng(5000 + case)
    c = draw_config(rng)
    q, k, v = inputs(rng, c)
    kpm, am, is_causal = draw_masks(rng, c)
    need_weights = bool(rng.random() < 0.7)
    average = bool(rng.random() < 0.5)

    ours = headlight.MultiheadAttention(
        c["E"], c["H"], bias=c["bias"], add_bias_kv=c["add_bias_kv"], add_zero_attn=c["add_zero_attn"],
        kdim=c["kdim"], vdim=c["vdim"], batch_first=c["batch_first"], seed=case, kernel=kernel)
    theirs = torch.nn.MultiheadAttention(
        c["E"], c["H"], bias=c["bias"], add_bias_kv=c["add_bias_kv"], add_zero_attn=c["add_zero_attn"],
        kdim=c["kdim"], vdim=c["vdim"], batch_first=c["batch_first"], dtype=torch.float64)
    state = ours.state_dict()
    assert set(state) == set(dict(theirs.named_parameters()))
    theirs.load_state_dict({name: torch.from_numpy(a.astype(np.float64)) for name, a in state.items()})

    out, weights = ours(q, k, v, key_padding_mask=kpm, need_weights=need_weights, attn_mask=am,
                        average_attn_weights=average, is_causal=is_causal)
    tq, tk, tv = as_t(q, True), as_t(k, True), as_t(v, True)
    tout, tweights = theirs(tq, tk, tv, key_padding_mask=torch_mask(kpm), need_weights=need_weights,
                            attn_mask=torch_mask(am), average_attn_weights=average, is_causal=is_causal)
    assert out.shape == tuple(tout.shape)
    assert max_abs(out, tout.detach().numpy()) <= 1e-5
    if need_weights:
        assert weights.shape == tuple(tweights.shape)
        assert max_abs(weights, tweights.detach().numpy()) <= 1e-5
    else:
        assert weights is None and tweights is None

    go = rng.standard_normal(out.shape).astype(np.float32)
    dq, dk, dv = ours.backward(go)
    tout.backward(as_t(go))
    refs = [tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()]
    refs += [p.grad.numpy() for _, p in theirs.named_parameters()]
    floor = grad_floor(*refs)
    for name, got, want in (("query", dq, tq.grad), ("key", dk, tk.grad), ("value", dv, tv.grad)):
        assert rel_err(got, want.numpy(), floor) <= 1e-4, name
    grads = ours.grads
    for name, p in theirs.named_parameters():
        assert rel_err(grads[name], p.grad.numpy(), floor) <= 1e-4, name


def gqa_oracle(state, gates, q, k, v, H, Hkv, kpm, am, batch_first):
    """Grouped-query multi-head attention in torch: the same math as nn.MultiheadAttention with key
    and value heads shared by groups of query heads, and per-head gates."""
    if not batch_first:
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    N, L, E = q.shape
    S = k.shape[1]
    d = E // H
    W = torch.from_numpy(state["in_proj_weight"].astype(np.float64))
    b = torch.from_numpy(state["in_proj_bias"].astype(np.float64))
    Ekv = Hkv * d
    qp = (q @ W[:E].T + b[:E]).reshape(N, L, H, d).transpose(1, 2)
    kp = (k @ W[E:E + Ekv].T + b[E:E + Ekv]).reshape(N, S, Hkv, d).transpose(1, 2)
    vp = (v @ W[E + Ekv:].T + b[E + Ekv:]).reshape(N, S, Hkv, d).transpose(1, 2)
    kp = kp.repeat_interleave(H // Hkv, dim=1)
    vp = vp.repeat_interleave(H // Hkv, dim=1)
    scores = qp @ kp.transpose(-1, -2) / math.sqrt(d)
    if am is not None:
        m = torch.from_numpy(np.where(am, -np.inf, 0.0) if am.dtype == bool else am.astype(np.float64))
        scores = scores + (m.reshape(N, H, L, S) if m.dim() == 3 else m)
    if kpm is not None:
        m = torch.from_numpy(np.where(kpm, -np.inf, 0.0) if kpm.dtype == bool else kpm.astype(np.float64))
        scores = scores + m[:, None, None, :]
    p = torch.softmax(scores, dim=-1)
    heads = (p @ vp) * gates[None, :, None, None]
    o = heads.transpose(1, 2).reshape(N, L, E)
    Wo = torch.from_numpy(state["out_proj.weight"].astype(np.float64))
    bo = torch.from_numpy(state["out_proj.bias"].astype(np.float64))
    out = o @ Wo.T + bo
    return (out if batch_first else out.transpose(0, 1)), p


@pytest.mark.parametrize("case", range(30))
def test_grouped_query_extension_matches_torch_formula(case):
    rng = np.random.default_rng(9000 + case)
    H = int(rng.choice([2, 4, 6]))
    Hkv = int(rng.choice([g for g in (1, 2, 3) if H % g == 0 and g < H] or [1]))
    d = int(rng.choice([2, 4]))
    E = H * d
    c = dict(E=E, H=H, N=int(rng.integers(1, 3)), L=int(rng.choice([1, 4])), S=int(rng.choice([2, 5])),
             batch_first=bool(rng.random() < 0.5), unbatched=False, kdim=None, vdim=None,
             self_attention=False)
    q, k, v = inputs(rng, c)
    kpm, am, is_causal = draw_masks(rng, c)
    ours = headlight.MultiheadAttention(E, H, batch_first=c["batch_first"], num_kv_heads=Hkv, seed=case)
    assert ours.state_dict()["in_proj_weight"].shape == (E + 2 * Hkv * d, E)
    gates = rng.uniform(0.2, 1.5, size=H).astype(np.float32)
    ours.head_gates = gates
    out, weights = ours(q, k, v, key_padding_mask=kpm, attn_mask=am, is_causal=is_causal,
                        average_attn_weights=False)
    tq, tk, tv = as_t(q, True), as_t(k, True), as_t(v, True)
    tgates = as_t(gates, True)
    tout, tp = gqa_oracle(ours.state_dict(), tgates, tq, tk, tv, H, Hkv, kpm, am, c["batch_first"])
    assert max_abs(out, tout.detach().numpy()) <= 1e-5
    assert max_abs(weights, tp.detach().numpy()) <= 1e-5
    go = rng.standard_normal(out.shape).astype(np.float32)
    dq, dk, dv = ours.backward(go)
    tout.backward(as_t(go))
    floor = grad_floor(tq.grad, tk.grad, tv.grad, tgates.grad)
    assert rel_err(dq, tq.grad.numpy(), floor) <= 1e-4
    assert rel_err(dk, tk.grad.numpy(), floor) <= 1e-4
    assert rel_err(dv, tv.grad.numpy(), floor) <= 1e-4
    assert rel_err(ours.head_gates_grad, tgates.grad.numpy(), floor) <= 1e-4


def test_fully_masked_rows_give_zero_attention():
    rng = np.random.default_rng(3)
    E, H, N, L, S = 8, 2, 3, 4, 5
    ours = headlight.MultiheadAttention(E, H, batch_first=True, seed=1)
    theirs = torch.nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64)
    theirs.load_state_dict({n: torch.from_numpy(a.astype(np.float64)) for n, a in ours.state_dict().items()})
    x = rng.standard_normal((N, L, E)).astype(np.float32)
    kv = rng.standard_normal((N, S, E)).astype(np.float32)
    kpm = np.zeros((N, S), dtype=bool)
    kpm[1] = True  # batch element 1 may attend to nothing
    out, w = ours(x, kv, kv, key_padding_mask=kpm)
    bias = ours.state_dict()["out_proj.bias"]
    assert np.allclose(out[1], np.broadcast_to(bias, (L, E)), atol=1e-6)  # zero attention, then out_proj
    assert np.all(w[1] == 0.0)
    tout, tw = theirs(as_t(x), as_t(kv), as_t(kv), key_padding_mask=torch.from_numpy(kpm))
    keep = [0, 2]
    assert max_abs(out[keep], tout.detach().numpy()[keep]) <= 1e-5
    assert max_abs(w[keep], tw.detach().numpy()[keep]) <= 1e-5


def test_dropout_applies_in_training_mode_only():
    rng = np.random.default_rng(4)
    m = headlight.MultiheadAttention(8, 2, dropout=0.5, seed=3)
    x = rng.standard_normal((6, 1, 8)).astype(np.float32)
    assert m.training
    _, w_train = m(x, x, x)
    assert np.any(w_train == 0.0)
    m.eval()
    assert not m.training
    _, w_eval = m(x, x, x)
    assert np.all(w_eval > 0.0)
    assert m.train() is m and m.training


def test_state_dict_round_trip_and_keys():
    m = headlight.MultiheadAttention(8, 2, kdim=3, vdim=5, add_bias_kv=True)
    state = m.state_dict()
    assert list(state) == sorted(state) or set(state) == {
        "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias", "bias_k", "bias_v",
        "out_proj.weight", "out_proj.bias"}
    assert state["k_proj_weight"].shape == (8, 3) and state["bias_k"].shape == (1, 1, 8)
    state = {n: a + 1.0 for n, a in state.items()}
    m.load_state_dict(state)
    for n, a in m.state_dict().items():
        assert np.array_equal(a, state[n].astype(np.float32))

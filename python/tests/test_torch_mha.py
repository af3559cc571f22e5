"""headlight.torch.MultiheadAttention, the drop-in for torch.nn.MultiheadAttention: the same
state_dict gives the same outputs, weights and gradients (inputs and every parameter) as torch's
module in float64, over the numpy module's grid of options; and it is a torch module in every
other respect (parameters, optimisers, train/eval, bf16)."""

import copy

import numpy as np
import pytest
import torch

import headlight.torch as ht
from conftest import grad_floor, max_abs, rel_err
from test_multihead_attention import draw_config, draw_masks, inputs


def mask_for(m, dtype):
    if m is None:
        return None
    return torch.from_numpy(m) if m.dtype == bool else torch.from_numpy(m).to(dtype)


@pytest.mark.parametrize("case", range(80))
def test_matches_torch_multihead_attention(case):
    rng = np.random.default_rng(5000 + case)  # the numpy module's cases
    c = draw_config(rng)
    q, k, v = inputs(rng, c)
    kpm, am, is_causal = draw_masks(rng, c)
    need_weights = bool(rng.random() < 0.7)
    average = bool(rng.random() < 0.5)
    kwargs = dict(bias=c["bias"], add_bias_kv=c["add_bias_kv"], add_zero_attn=c["add_zero_attn"],
                  kdim=c["kdim"], vdim=c["vdim"], batch_first=c["batch_first"])
    torch.manual_seed(case)
    theirs = torch.nn.MultiheadAttention(c["E"], c["H"], **kwargs)
    ours = ht.MultiheadAttention(c["E"], c["H"], **kwargs)
    ours.load_state_dict(theirs.state_dict())
    assert list(ours.state_dict()) == list(theirs.state_dict())
    theirs = theirs.double()

    same = q is k  # self-attention: one tensor for all three
    tq = torch.from_numpy(q).requires_grad_()
    tk = tq if same else torch.from_numpy(k).requires_grad_()
    tv = tq if same else torch.from_numpy(v).requires_grad_()
    rq = tq.detach().double().requires_grad_()
    rk = rq if same else tk.detach().double().requires_grad_()
    rv = rq if same else tv.detach().double().requires_grad_()
    out, weights = ours(tq, tk, tv, key_padding_mask=mask_for(kpm, torch.float32),
                        need_weights=need_weights, attn_mask=mask_for(am, torch.float32),
                        average_attn_weights=average, is_causal=is_causal)
    ref, ref_weights = theirs(rq, rk, rv, key_padding_mask=mask_for(kpm, torch.float64),
                              need_weights=need_weights, attn_mask=mask_for(am, torch.float64),
                              average_attn_weights=average, is_causal=is_causal)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert max_abs(out.detach().numpy(), ref.detach().numpy()) <= 1e-5
    if need_weights:
        assert weights.shape == ref_weights.shape
        assert max_abs(weights.numpy(), ref_weights.detach().numpy()) <= 1e-5
    else:
        assert weights is None and ref_weights is None

    go = rng.standard_normal(tuple(out.shape)).astype(np.float32)
    out.backward(torch.from_numpy(go))
    ref.backward(torch.from_numpy(go).double())
    refs = [t.grad.numpy() for t in {id(x): x for x in (rq, rk, rv)}.values()]
    refs += [p.grad.numpy() for p in theirs.parameters()]
    floor = grad_floor(*refs)
    for name, got, want in (("query", tq, rq), ("key", tk, rk), ("value", tv, rv)):
        assert rel_err(got.grad.numpy(), want.grad.numpy(), floor) <= 1e-4, name
    for (name, p), r in zip(ours.named_parameters(), theirs.parameters()):
        assert rel_err(p.grad.numpy(), r.grad.numpy(), floor) <= 1e-4, name


def test_is_a_torch_module_that_trains_and_switches_modes():
    torch.manual_seed(0)
    m = ht.MultiheadAttention(32, 4, dropout=0.5, batch_first=True)
    assert isinstance(m, torch.nn.MultiheadAttention)
    x = torch.randn(2, 10, 32)
    m.eval()
    a, _ = m(x, x, x, need_weights=False)
    b, _ = m(x, x, x, need_weights=False)
    assert torch.equal(a, b)  # no dropout in eval mode
    m.train()
    c, w = m(x, x, x, average_attn_weights=False)
    assert not torch.equal(a, c) and (w == 0).float().mean().item() > 0.2  # dropped weights
    # An optimiser step through the module lowers a loss.
    m.eval()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    target = torch.randn(2, 10, 32)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = ((m(x, x, x, need_weights=False)[0] - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_bfloat16_module():
    torch.manual_seed(1)
    ref = torch.nn.MultiheadAttention(64, 4, batch_first=True)
    m = ht.MultiheadAttention(64, 4, batch_first=True)
    m.load_state_dict(ref.state_dict())
    m, ref16 = m.bfloat16(), copy.deepcopy(ref).bfloat16()
    x = torch.randn(2, 40, 64).bfloat16()
    out, w = m(x, x, x)
    exact = copy.deepcopy(ref16).double()  # the bf16 weights, in float64
    want, want_w = exact(x.double(), x.double(), x.double())
    plain, _ = ref16(x, x, x)  # torch's module in bf16
    assert out.dtype == torch.bfloat16 and w.dtype == torch.bfloat16
    err = (out.double() - want).abs().max().item()
    assert err <= 2 * max((plain.double() - want).abs().max().item(), 2**-8)
    assert (w.double() - want_w).abs().max().item() <= 0.01


def test_is_causal_needs_its_mask_as_in_torch():
    m = ht.MultiheadAttention(8, 2)
    x = torch.randn(3, 1, 8)
    with pytest.raises(RuntimeError, match="is_causal"):
        m(x, x, x, is_causal=True)

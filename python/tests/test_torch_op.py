"""headlight.torch.scaled_dot_product_attention, the PyTorch operator: outputs and autograd
gradients against torch's SDPA in float64 over the numpy front's grid, opcheck, gradcheck,
torch.compile, dropout, bf16, no copies, and bad input."""

import gc

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import headlight.torch as ht
from conftest import grad_floor, max_abs, rel_err
from test_sdpa import draw_case, torch_sdpa


def leaf(x, strided=False):
    """A float32 leaf tensor holding x; with `strided`, a non-contiguous view of the same values
    (the last two dims of a transposed copy, transposed back)."""
    t = torch.from_numpy(np.ascontiguousarray(x))
    if strided and t.dim() >= 2:
        t = t.transpose(-1, -2).contiguous().transpose(-1, -2)
        assert not t.is_contiguous() or min(t.shape[-2:]) == 1
    return t.requires_grad_()


@pytest.mark.parametrize("case", range(60))
def test_op_matches_torch(case):
    rng, c, q, k, v, mask, is_causal, scale = draw_case(case)  # the numpy front's cases
    tq, tk, tv = (leaf(x, strided=bool(case % 2)) for x in (q, k, v))
    tmask = None if mask is None else torch.from_numpy(np.ascontiguousarray(mask))
    out = ht.scaled_dot_product_attention(tq, tk, tv, attn_mask=tmask, is_causal=is_causal,
                                          scale=scale, enable_gqa=c["gqa"])
    go = rng.standard_normal(tuple(out.shape)).astype(np.float32)
    ref, dq_ref, dk_ref, dv_ref, _ = torch_sdpa(q, k, v, go, mask, is_causal, scale, c["gqa"])
    assert out.dtype == torch.float32 and tuple(out.shape) == ref.shape
    assert max_abs(out.detach().numpy(), ref) <= 1e-5
    out.backward(torch.from_numpy(go))
    floor = grad_floor(dq_ref, dk_ref, dv_ref)
    for name, t, want in (("dq", tq, dq_ref), ("dk", tk, dk_ref), ("dv", tv, dv_ref)):
        assert t.grad.shape == t.shape
        assert rel_err(t.grad.numpy(), want, floor) <= 1e-4, name


def sample_args(rng):
    """Argument lists of torch.ops.headlight.sdpa covering its options."""
    def t(*shape, grad=True, dtype=torch.float32):
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(
            dtype).requires_grad_(grad)

    seed = torch.tensor(7, dtype=torch.int64)
    return [
        (t(2, 3, 5, 8), t(2, 3, 7, 8), t(2, 3, 7, 4), None, 0.0, False, None, False, None, False),
        (t(2, 4, 6, 8), t(2, 2, 6, 8), t(2, 2, 6, 8), None, 0.0, True, 0.3, True, None, True),
        (t(3, 5, 8), t(3, 5, 8), t(3, 5, 8), torch.from_numpy(rng.random((5, 5)) < 0.7), 0.0,
         False, None, False, None, True),
        (t(1, 2, 4, 8), t(1, 2, 9, 8), t(1, 2, 9, 8), t(4, 9, grad=False), 0.25, False, None,
         False, seed, False),
        (t(1, 2, 6, 16, dtype=torch.bfloat16), t(1, 2, 6, 16, dtype=torch.bfloat16),
         t(1, 2, 6, 16, dtype=torch.bfloat16), None, 0.0, True, None, False, None, False),
    ]


def test_opcheck_passes_for_both_operators():
    # test_schema, test_autograd_registration, test_faketensor, test_aot_dispatch_dynamic:
    # the forward operator (and, through its autograd formula, the backward operator).
    rng = np.random.default_rng(3)
    for args in sample_args(rng):
        result = torch.library.opcheck(torch.ops.headlight.sdpa.default, args)
        assert all(v == "SUCCESS" for v in result.values()), result
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    out, lse, _ = torch.ops.headlight.sdpa(q, k, v, None, 0.0, True, None, False, None, False)
    bargs = (torch.randn_like(out), q, k, v, None, out, lse, 0.0, True, None, False, None)
    result = torch.library.opcheck(torch.ops.headlight.sdpa_backward.default, bargs)
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.filterwarnings("ignore:Input #:UserWarning")
def test_gradcheck_on_small_shapes():
    # float32 (headlight has no float64 kernels): finite differences with a step of 1e-3.
    torch.manual_seed(0)
    for causal, gqa, mask in ((False, False, None), (True, False, None),
                              (False, True, torch.rand(4, 6) < 0.8)):
        q = torch.randn(1, 2, 4, 3, requires_grad=True)
        kv_heads = 1 if gqa else 2
        k = torch.randn(1, kv_heads, 6, 3, requires_grad=True)
        v = torch.randn(1, kv_heads, 6, 2, requires_grad=True)

        def f(q, k, v):
            return ht.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                   enable_gqa=gqa)

        assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-3, atol=2e-3, rtol=2e-2)


def test_compile_fullgraph_has_no_graph_breaks_and_matches_eager():
    torch.manual_seed(1)
    mask = torch.rand(9, 11) < 0.8

    def f(q, k, v):
        o = ht.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return (o * o).sum()

    q = torch.randn(2, 4, 9, 16, requires_grad=True)
    k = torch.randn(2, 2, 11, 16, requires_grad=True)
    v = torch.randn(2, 2, 11, 16, requires_grad=True)
    want = f(q, k, v)
    want_grads = torch.autograd.grad(want, (q, k, v))
    for backend in ("aot_eager", "inductor"):
        torch._dynamo.reset()
        compiled = torch.compile(f, fullgraph=True, backend=backend)  # a break raises here
        got = compiled(q, k, v)
        grads = torch.autograd.grad(got, (q, k, v))
        assert torch.allclose(got, want, rtol=1e-5), backend
        for g, w in zip(grads, want_grads):
            assert torch.allclose(g, w, rtol=1e-4, atol=1e-5), backend
    torch._dynamo.reset()


def test_dropout_is_seeded_by_torch_and_its_gradient_uses_the_same_mask():
    q, k, v = (torch.randn(1, 2, 16, 8, requires_grad=True) for _ in range(3))
    torch.manual_seed(5)
    a = ht.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    torch.manual_seed(5)
    b = ht.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    c = ht.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    assert torch.equal(a, b) and not torch.equal(a, c)
    # The output is P'·V with the probabilities after dropout that the same seed gives, and the
    # value gradient is P'ᵀ·dO: the backward dropped exactly the forward's entries.
    seed = torch.tensor(11, dtype=torch.int64)
    out, _, probs = torch.ops.headlight.sdpa(q, k, v, None, 0.3, False, None, False, seed, True)
    assert (probs == 0).float().mean().item() > 0.1
    assert torch.allclose(out, probs @ v, atol=1e-5)
    go = torch.randn_like(out)
    dv = torch.autograd.grad(out, v, go)[0]
    assert torch.allclose(dv, probs.transpose(-1, -2) @ go, atol=1e-5)
    # The same through the eager path (an autograd.Function, not the operator's dispatch).
    out, probs = ht._attention(q, k, v, None, 0.3, False, None, False, True)
    assert (probs == 0).float().mean().item() > 0.1
    assert torch.allclose(out, probs @ v, atol=1e-5)
    dv = torch.autograd.grad(out, v, go)[0]
    assert torch.allclose(dv, probs.transpose(-1, -2) @ go, atol=1e-5)
    # Unbiased: without dropout the mean over many seeds.
    ref = ht.scaled_dot_product_attention(q, k, v)
    mean = sum(ht.scaled_dot_product_attention(q, k, v, dropout_p=0.3) for _ in range(400)) / 400
    assert (mean - ref).abs().max().item() < 0.15


def test_bfloat16_tensors_in_and_out():
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 4, 70, 32).bfloat16().requires_grad_() for _ in range(3))
    out = ht.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.dtype == torch.bfloat16
    exact = F.scaled_dot_product_attention(*(t.detach().double() for t in (q, k, v)),
                                           is_causal=True)
    plain = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # torch's bf16
    err = (out.double() - exact).abs().max().item()
    assert err <= 2 * max((plain.double() - exact).abs().max().item(), 2**-9)
    out.sum().backward()
    assert q.grad.dtype == torch.bfloat16 and k.grad.dtype == torch.bfloat16
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    F.scaled_dot_product_attention(qd, kd, vd, is_causal=True).sum().backward()
    for got, want in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        scale = want.abs().max().item()
        assert (got.double() - want).abs().max().item() <= 0.05 * scale


def test_autocast_runs_bfloat16_as_torchs_sdpa_does():
    """Under torch.autocast("cpu", bfloat16) float32 arguments (a float mask too) are cast to
    bfloat16 as autocast casts torch's SDPA's: a bf16 output equal to the call on the cast tensors,
    gradients back to the float32 leaves; other autocast dtypes leave float32 alone."""
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 4, 40, 32, requires_grad=True) for _ in range(3))
    mask = torch.randn(40, 40)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ht.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        mixed = ht.scaled_dot_product_attention(q, k.detach().bfloat16(), v, attn_mask=mask)
    assert out.dtype == theirs.dtype == torch.bfloat16
    bq, bk, bv, bm = (t.detach().bfloat16().requires_grad_() for t in (q, k, v, mask))
    want = ht.scaled_dot_product_attention(bq, bk, bv, attn_mask=bm.detach())
    assert torch.equal(out, want) and torch.equal(mixed, want)
    exact = F.scaled_dot_product_attention(*(t.detach().double() for t in (bq, bk, bv, bm)))
    err = (out.double() - exact).abs().max().item()
    assert err <= 2 * max((theirs.double() - exact).abs().max().item(), 2**-9)
    go = torch.randn(out.shape).bfloat16()
    out.backward(go)
    want.backward(go)
    for leaf_, cast in ((q, bq), (k, bk), (v, bv)):
        assert leaf_.grad.dtype == torch.float32
        assert torch.equal(leaf_.grad, cast.grad.float())
    with torch.autocast("cpu", dtype=torch.float16):  # no float16 kernels: float32 as it is
        o16 = ht.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert o16.dtype == torch.float32
    assert torch.equal(o16, ht.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    # The module: its projections run in bf16 under autocast, and so does its attention.
    torch.manual_seed(4)
    mha = ht.MultiheadAttention(32, 4, batch_first=True)
    ref = torch.nn.MultiheadAttention(32, 4, batch_first=True)
    ref.load_state_dict(mha.state_dict())
    x = torch.randn(2, 40, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, weights = mha(x, x, x, attn_mask=mask)
        ref_out, ref_weights = ref(x, x, x, attn_mask=mask)
    assert got.dtype == ref_out.dtype == weights.dtype == ref_weights.dtype == torch.bfloat16
    assert (got.float() - ref_out.float()).abs().max().item() <= 0.05 * ref_out.abs().max().item()
    assert (weights.float() - ref_weights.float()).abs().max().item() <= 0.02


def test_autocast_under_torch_compile_matches_eager():
    torch.manual_seed(6)
    q, k, v = (torch.randn(1, 2, 24, 16, requires_grad=True) for _ in range(3))

    def f(q, k, v):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return ht.scaled_dot_product_attention(q, k, v, is_causal=True)

    want = f(q, k, v)
    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    torch._dynamo.reset()
    assert got.dtype == want.dtype == torch.bfloat16
    assert torch.equal(got, want)
    (gq,) = torch.autograd.grad(got.float().sum(), q)
    (wq,) = torch.autograd.grad(want.float().sum(), q)
    assert gq.dtype == torch.float32 and torch.equal(gq, wq)


def test_inputs_are_read_in_place_and_never_written():
    q = torch.randn(2, 3, 8, 16)
    k = torch.randn(2, 3, 16, 8).transpose(-1, -2)  # strided: (2, 3, 8, 16) with last stride 8
    k = k.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert ht._array(q).ctypes.data == q.data_ptr()
    b = torch.randn(2, 3, 8, 16).bfloat16()
    assert ht._array(b).ctypes.data == b.data_ptr()
    v = torch.randn(2, 1, 8, 16).expand(2, 3, 8, 16)  # a broadcast view (stride 0)
    assert ht._array(v).strides[1] == 0
    before = [t.clone() for t in (q, k, v)]
    qg, kg, vg = (t.requires_grad_() for t in (q.clone(), k.clone(), v.clone()))
    out = ht.scaled_dot_product_attention(q, k, v)
    ht.scaled_dot_product_attention(qg, kg, vg, is_causal=True).sum().backward()
    for t, was in zip((q, k, v), before):
        assert torch.equal(t, was)
    # The result owns its memory: it outlives every input.
    want = out.clone()
    del q, k, v, before
    gc.collect()
    assert torch.equal(out, want)


def test_bad_input_is_named():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="query: headlight runs on the CPU.*meta"):
        ht.scaled_dot_product_attention(q.to("meta"), q, q)
    with pytest.raises(ValueError, match="key: dtype must be one of float32, bfloat16; got float64"):
        ht.scaled_dot_product_attention(q, q.double(), q)
    with pytest.raises(ValueError, match="one dtype"):
        ht.scaled_dot_product_attention(q, q, q.bfloat16())
    with pytest.raises(ValueError, match="attn_mask: dtype"):
        ht.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(4, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="attn_mask: requires grad"):
        ht.scaled_dot_product_attention(q, q, q, attn_mask=torch.zeros(4, 4, requires_grad=True))
    with pytest.raises(TypeError, match="value: expected a torch.Tensor"):
        ht.scaled_dot_product_attention(q, q, q.numpy())
    with pytest.raises(ValueError, match="key.*last dim"):
        ht.scaled_dot_product_attention(q, torch.randn(1, 2, 4, 6), q)
    # Without grad mode a float mask that requires grad is only read.
    with torch.no_grad():
        ht.scaled_dot_product_attention(q, q, q, attn_mask=torch.zeros(4, 4, requires_grad=True))

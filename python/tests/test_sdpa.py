"""headlight.scaled_dot_product_attention and its backward against
torch.nn.functional.scaled_dot_product_attention in float64 with autograd."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import headlight
from conftest import as_t, grad_floor, max_abs, rel_err


def random_config(rng):
    nbatch = int(rng.integers(0, 3))
    batch = tuple(int(x) for x in rng.integers(1, 4, size=nbatch))
    hq = int(rng.choice([1, 2, 4, 6]))
    gqa = bool(rng.random() < 0.35) and hq > 1
    hkv = int(rng.choice([d for d in (1, 2, 3) if hq % d == 0])) if gqa else hq
    L = int(rng.choice([1, 2, 5, 17]))
    S = int(rng.choice([1, 3, 8, 17]))
    E = int(rng.choice([1, 4, 8, 16]))
    Ev = int(rng.choice([E, 3, 8]))
    return dict(batch=batch, hq=hq, hkv=hkv, gqa=gqa, L=L, S=S, E=E, Ev=Ev)


def make_inputs(rng, c):
    lead = c["batch"] + ((c["hq"],) if (c["batch"] or c["hq"] > 1 or rng.random() < 0.5) else ())
    lead_kv = c["batch"] + ((c["hkv"],) if lead and len(lead) > len(c["batch"]) else ())
    q = rng.standard_normal(lead + (c["L"], c["E"])).astype(np.float32)
    k = rng.standard_normal(lead_kv + (c["S"], c["E"])).astype(np.float32)
    v = rng.standard_normal(lead_kv + (c["S"], c["Ev"])).astype(np.float32)
    return q, k, v


def random_mask(rng, q, S):
    """A bool or float mask of a shape that broadcasts to (..., L, S), or None."""
    kind = rng.choice(["none", "bool", "float", "float_inf"])
    if kind == "none":
        return None
    full = q.shape[:-1] + (S,)
    # Drop leading dims and set some dims to 1 to exercise broadcasting.
    ndim = int(rng.integers(2, len(full) + 1))
    shape = tuple(1 if (rng.random() < 0.3 and i < ndim - 1) else d for i, d in enumerate(full[-ndim:]))
    if kind == "bool":
        return rng.random(shape) < 0.75
    m = rng.standard_normal(shape).astype(np.float32)
    if kind == "float_inf":
        m[rng.random(shape) < 0.25] = -np.inf
    return m


def allowed_everywhere_else(q, S, mask, is_causal):
    """Boolean (..., L, S): where attention is allowed, for finding fully masked rows."""
    L = q.shape[-2]
    allowed = np.ones(q.shape[:-1] + (S,), dtype=bool)
    if mask is not None:
        m = mask if mask.dtype == bool else np.isfinite(mask) | (mask > 0)
        allowed = allowed & np.broadcast_to(m, allowed.shape)
    if is_causal:
        allowed = allowed & np.tril(np.ones((L, S), dtype=bool))
    return allowed


def torch_sdpa(q, k, v, grad_out, mask, is_causal, scale, gqa):
    """Oracle in float64. Rows with no allowed key give zeros (headlight's documented choice): they
    are computed unmasked by torch, then their output and output gradient are zeroed."""
    S = k.shape[-2]
    dead = ~allowed_everywhere_else(q, S, mask, is_causal).any(axis=-1)  # (..., L)
    tq, tk, tv = as_t(q, True), as_t(k, True), as_t(v, True)
    tmask = None
    if is_causal:
        causal = np.tril(np.ones((q.shape[-2], S), dtype=bool))
        base = np.broadcast_to(mask if mask is not None else np.ones((1, 1), dtype=bool),
                               np.broadcast_shapes(q.shape[:-1] + (S,), (mask.shape if mask is not None else ())))
        if mask is None or mask.dtype == bool:
            m = base & causal
        else:
            m = np.where(causal, base, -np.inf)
    else:
        m = None if mask is None else np.broadcast_to(mask, np.broadcast_shapes(q.shape[:-1] + (S,), mask.shape))
    if m is not None:
        m = np.array(m)
        # Unmask dead rows so torch gives finite numbers there.
        dead_full = np.broadcast_to(dead[..., None], m.shape)
        if m.dtype == bool:
            m[dead_full] = True
            tmask = torch.from_numpy(m)
        else:
            m = m.astype(np.float64)
            m[dead_full] = 0.0
            tmask = torch.from_numpy(m)
    out = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tmask, scale=scale, enable_gqa=gqa)
    g = np.array(grad_out, dtype=np.float64)
    g[np.broadcast_to(dead[..., None], g.shape)] = 0.0
    out.backward(torch.from_numpy(g))
    o = out.detach().numpy().copy()
    o[np.broadcast_to(dead[..., None], o.shape)] = 0.0
    return o, tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy(), dead


def draw_case(case):
    """Case `case` of the grid (shared with the PyTorch operator's test, test_torch_op.py): the
    generator (for what the test draws next), config, q, k, v, mask, is_causal and scale."""
    rng = np.random.default_rng(1000 + case)
    c = random_config(rng)
    q, k, v = make_inputs(rng, c)
    if q.ndim >= 3 and q.shape[-3] != k.shape[-3] and not c["gqa"]:
        pytest.skip("shape drawn without heads")
    mask = random_mask(rng, q, c["S"])
    is_causal = bool(rng.random() < 0.3)
    scale = None if rng.random() < 0.6 else float(rng.uniform(0.05, 1.5))
    return rng, c, q, k, v, mask, is_causal, scale


@pytest.mark.parametrize("kernel", ["reference", "fused"])
@pytest.mark.parametrize("case", range(120))
def test_sdpa_matches_torch(case, kernel):
    rng, c, q, k, v, mask, is_causal, scale = draw_case(case)
    gqa = c["gqa"]
    out = headlight.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                 scale=scale, enable_gqa=gqa, kernel=kernel)
    go = rng.standard_normal(out.shape).astype(np.float32)
    ref, dq_ref, dk_ref, dv_ref, dead = torch_sdpa(q, k, v, go, mask, is_causal, scale, gqa)
    assert out.dtype == np.float32 and out.shape == ref.shape
    assert max_abs(out, ref) <= 1e-5
    dq, dk, dv = headlight.scaled_dot_product_attention_backward(
        q, k, v, go, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=gqa, kernel=kernel)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    floor = grad_floor(dq_ref, dk_ref, dv_ref)
    for name, got, want in (("dq", dq, dq_ref), ("dk", dk, dk_ref), ("dv", dv, dv_ref)):
        assert rel_err(got, want, floor) <= 1e-4, name
    if dead.any():
        assert np.all(out[np.broadcast_to(dead[..., None], out.shape)] == 0.0)


def test_fully_masked_rows_are_zero_not_nan():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, 4)).astype(np.float32)
    k = rng.standard_normal((2, 5, 4)).astype(np.float32)
    v = rng.standard_normal((2, 5, 4)).astype(np.float32)
    mask = np.ones((3, 5), dtype=bool)
    mask[1] = False
    out = headlight.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert np.all(out[:, 1] == 0.0)
    assert np.all(np.isfinite(out))
    ref = F.scaled_dot_product_attention(as_t(q), as_t(k), as_t(v), attn_mask=torch.from_numpy(mask)).numpy()
    # (PyTorch's math kernel has given NaN there; 2.13 gives zeros as well.)
    assert max_abs(out[:, [0, 2]], ref[:, [0, 2]]) <= 1e-5


def test_non_contiguous_and_other_dtypes():
    rng = np.random.default_rng(1)
    base = rng.standard_normal((2, 4, 6, 8))
    q = base.transpose(0, 1, 3, 2)[..., :6]  # float64, strided
    k = np.asfortranarray(rng.standard_normal((2, 4, 7, 6)).astype(np.float32))
    v = rng.standard_normal((2, 4, 7, 10)).astype(np.float32)[..., ::2]
    out = headlight.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref = F.scaled_dot_product_attention(as_t(q), as_t(k), as_t(v), is_causal=True).numpy()
    assert max_abs(out, ref) <= 1e-5


@pytest.mark.parametrize("kernel", ["reference", "fused"])
def test_nan_propagates_to_affected_rows_only(kernel):
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 2, 4, 8)).astype(np.float32)
    k = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    v = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    q[0, 1, 2, 3] = np.nan
    out = headlight.scaled_dot_product_attention(q, k, v, kernel=kernel)
    assert np.all(np.isnan(out[0, 1, 2]))
    mask = np.ones(out.shape, dtype=bool)
    mask[0, 1, 2] = False
    assert np.all(np.isfinite(out[mask]))


def test_dropout_is_seeded_and_unbiased():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 1, 64, 8)).astype(np.float32)
    k = rng.standard_normal((1, 1, 64, 8)).astype(np.float32)
    v = np.ones((1, 1, 64, 1), dtype=np.float32)
    a = headlight.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=7)
    b = headlight.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=7)
    c = headlight.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=8)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    # With v = 1 the output is Σ_j P'_ij, whose expectation is 1.
    assert abs(float(a.mean()) - 1.0) < 0.15


def test_unknown_kernel_is_a_value_error():
    q = np.ones((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match="kernel: unknown kernel 'fast'"):
        headlight.scaled_dot_product_attention(q, q, q, kernel="fast")


def test_threads_and_saved_forward_arguments():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 3, 9, 8)).astype(np.float32) for _ in range(3))
    with pytest.raises(ValueError, match="threads: must be 0"):
        headlight.scaled_dot_product_attention(q, k, v, threads=-1)
    # One thread or two: the same bits; the forward's output and lse handed to the backward give
    # the gradients it computes on its own.
    out, lse = headlight.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True,
                                                      threads=1)
    assert lse.shape == (2, 3, 9) and lse.dtype == np.float32
    assert np.array_equal(out, headlight.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                      threads=2))
    go = rng.standard_normal(out.shape).astype(np.float32)
    want = headlight.scaled_dot_product_attention_backward(q, k, v, go, is_causal=True)
    got = headlight.scaled_dot_product_attention_backward(q, k, v, go, is_causal=True, output=out,
                                                          lse=lse, threads=2)
    for a, b in zip(got, want):
        assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="saved lse"):
        headlight.scaled_dot_product_attention_backward(q, k, v, go, output=out, lse=lse[..., :4])
    # Probabilities from the same pass: rows sum to one, and output = P·V.
    out, probs = headlight.scaled_dot_product_attention(q, k, v, return_probs=True)
    assert np.allclose(probs.sum(-1), 1.0, atol=1e-5)
    assert np.allclose(out, probs @ v, atol=1e-5)


def test_calls_from_several_threads_reuse_their_own_scratch():
    # The functional SDPA keeps a thread context (its scratch) per calling thread and thread count
    # between calls: calls of different shapes, thread counts and Python threads, interleaved,
    # each give the bits of the same call made alone, and a bad call leaves the next one sound.
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(5)
    problems = []
    for shape in [(1, 4, 300, 64), (2, 2, 40, 24), (1, 8, 1, 64)]:
        q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
        go = rng.standard_normal(shape).astype(np.float32)
        problems.append((q, k, v, go))

    def run(i, threads):
        q, k, v, go = problems[i % len(problems)]
        out = headlight.scaled_dot_product_attention(q, k, v, is_causal=True, threads=threads)
        grads = headlight.scaled_dot_product_attention_backward(q, k, v, go, is_causal=True,
                                                                threads=threads)
        return (out, *grads)

    want = [run(i, 1) for i in range(len(problems))]
    with pytest.raises(ValueError, match="key"):
        q, k, v, _ = problems[0]
        headlight.scaled_dot_product_attention(q, k[..., :8], v, threads=2)
    with ThreadPoolExecutor(max_workers=3) as pool:
        jobs = [(i, pool.submit(run, i, 1 + i % 2)) for i in range(12)]
        for i, job in jobs:
            for got, ref in zip(job.result(), want[i % len(problems)]):
                assert np.array_equal(got, ref)

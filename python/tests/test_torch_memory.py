"""Lifetimes across the PyTorch boundary: headlight reads the caller's tensors in place and hands
back tensors over its own memory, so every way a caller can drop a reference early must leave
nothing to be read after it is freed. Plain pytest checks the values; `make test-asan` runs this
file with the extension built under AddressSanitizer, where a read after free fails the run."""

import gc

import pytest
import torch

import headlight.torch as ht


def fresh(*shape, dtype=torch.float32, grad=True):
    return torch.randn(*shape).to(dtype).requires_grad_(grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_after_the_caller_dropped_every_input(dtype):
    q, k, v = fresh(2, 4, 33, 16, dtype=dtype), fresh(2, 2, 40, 16, dtype=dtype), \
        fresh(2, 2, 40, 16, dtype=dtype)
    mask = torch.rand(33, 40) < 0.8
    out = ht.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    want = [t.detach().clone() for t in (q, k, v)]
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out), retain_graph=True)
    del q, k, v, mask  # the graph keeps what the backward reads
    gc.collect()
    leaves = out.grad_fn.next_functions  # the inputs, still reachable through the graph
    assert leaves
    again = torch.autograd.grad(out, [n[0].variable for n in leaves if n[0] is not None],
                                torch.ones_like(out))
    for a, b in zip(grads, again):
        assert torch.equal(a, b)
    assert all(w.isfinite().all() for w in want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_results_outlive_the_inputs_and_the_arrays_under_them(dtype):
    q = fresh(1, 2, 17, 8, dtype=dtype, grad=False)
    out, probs = ht._attention(q, q, q, None, 0.0, True, None, False, True)
    want_out, want_probs = out.clone(), probs.clone()
    del q
    gc.collect()
    views = [out[:, :, ::2], probs.transpose(-1, -2)]  # views keep the owner alive too
    del out, probs
    gc.collect()
    assert torch.equal(views[0], want_out[:, :, ::2])
    assert torch.equal(views[1], want_probs.transpose(-1, -2))


def test_strided_and_broadcast_inputs_freed_after_the_call():
    base = torch.randn(3, 40, 2, 16)
    q = base.permute(0, 2, 1, 3)  # (3, 2, 40, 16), strided
    kv = torch.randn(1, 2, 40, 16).expand(3, 2, 40, 16)  # stride 0 over the batch
    out = ht.scaled_dot_product_attention(q, kv, kv, is_causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True)
    del base, q, kv
    gc.collect()
    assert torch.allclose(out, ref, atol=1e-5)


def test_captured_weights_outlive_the_module_and_the_capture():
    torch.manual_seed(0)
    m = ht.MultiheadAttention(16, 4, batch_first=True)
    x = torch.randn(2, 9, 16)
    with ht.capture(m) as heads:
        out, w = m(x, x, x, average_attn_weights=False)
    p = heads[""]
    want = (out.detach().clone(), w.clone(), p.clone())
    del m, x, heads
    gc.collect()
    assert torch.equal(out.detach(), want[0]) and torch.equal(w, want[1])
    assert torch.equal(p, want[2])

"""Shared helpers for the tests that use PyTorch (float64, autograd) as the oracle."""

import numpy as np
import pytest
import torch

torch.set_num_threads(1)


def as_t(x, requires_grad=False):
    """A float64 torch tensor holding exactly the float32 values of x."""
    t = torch.from_numpy(np.asarray(x, dtype=np.float32).astype(np.float64))
    return t.requires_grad_(requires_grad)


def max_abs(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def rel_err(a, b, floor=1e-3):
    """Largest absolute difference relative to the largest reference magnitude, or to `floor` when
    that is larger. A gradient that is exactly zero in exact arithmetic (one key only, say) comes out
    of fp32 arithmetic as the rounding of its O(1) intermediates (P, dP, dO·O), so callers pass as
    floor a tenth of the largest gradient of the same computation."""
    b = np.asarray(b, dtype=np.float64)
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    return max_abs(a, b) / max(scale, floor)


def grad_floor(*refs):
    """A tenth of the largest magnitude among the reference gradients `refs`."""
    return 0.1 * max((float(np.max(np.abs(np.asarray(r)))) for r in refs if np.asarray(r).size),
                     default=0.0) or 1e-3


@pytest.fixture
def rng(request):
    # A different, reproducible stream per test.
    seed = abs(hash(request.node.nodeid)) % (2**32)
    return np.random.default_rng(seed)

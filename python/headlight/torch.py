"""headlight inside PyTorch (docs/torch.md): its attention as a PyTorch operator with autograd, a
drop-in ``MultiheadAttention``, a transformers attention implementation (``register``) and the
capture of every head's attention (``capture``).

``scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
scale=None, enable_gqa=False)`` has the signature and semantics of
``torch.nn.functional.scaled_dot_product_attention`` (one deliberate difference, as everywhere in
headlight: a query row with no allowed key gives zeros, not NaN). It is the custom operator
``torch.ops.headlight.sdpa`` (``torch.library.custom_op``): its backward is headlight's fused
backward (``torch.ops.headlight.sdpa_backward``), fed the forward's output and log-sum-exp so that
nothing is recomputed; both have fake implementations, so ``torch.compile(fullgraph=True)`` traces
them without graph breaks, and ``torch.library.opcheck`` passes on both. Eager calls take the same
kernels through an ``autograd.Function`` (the operator's dispatch costs more than a small call's
kernel), or no autograd at all when nothing requires grad.

Tensors: CPU, float32 or bfloat16 (query, key and value of one dtype; the output and gradients have
it); masks bool, float32 or bfloat16. They reach the kernels without copies (numpy views of the same
memory, any strides). Anything else — a CUDA tensor, float16 or float64, a float mask that requires
grad (headlight does not compute the mask's gradient) — is refused with an error that names the
argument; ``torch.nn.functional.scaled_dot_product_attention`` is the place for those.

Under ``torch.autocast("cpu", dtype=torch.bfloat16)`` the float32 arguments (a float mask too) are
cast to bfloat16 first, as autocast casts those of torch's own
``scaled_dot_product_attention``: the output is then bfloat16, and the gradients reach float32
leaves as float32. Under another autocast dtype (float16, for which headlight has no kernels) the
arguments stay as they are.

Threads: torch's (``torch.get_num_threads()``), passed to each call.

Dropout draws its seed from torch's default generator (``torch.manual_seed`` fixes it); the random
mask is headlight's own, so with dropout the values differ from torch's while the distribution is
the same.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from . import _headlight

__all__ = ["scaled_dot_product_attention", "MultiheadAttention", "register", "capture", "Capture"]

_DTYPES = (torch.float32, torch.bfloat16)
_MASK_DTYPES = (torch.bool, torch.float32, torch.bfloat16)


def _array(t: torch.Tensor) -> np.ndarray:
    """A numpy array over t's memory (no copy; strides kept): float32, bool or bfloat16."""
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.detach().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy(force=True)  # detached (a CPU float or bool tensor: the same memory)


def _tensor(a: np.ndarray) -> torch.Tensor:
    """A torch tensor over a result array's memory (no copy)."""
    if a.dtype == np.float32:
        return torch.from_numpy(a)
    return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)


def _maybe_array(t: Optional[torch.Tensor]):
    return None if t is None else _array(t)


def _seed_of(seed: Optional[torch.Tensor]) -> int:
    return 0 if seed is None else int(seed.item())


def _shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """The output's and the log-sum-exp's shapes (broadcast batch dims, as the kernel's front)."""

    def batch(t):
        return tuple(t.shape[:-3]) if t.dim() > 3 else ()

    dims = torch.broadcast_shapes(batch(q), batch(k), batch(v))
    heads = (q.shape[-3] if q.dim() >= 3 else 1,) if max(q.dim(), k.dim(), v.dim()) >= 3 else ()
    lse = tuple(dims) + heads + (q.shape[-2],)
    return lse + (v.shape[-1],), lse


def _run_forward(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed,
                 need_probs, need_lse=True):
    """The kernels: (output, lse or None, probabilities or None), seed an int."""
    r = _headlight._sdpa_positional(
        _array(query), _array(key), _array(value), _maybe_array(attn_mask), dropout_p, is_causal,
        scale, enable_gqa, seed, "automatic", need_lse, need_probs, torch.get_num_threads())
    if not (need_lse or need_probs):
        return _tensor(r), None, None
    return (_tensor(r[0]), _tensor(r[1]) if need_lse else None,
            _tensor(r[-1]) if need_probs else None)


def _run_backward(grad_output, query, key, value, attn_mask, output, lse, dropout_p, is_causal,
                  scale, enable_gqa, seed):
    """The fused backward from the forward's output and lse: (dq, dk, dv)."""
    dq, dk, dv = _headlight.scaled_dot_product_attention_backward(
        _array(query), _array(key), _array(value), _array(grad_output), _maybe_array(attn_mask),
        is_causal, scale, enable_gqa, dropout_p=dropout_p, seed=seed, output=_array(output),
        lse=_array(lse), threads=torch.get_num_threads())
    return _tensor(dq), _tensor(dk), _tensor(dv)


# The operators, for graphs (torch.compile, export, opcheck): the seed is a tensor, so that a
# compiled graph draws it at run time.


@torch.library.custom_op("headlight::sdpa", mutates_args=(), device_types="cpu")
def _sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor],
    dropout_p: float,
    is_causal: bool,
    scale: Optional[float],
    enable_gqa: bool,
    seed: Optional[torch.Tensor],
    need_probs: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out, lse, probs = _run_forward(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                   enable_gqa, _seed_of(seed), need_probs)
    return out, lse, query.new_empty((0,), dtype=torch.float32) if probs is None else probs


@_sdpa.register_fake
def _sdpa_fake(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed,
               need_probs):
    out, lse = _shapes(query, key, value)
    probs = lse + (key.shape[-2],) if need_probs else (0,)
    return (query.new_empty(out), query.new_empty(lse, dtype=torch.float32),
            query.new_empty(probs, dtype=torch.float32))


@torch.library.custom_op("headlight::sdpa_backward", mutates_args=(), device_types="cpu")
def _sdpa_backward(
    grad_output: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor],
    output: torch.Tensor,
    lse: torch.Tensor,
    dropout_p: float,
    is_causal: bool,
    scale: Optional[float],
    enable_gqa: bool,
    seed: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _run_backward(grad_output, query, key, value, attn_mask, output, lse, dropout_p,
                         is_causal, scale, enable_gqa, _seed_of(seed))


@_sdpa_backward.register_fake
def _sdpa_backward_fake(grad_output, query, key, value, attn_mask, output, lse, dropout_p,
                        is_causal, scale, enable_gqa, seed):
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)


def _setup_context(ctx, inputs, output):
    query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed, _ = inputs
    out, lse, _ = output
    ctx.save_for_backward(query, key, value, attn_mask, out, lse, seed)
    ctx.options = (dropout_p, is_causal, scale, enable_gqa)


def _backward(ctx, grad_output, grad_lse, grad_probs):
    # The log-sum-exp and the probabilities are not differentiable outputs (the public functions
    # return them detached); only the output's gradient flows.
    query, key, value, attn_mask, out, lse, seed = ctx.saved_tensors
    dropout_p, is_causal, scale, enable_gqa = ctx.options
    dq, dk, dv = torch.ops.headlight.sdpa_backward(grad_output, query, key, value, attn_mask, out,
                                                   lse, dropout_p, is_causal, scale, enable_gqa,
                                                   seed)
    return dq, dk, dv, None, None, None, None, None, None, None


_sdpa.register_autograd(_backward, setup_context=_setup_context)


class _Sdpa(torch.autograd.Function):
    """The eager path: the same kernels and the same autograd formula as the operator, without
    the dispatcher's per-call cost (tens of microseconds, more than a small problem's kernel).
    The arguments that take no gradient come as one tuple (attn_mask, dropout_p, is_causal, scale,
    enable_gqa, seed, need_probs): apply() inspects each argument, ≈ 0.2 µs apiece."""

    @staticmethod
    def forward(ctx, query, key, value, options):
        attn_mask, dropout_p, is_causal, scale, enable_gqa, seed, need_probs = options
        out, lse, probs = _run_forward(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                       enable_gqa, seed, need_probs)
        ctx.save_for_backward(query, key, value, attn_mask, out, lse)
        ctx.options = (dropout_p, is_causal, scale, enable_gqa, seed)
        if probs is None:
            return out
        ctx.mark_non_differentiable(probs)
        return out, probs

    @staticmethod
    def backward(ctx, grad_output, grad_probs=None):
        query, key, value, attn_mask, out, lse = ctx.saved_tensors
        dropout_p, is_causal, scale, enable_gqa, seed = ctx.options
        dq, dk, dv = _run_backward(grad_output, query, key, value, attn_mask, out, lse, dropout_p,
                                   is_causal, scale, enable_gqa, seed)
        return dq, dk, dv, None


def _check(name: str, t, dtypes) -> None:
    if type(t) is torch.Tensor and t.dtype in dtypes and t.device.type == "cpu":
        return  # the common case, checked first and fast
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name}: headlight runs on the CPU; got a tensor on {t.device} "
                         "(use torch.nn.functional.scaled_dot_product_attention there)")
    if t.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{name}: dtype must be one of {names}; got "
                         f"{str(t.dtype).removeprefix('torch.')}")


def _autocast(query, key, value, attn_mask):
    """The arguments as CPU autocast hands them to torch's SDPA (module doc): float32 tensors in
    bfloat16 when autocast's CPU dtype is bfloat16, the rest as they are."""
    if torch.get_autocast_dtype("cpu") != torch.bfloat16:
        return query, key, value, attn_mask

    def cast(t):
        if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
            return t.to(torch.bfloat16)
        return t

    return cast(query), cast(key), cast(value), cast(attn_mask)


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """torch.nn.functional.scaled_dot_product_attention on headlight's kernels (module doc)."""
    return _attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                      False)[0]


def _attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
               need_probs):
    """(output, probabilities when need_probs), after checking the arguments: the operator
    while torch.compile traces, else the same kernels through _Sdpa (or directly, without
    autograd)."""
    if torch.is_autocast_enabled("cpu"):
        query, key, value, attn_mask = _autocast(query, key, value, attn_mask)
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check(name, t, _DTYPES)
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise ValueError(f"query, key and value must have one dtype; got {query.dtype}, "
                         f"{key.dtype} and {value.dtype}")
    if attn_mask is not None:
        _check("attn_mask", attn_mask, _MASK_DTYPES)
        if attn_mask.requires_grad and torch.is_grad_enabled():
            raise ValueError("attn_mask: requires grad, and headlight does not compute the "
                             "gradient of a mask (detach it, or use torch's own attention)")
    scale = None if scale is None else float(scale)
    dropout_p, is_causal, enable_gqa = float(dropout_p), bool(is_causal), bool(enable_gqa)
    if torch.compiler.is_compiling():  # the operator, which graphs can hold
        seed = None
        if dropout_p > 0.0:  # from torch's generator, as a tensor: drawn when the graph runs
            seed = torch.randint(0, 2**62, (), dtype=torch.int64)
        out, _, probs = torch.ops.headlight.sdpa(query, key, value, attn_mask, dropout_p,
                                                 is_causal, scale, enable_gqa, seed,
                                                 bool(need_probs))
        return out, probs.detach()
    seed = int(torch.randint(0, 2**62, ()).item()) if dropout_p > 0.0 else 0
    args = (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed)
    if not (torch.is_grad_enabled() and (query.requires_grad or key.requires_grad
                                         or value.requires_grad)):
        out, _, probs = _run_forward(*args, bool(need_probs), need_lse=False)  # no backward
        return out, probs
    if need_probs:
        return _Sdpa.apply(query, key, value, args[3:] + (True,))
    return _Sdpa.apply(query, key, value, args[3:] + (False,)), None


class MultiheadAttention(torch.nn.MultiheadAttention):
    """torch.nn.MultiheadAttention with its attention on headlight.

    The same class underneath — constructor, parameters, ``state_dict`` keys, ``forward``
    signature and return values — so ``load_state_dict(torch_mha.state_dict())`` gives the same
    outputs and gradients. The projections are torch's (``F.linear``); the attention is
    ``scaled_dot_product_attention`` above, and ``need_weights=True`` returns the kernel's exact
    probabilities (after dropout, as torch's; averaged over heads unless
    ``average_attn_weights=False``) from the same fused pass. The weights are not differentiable
    (the output is).
    """

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        return _mha_forward(self, query, key, value, key_padding_mask, need_weights, attn_mask,
                            average_attn_weights, is_causal)


from ._torch_mha import _mha_forward  # noqa: E402  (the module's forward, its own file)


def register(name: str = "headlight") -> str:
    """Registers headlight with transformers' attention interface under `name`, so that
    ``AutoModel.from_pretrained(path, attn_implementation="headlight")`` (or
    ``model.set_attn_implementation("headlight")``) runs every attention layer on headlight,
    forward and backward. The masks are transformers' SDPA masks. Returns `name`."""
    from ._torch_transformers import register as _register

    return _register(name)


class Capture:
    """What ``capture(model)`` recorded: for each attention call of a layer on headlight, in call
    order, the layer's name in the model and its exact probabilities (B, H, L, S) (float32,
    after dropout when the layer dropped any), from the fused pass that computed the output."""

    def __init__(self, model: torch.nn.Module):
        self._names = {id(m): name for name, m in model.named_modules()}
        self._modules = [m for _, m in model.named_modules()]
        self.calls: list[tuple[str, torch.Tensor]] = []

    def record(self, module, probs: torch.Tensor) -> None:
        self.calls.append((self._names.get(id(module), ""), probs))

    @property
    def layers(self) -> list[str]:
        """The names of the layers that ran, first call order, each once."""
        return list(dict.fromkeys(name for name, _ in self.calls))

    def __getitem__(self, name: str) -> torch.Tensor:
        """The last probabilities of layer `name`."""
        for n, p in reversed(self.calls):
            if n == name:
                return p
        raise KeyError(f"capture: no attention recorded for layer {name!r}; recorded: "
                       f"{self.layers}")

    def attentions(self) -> list[torch.Tensor]:
        """Each layer's last probabilities, in layer order: output_attentions' tuple."""
        return [self[name] for name in self.layers]

    def statistics(self, name: str) -> dict[str, torch.Tensor]:
        """Per-row statistics of a layer's probabilities, (B, H, L) each: entropy (nats),
        argmax (the key with the largest weight, the first on ties) and max_weight."""
        p = self[name]
        logs = torch.where(p > 0, p.log(), torch.zeros_like(p))
        top, arg = p.max(dim=-1)
        return {"entropy": -(p * logs).sum(-1), "argmax": arg, "max_weight": top}

    def probs(self, batch: int = 0) -> torch.Tensor:
        """Every layer's last probabilities for sequence `batch`, stacked: (n_layer, H, L, S)."""
        return torch.stack([p[batch] for p in self.attentions()])

    def roles(self, batch: int = 0, causal: bool = True, repeated: int = 0) -> list[dict]:
        """Each head's role scores from the captured attention of sequence `batch`
        (headlight.head_roles: previous token, first token, self, local; with `repeated` = n,
        when the input was n random tokens repeated twice, induction and previous_token too)."""
        return _headlight.head_roles(self.probs(batch).numpy(), causal=causal, repeated=repeated)

    def report(self, path: str, token_text: list[str], batch: int = 0, causal: bool = True,
               repeated: int = 0, tokens=None, title: str = "headlight: what each head does",
               model_summary: str = "") -> None:
        """Writes the HTML head report `headlight explain` writes (head view, model view, head
        table of role scores) for sequence `batch`, one text per token
        (headlight.head_report)."""
        _headlight.head_report(path, self.probs(batch).numpy(), list(token_text), tokens=tokens,
                               causal=causal, repeated=repeated, title=title,
                               model_summary=model_summary)

    def __enter__(self):
        for m in self._modules:
            m._headlight_capture = self
        return self

    def __exit__(self, *exc):
        for m in self._modules:
            if getattr(m, "_headlight_capture", None) is self:
                del m._headlight_capture
        return False


def capture(model: torch.nn.Module) -> Capture:
    """``with capture(model) as heads: model(**inputs)`` records the exact per-head attention of
    every layer of `model` that runs on headlight (its MultiheadAttention modules, and the layers of
    a transformers model with attn_implementation set to the name ``register`` gave):
    ``heads.attentions()``, ``heads[name]``, ``heads.statistics(name)``, and from the captured
    attention the role scores (``heads.roles()``) and the HTML head report (``heads.report()``)."""
    return Capture(model)

"""headlight as a transformers attention implementation (headlight.torch.register).

transformers calls an attention function per layer with query (B, H, L, D) and key/value
(B, Hkv, S, D) after its projections and rotary embeddings, and the mask its mask interface built
for the implementation's name. This one takes SDPA's masks (bool, True where attention is allowed,
or None when is_causal says it all) and runs headlight's operator: grouped-query heads are read
in place (no repeat_kv), and a layer being captured (headlight.torch.capture) also returns its
exact probabilities, as transformers' eager attention does for output_attentions.
"""

from __future__ import annotations

import torch

from . import torch as _hl


def _attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                       is_causal=None, **kwargs):
    if kwargs.get("softcap") is not None:
        raise ValueError("headlight attention in transformers: softcap is not supported through "
                         "this interface (use attn_implementation='eager')")
    if kwargs.get("position_bias") is not None:
        raise ValueError("headlight attention in transformers: a learned position_bias (T5) is "
                         "not supported (use attn_implementation='sdpa' or 'eager')")
    # A sliding window comes in the mask (as for "sdpa"); transformers leaves the mask out only
    # where the window cannot matter.
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(q_len > 1 and attention_mask is None and causal)
    if causal and kv_len > q_len:  # a prefill into an empty static cache: its real keys first
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    gqa = key.shape[1] != query.shape[1]
    sink = getattr(module, "_headlight_capture", None)
    out, probs = _hl._attention(query, key, value, attention_mask, dropout, causal, scaling, gqa,
                                sink is not None)
    weights = None
    if sink is not None:
        sink.record(module, probs)
        weights = probs.to(query.dtype)
    return out.transpose(1, 2).contiguous(), weights


def register(name: str) -> str:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, _attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name

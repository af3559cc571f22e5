"""The forward of headlight.torch.MultiheadAttention: torch.nn.MultiheadAttention's, step for step
(torch.nn.functional.multi_head_attention_forward in PyTorch 2.13), with the attention itself on
headlight's operator. The mask, shape and projection steps call the same torch helpers as torch's
own forward, so that masks, bias_k/bias_v, add_zero_attn, kdim/vdim, batch_first and unbatched
inputs mean exactly what they mean there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import torch as _hl


def _mha_forward(m, query, key, value, key_padding_mask, need_weights, attn_mask,
                 average_attn_weights, is_causal):
    if m.batch_first:  # (N, L, E) → (L, N, E): views, as torch's forward
        query, key, value = (x.transpose(0, 1) if x.dim() == 3 else x for x in (query, key, value))
    is_batched = F._mha_shape_check(query, key, value, key_padding_mask, attn_mask, m.num_heads)
    if not is_batched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    tgt_len, bsz, embed_dim = query.shape
    H, hd = m.num_heads, m.head_dim
    key_padding_mask = F._canonical_mask(mask=key_padding_mask, mask_name="key_padding_mask",
                                         other_type=F._none_or_dtype(attn_mask),
                                         other_name="attn_mask", target_type=query.dtype)
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint (as "
                           "torch.nn.MultiheadAttention)")
    if is_causal and key_padding_mask is None and not need_weights:
        attn_mask = None  # the hint trusted, as torch does: causal without a mask
    else:
        attn_mask = F._canonical_mask(mask=attn_mask, mask_name="attn_mask", other_type=None,
                                      other_name="", target_type=query.dtype, check_other=False)
        if key_padding_mask is not None:
            is_causal = False
    if embed_dim != m.embed_dim:
        raise ValueError(f"query: expected embedding dim {m.embed_dim}, got {embed_dim}")

    if m._qkv_same_embed_dim:
        if key.shape != value.shape:
            raise ValueError(f"key shape {tuple(key.shape)} does not match value shape "
                             f"{tuple(value.shape)}")
        q, k, v = F._in_projection_packed(query, key, value, m.in_proj_weight, m.in_proj_bias)
    else:
        b_q = b_k = b_v = None
        if m.in_proj_bias is not None:
            b_q, b_k, b_v = m.in_proj_bias.chunk(3)
        q, k, v = F._in_projection(query, key, value, m.q_proj_weight, m.k_proj_weight,
                                   m.v_proj_weight, b_q, b_k, b_v)
    if attn_mask is not None:
        if attn_mask.dim() == 2:
            if attn_mask.shape != (tgt_len, key.shape[0]):
                raise RuntimeError(f"attn_mask: 2-D shape {tuple(attn_mask.shape)}, expected "
                                   f"{(tgt_len, key.shape[0])}")
            attn_mask = attn_mask.unsqueeze(0)
        elif attn_mask.dim() == 3:
            if attn_mask.shape != (bsz * H, tgt_len, key.shape[0]):
                raise RuntimeError(f"attn_mask: 3-D shape {tuple(attn_mask.shape)}, expected "
                                   f"{(bsz * H, tgt_len, key.shape[0])}")
        else:
            raise RuntimeError(f"attn_mask: {attn_mask.dim()} dims are not supported")
    if m.bias_k is not None and m.bias_v is not None:
        k = torch.cat([k, m.bias_k.repeat(1, bsz, 1)])
        v = torch.cat([v, m.bias_v.repeat(1, bsz, 1)])
        if attn_mask is not None:
            attn_mask = F.pad(attn_mask, (0, 1))
        if key_padding_mask is not None:
            key_padding_mask = F.pad(key_padding_mask, (0, 1))
    # (len, N, H·hd) → (N, H, len, hd): strided views, read in place by the kernel.
    q = q.view(tgt_len, bsz, H, hd).permute(1, 2, 0, 3)
    k = k.view(k.shape[0], bsz, H, hd).permute(1, 2, 0, 3)
    v = v.view(v.shape[0], bsz, H, hd).permute(1, 2, 0, 3)
    if m.add_zero_attn:
        zeros = torch.zeros((bsz, H, 1, hd), dtype=k.dtype, device=k.device)
        k, v = torch.cat([k, zeros], dim=2), torch.cat([v, zeros], dim=2)
        if attn_mask is not None:
            attn_mask = F.pad(attn_mask, (0, 1))
        if key_padding_mask is not None:
            key_padding_mask = F.pad(key_padding_mask, (0, 1))
    src_len = k.shape[2]
    # One additive mask broadcasting to (N, H, L, S): attn_mask's (1 or N·H, L, S) plus the key
    # padding's (N, S).
    mask = None
    if attn_mask is not None:
        mask = attn_mask.view(1 if attn_mask.shape[0] == 1 else bsz,
                              1 if attn_mask.shape[0] == 1 else H, tgt_len, src_len)
    if key_padding_mask is not None:
        if key_padding_mask.shape != (bsz, src_len):
            raise RuntimeError(f"key_padding_mask: expected shape {(bsz, src_len)}, got "
                               f"{tuple(key_padding_mask.shape)}")
        pad = key_padding_mask.view(bsz, 1, 1, src_len)
        mask = pad if mask is None else mask + pad
    dropout_p = m.dropout if m.training else 0.0
    sink = getattr(m, "_headlight_capture", None)  # headlight.torch.capture
    out, probs = _hl._attention(q, k, v, mask, dropout_p, is_causal, None, False,
                                need_weights or sink is not None)
    if sink is not None:
        sink.record(m, probs)
    out = out.permute(2, 0, 1, 3).reshape(tgt_len * bsz, embed_dim)
    out = F.linear(out, m.out_proj.weight, m.out_proj.bias).view(tgt_len, bsz, -1)
    weights = None
    if need_weights:
        weights = probs.to(q.dtype)  # (N, H, L, S): bf16 under autocast, as torch's
        if average_attn_weights:
            weights = weights.mean(dim=1)
    if not is_batched:
        out = out.squeeze(1)
        if weights is not None:
            weights = weights.squeeze(0)
    elif m.batch_first:
        out = out.transpose(0, 1)
    return out, weights

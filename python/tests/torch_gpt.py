"""The team's own PyTorch implementation of headlight's GPT architecture (docs/design.md §2 "Model
conventions"), written independently of the C++ code, and a minimal safetensors reader and writer.
The tests load the same weights into both and compare logits, loss, gradients and optimizer steps.
"""

import json
import math
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


# --- safetensors, written from the format's description ---------------------------------------

def write_safetensors(path, tensors, metadata=None):
    header, offset, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = metadata
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    metadata = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        assert info["dtype"] == "F32"
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + begin:8 + n + end], dtype=np.float32).reshape(
            info["shape"])
    return out, metadata


# --- the model ---------------------------------------------------------------------------------

def alibi_slopes(n):
    def power_of_two(m):
        return [2.0 ** (-8.0 * h / m) for h in range(1, m + 1)]
    m = 2 ** int(math.floor(math.log2(n)))
    slopes = power_of_two(m)
    if m < n:
        slopes += power_of_two(2 * m)[0::2][: n - m]
    return torch.tensor(slopes, dtype=torch.float64)


def rope(x, base):
    """x [B, heads, T, d]: rotate-half form, pairs (x[j], x[j + d/2]), angle p·base^(−2j/d)."""
    T, d = x.shape[-2], x.shape[-1]
    inv = base ** (-2.0 * torch.arange(d // 2, dtype=torch.float64) / d)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cos(angle), torch.sin(angle)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n, dtype=torch.float64))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


def make_norm(cfg):
    if cfg["norm"] == "rmsnorm":
        return RMSNorm(cfg["n_embd"])
    return nn.LayerNorm(cfg["n_embd"], eps=1e-5, bias=cfg["bias"], dtype=torch.float64)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        C, H, G = cfg["n_embd"], cfg["n_head"], cfg["n_kv_head"]
        hd = C // H
        self.c_attn = nn.Linear(C, (H + 2 * G) * hd, bias=cfg["bias"], dtype=torch.float64)
        self.c_proj = nn.Linear(H * hd, C, bias=cfg["bias"], dtype=torch.float64)

    def forward(self, x, gates):
        cfg = self.cfg
        B, T, C = x.shape
        H, G = cfg["n_head"], cfg["n_kv_head"]
        hd = C // H
        q, k, v = self.c_attn(x).split([H * hd, G * hd, G * hd], dim=-1)
        q = q.view(B, T, H, hd).transpose(1, 2)
        k = k.view(B, T, G, hd).transpose(1, 2)
        v = v.view(B, T, G, hd).transpose(1, 2)
        if cfg["positional"] == "rope":
            q, k = rope(q, cfg["rope_base"]), rope(k, cfg["rope_base"])
        k = k.repeat_interleave(H // G, dim=1)
        v = v.repeat_interleave(H // G, dim=1)
        s = q @ k.transpose(-1, -2) / math.sqrt(hd)
        i = torch.arange(T)[:, None]
        j = torch.arange(T)[None, :]
        if cfg["positional"] == "alibi":
            s = s - alibi_slopes(H)[:, None, None] * (i - j).abs().to(torch.float64)
        if cfg["causal"]:
            s = s.masked_fill(j > i, float("-inf"))
        p = torch.softmax(s, dim=-1)
        y = (p @ v) * gates[None, :, None, None]
        y = y.transpose(1, 2).reshape(B, T, H * hd)
        return self.c_proj(y), p


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, F_ = cfg["n_embd"], cfg["mlp_ratio"] * cfg["n_embd"]
        self.c_fc = nn.Linear(C, F_, bias=cfg["bias"], dtype=torch.float64)
        self.c_proj = nn.Linear(F_, C, bias=cfg["bias"], dtype=torch.float64)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.ln_1, self.ln_2 = make_norm(cfg), make_norm(cfg)
        self.attn, self.mlp = Attention(cfg), MLP(cfg)

    def forward(self, x, gates):
        if self.cfg["norm_first"]:
            a, p = self.attn(self.ln_1(x), gates)
            x = x + a
            return x + self.mlp(self.ln_2(x)), p
        a, p = self.attn(x, gates)
        x = self.ln_1(x + a)
        return self.ln_2(x + self.mlp(x)), p


class TorchGPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        C, V = cfg["n_embd"], cfg["vocab_size"]
        t = nn.ModuleDict(dict(wte=nn.Embedding(V, C, dtype=torch.float64),
                               h=nn.ModuleList([Block(cfg) for _ in range(cfg["n_layer"])])))
        if cfg["positional"] == "learned":
            t["wpe"] = nn.Embedding(cfg["block_size"], C, dtype=torch.float64)
        if cfg["norm_first"]:
            t["ln_f"] = make_norm(cfg)
        self.transformer = t
        if not cfg["tied_embeddings"]:
            self.lm_head = nn.Linear(C, V, bias=False, dtype=torch.float64)
        self.gates = torch.ones(cfg["n_layer"], cfg["n_head"], dtype=torch.float64,
                                requires_grad=True)

    def forward(self, idx, targets=None):
        cfg = self.cfg
        B, T = idx.shape
        x = self.transformer["wte"](idx)
        pos = torch.arange(T)
        if cfg["positional"] == "learned":
            x = x + self.transformer["wpe"](pos)
        elif cfg["positional"] == "sinusoidal":
            C = cfg["n_embd"]
            i = torch.arange(0, C, 2, dtype=torch.float64)
            angle = pos[:, None].to(torch.float64) / (10000.0 ** (i / C))[None, :]
            pe = torch.zeros(T, C, dtype=torch.float64)
            pe[:, 0::2], pe[:, 1::2] = torch.sin(angle), torch.cos(angle)
            x = x + pe
        probs = []
        for layer, block in enumerate(self.transformer["h"]):
            x, p = block(x, self.gates[layer])
            probs.append(p)
        if cfg["norm_first"]:
            x = self.transformer["ln_f"](x)
        w = self.transformer["wte"].weight if cfg["tied_embeddings"] else self.lm_head.weight
        logits = x @ w.T
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
        return logits, loss, probs

    def named_weights(self):
        """Parameters by checkpoint name (the tied lm_head appears once, as wte)."""
        return {name: p for name, p in self.named_parameters()}


def full_config(**overrides):
    cfg = dict(vocab_size=61, n_layer=2, n_head=4, n_kv_head=4, n_embd=32, block_size=24,
               positional="learned", norm="layernorm", norm_first=True, bias=True, causal=True,
               tied_embeddings=True, dropout=0.0, mlp_ratio=4, rope_base=10000.0)
    cfg.update(overrides)
    return cfg


def random_torch_model(cfg, seed):
    """A TorchGPT with random weights (norm weights and biases too, so that every path counts)."""
    torch.manual_seed(seed)
    model = TorchGPT(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or "ln_f" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.02 * torch.randn_like(p) * (5.0 if "bias" in name else 10.0))
            # Round to float32 so that both sides start from the same values.
            p.copy_(p.to(torch.float32).to(torch.float64))
    return model

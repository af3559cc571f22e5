"""A small causal transformer whose attention runs on headlight (headlight.torch.MultiheadAttention),
trained with torch.distributed's DistributedDataParallel, or in one process on the whole batch.

    torchrun --nproc_per_node 2 python/tests/ddp_train.py --out losses.json   # 2 ranks, gloo
    python python/tests/ddp_train.py --out losses.json                        # one process

Each rank takes its share of every step's batch; DDP averages the gradients, so the ranks' mean
loss and the weights follow the one-process run on the whole batch. Writes the per-step mean loss
(rank 0) and, from every rank, the shape of what headlight.torch.capture recorded in the last step.
"""

import argparse
import faulthandler
import gc
import json
import os
import sys

import torch
import torch.distributed as dist

import headlight.torch as ht

VOCAB, WIDTH, HEADS, LAYERS, SEQ, BATCH = 61, 32, 4, 2, 24, 8


class Block(torch.nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(WIDTH)
        self.attn = attention(WIDTH, HEADS, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(WIDTH)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.GELU(),
                                       torch.nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False, is_causal=True)[0]
        return x + self.mlp(self.ln2(x))


class TinyLM(torch.nn.Module):
    """attention: headlight.torch.MultiheadAttention, or torch's own to compare with."""

    def __init__(self, attention=ht.MultiheadAttention):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, WIDTH)
        self.pos = torch.nn.Parameter(torch.randn(SEQ, WIDTH) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(attention) for _ in range(LAYERS))
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, ids):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        x = self.emb(ids) + self.pos[: ids.shape[1]]
        for b in self.blocks:
            x = b(x, mask)
        return self.head(x)


def batches(steps):
    g = torch.Generator().manual_seed(123)
    # A learnable stream: each token is the previous plus a small step, mod VOCAB.
    for _ in range(steps):
        start = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
        stride = torch.randint(1, 4, (BATCH, 1), generator=g)
        yield (start + stride * torch.arange(SEQ + 1)) % VOCAB


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    faulthandler.enable(all_threads=True)  # a crash prints every thread's Python stack
    torch.set_num_threads(1)
    distributed = "RANK" in os.environ
    rank, world = 0, 1
    if distributed:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every rank and in the one-process run
    model = TinyLM()
    net = torch.nn.parallel.DistributedDataParallel(model) if distributed else model
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    share = BATCH // world
    losses = []
    for step, data in enumerate(batches(args.steps)):
        data = data[rank * share:(rank + 1) * share]
        ids, targets = data[:, :-1], data[:, 1:]
        opt.zero_grad()
        last = step == args.steps - 1
        with ht.capture(model) as heads:  # every step: capture must not disturb training
            logits = net(ids)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        if distributed:
            dist.all_reduce(mean)
            mean /= world
        losses.append(mean.item())
        if last:
            captured = {name: list(heads[name].shape) for name in heads.layers}
            rows = heads[heads.layers[0]].sum(-1)
            rows_sum_to_one = bool(torch.allclose(rows, torch.ones_like(rows), atol=1e-5))
    result = {"rank": rank, "world": world, "captured": captured,
              "rows_sum_to_one": rows_sum_to_one}
    if rank == 0:
        result["losses"] = losses
    with open(f"{args.out}.{rank}", "w") as f:
        json.dump(result, f)
    if distributed:
        # DDP's reducer and any work it holds are released while the interpreter is whole (gloo's
        # threads releasing tensors during interpreter shutdown can abort the process).
        del net, opt
        gc.collect()
        dist.destroy_process_group()
    print(f"rank {rank}: results written, process group destroyed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

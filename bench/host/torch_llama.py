"""The example model (examples/tiny_llama.plan) trained with PyTorch eager on the CPU, for
bench/host/run: the same dimensions (12 layers, hidden 256, 8 query heads, 4 KV heads, FFN 768,
byte vocabulary of 259, sequences of 64), the same batch (16 sequences = 1,024 tokens per step),
AdamW with the plan's settings and gradient clipping at 1.0, fp32, on the bundled text.

    python torch_llama.py CORPUS STEPS THREADS   -> prints one JSON line
"""
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, SEQ, BATCH = 12, 256, 8, 4, 768, 259, 64, 16
HEAD_DIM = HIDDEN // HEADS


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(seq, dim, theta=10000.0):
    freqs = theta ** (-torch.arange(0, dim // 2, dtype=torch.float64) * 2 / dim)
    angles = torch.arange(seq, dtype=torch.float64)[:, None] * freqs[None, :]
    return angles.cos().float(), angles.sin().float()


def rope(x, cos, sin):  # x: [B, H, S, D], half-split pairs (i, i + D/2)
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm = RMSNorm(HIDDEN)
        self.qkv = torch.nn.Linear(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM, bias=False)
        self.out = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.ffn_norm = RMSNorm(HIDDEN)
        self.gate_up = torch.nn.Linear(HIDDEN, 2 * FFN, bias=False)
        self.down = torch.nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(
            [HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
        q = rope(q.view(b, s, HEADS, HEAD_DIM).transpose(1, 2), cos, sin)
        k = rope(k.view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2), cos, sin)
        v = v.view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2)
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, HIDDEN))
        gate, up = self.gate_up(self.ffn_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = RMSNorm(HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
        cos, sin = rope_tables(SEQ, HEAD_DIM)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        return self.head(self.norm(x))


def main():
    corpus, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    data = torch.tensor(list(open(corpus, "rb").read()), dtype=torch.long)
    model = Model()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    gen = torch.Generator().manual_seed(1)
    times, cpu, losses = [], [], []
    for step in range(steps):
        starts = torch.randint(0, len(data) - SEQ - 1, (BATCH,), generator=gen)
        batch = torch.stack([data[s:s + SEQ + 1] for s in starts.tolist()])
        t0, c0 = time.perf_counter(), time.process_time()
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        losses.append(loss.item())
    measured = times[1:] or times  # the first step warms up allocators and kernels
    step_s = sum(measured) / len(measured)
    cpu_s = sum(cpu[1:] or cpu) / len(measured)
    print(json.dumps({"torch": torch.__version__, "threads": threads, "params": params,
                      "steps": steps, "step_seconds": step_s, "cpu_seconds": cpu_s,
                      "tokens_per_second": BATCH * SEQ / step_s,
                      "loss_first": losses[0], "loss_last": losses[-1],
                      "isa": torch.backends.cpu.get_cpu_capability()}))


if __name__ == "__main__":
    main()

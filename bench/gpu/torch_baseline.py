#!/usr/bin/env python3
"""PyTorch baselines for bench/gpu: a Llama-style decoder (RMSNorm, RoPE, GQA-capable causal
attention via SDPA, SwiGLU, untied head), bf16 autocast with fp32 master weights, AdamW, on one
GPU. Prints one JSON line per configuration: tokens/s, MFU and peak memory, eager and
torch.compile, measured in the same process on the same data.

MFU uses the same FLOP count as planc's time model: 6·N (N = all parameters) + 6·L·T·H
(causal attention, forward and backward) per token, against the GPU's dense bf16 peak.
"""
import argparse, json, math, time

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = {
    # name: (layers, hidden, heads, kv_heads, ffn_hidden, vocab)
    "llama-125m": (12, 768, 12, 12, 2048, 32000),
    "llama-350m": (24, 1024, 16, 16, 2816, 32000),
}
PEAK_BF16 = {"H100": 989e12, "H200": 989e12}


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype) * self.w


def rope(x, cos, sin):  # x: [B, H, T, D], half-split pairs as Llama
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, d, heads, kv_heads, ffn):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.kv = nn.Linear(d, 2 * kv_heads * self.hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.gate = nn.Linear(d, ffn, bias=False)
        self.up = nn.Linear(d, ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, D = x.shape
        h = self.n1(x)
        q = self.q(h).view(B, T, self.heads, self.hd).transpose(1, 2)
        k, v = self.kv(h).view(B, T, 2, self.kv_heads, self.hd).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.kv_heads != self.heads)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, D))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, layers, d, heads, kv_heads, ffn, vocab, seq):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        hd = d // heads
        inv = 10000.0 ** (-torch.arange(0, hd // 2, dtype=torch.float64) * 2 / hd)
        ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)

    def forward(self, tokens, targets):
        x = self.emb(tokens)
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        for b in self.blocks:
            x = b(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def run(name, seq, batch, steps, warmup, compiled, gpu):
    layers, d, heads, kv, ffn, vocab = MODELS[name]
    torch.manual_seed(1234)
    model = Llama(layers, d, heads, kv, ffn, vocab, seq).cuda()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    step_fn = model
    if compiled:
        step_fn = torch.compile(model)
    g = torch.Generator(device="cuda").manual_seed(0)
    data = torch.randint(0, vocab, (steps + warmup, batch, seq + 1), device="cuda", generator=g)
    torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for i in range(steps + warmup):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(data[i, :, :-1], data[i, :, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
    step = sorted(times)[len(times) // 2]  # median step
    tokens = batch * seq
    flops_per_token = 6 * params + 6 * layers * seq * d
    peak = PEAK_BF16.get(gpu, 989e12)
    return {
        "version": 1, "system": "pytorch-compile" if compiled else "pytorch-eager",
        "model": name, "params": params, "seq": seq, "micro_batch": batch, "gpu": gpu,
        "step_seconds": step, "tokens_per_second": tokens / step,
        "mfu": tokens / step * flops_per_token / peak,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(),
        "final_loss": losses[-1],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(MODELS), action="append")
    ap.add_argument("--seq", type=int, action="append")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--gpu", default="H100", choices=sorted(PEAK_BF16))
    ap.add_argument("--systems", default="eager,compile",
                    help="comma-separated: eager, compile (torch.compile)")
    a = ap.parse_args()
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    if not systems or any(s not in ("eager", "compile") for s in systems):
        ap.error("--systems takes eager and/or compile")
    for name in a.model or sorted(MODELS):
        for seq in a.seq or [1024, 2048]:
            for compiled in [s == "compile" for s in systems]:
                print(json.dumps(run(name, seq, a.batch, a.steps, a.warmup, compiled, a.gpu)), flush=True)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

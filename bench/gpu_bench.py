"""PyTorch's side of the GPU benchmark: the ~1B Llama of bench/GPU_BENCH.md trained in plain torch
(no transformers), bf16 autocast over fp32 master weights, fused AdamW, causal SDPA attention;
eager and torch.compile in the same run. Prints one JSON line per mode, like fabrica_gpu_bench:
tokens/s, model TFLOP/s, MFU against 989 TFLOP/s (H100/H200 dense bf16), peak memory.

    python3 bench/gpu_bench.py [--layers 16] [--batch 4] [--seq 2048] [--steps 6] [--modes eager,compile]
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

PEAK_TFLOPS = 989.0


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):  # fp32 statistics, as Hugging Face's LlamaRMSNorm
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        d, hd = c.hidden, c.head_dim
        self.input_layernorm = RMSNorm(d)
        self.qkv = nn.Linear(d, (c.heads + 2 * c.kv_heads) * hd, bias=False)
        self.o_proj = nn.Linear(c.heads * hd, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d)
        self.gate_up = nn.Linear(d, 2 * c.intermediate, bias=False)
        self.down = nn.Linear(c.intermediate, d, bias=False)

    def forward(self, x, cos, sin):
        c = self.c
        b, t, _ = x.shape
        q, k, v = self.qkv(self.input_layernorm(x)).split(
            [c.heads * c.head_dim, c.kv_heads * c.head_dim, c.kv_heads * c.head_dim], dim=-1)
        q = q.view(b, t, c.heads, c.head_dim).transpose(1, 2)
        k = k.view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        v = v.view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, -1))
        g, u = self.gate_up(self.post_attention_layernorm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.hidden)
        self.lm_head = nn.Linear(c.hidden, c.vocab, bias=False)
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim))
        ang = torch.outer(torch.arange(c.seq).float(), inv_freq)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids, labels):
        x = self.embed(ids)
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x)).float()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def run(c, mode, steps, device):
    torch.manual_seed(0)
    model = Llama(c).to(device)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device == "cuda")
    step_fn = model if mode == "eager" else torch.compile(model)
    ids = torch.randint(0, c.vocab, (c.batch, c.seq), device=device)
    labels = torch.cat([ids[:, 1:], torch.full((c.batch, 1), -100, device=device)], dim=1)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    timed, loss = 0.0, float("nan")
    for t in range(steps):
        sync(device)
        start = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16):
            out = step_fn(ids, labels)
        out.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        s = time.perf_counter() - start
        loss = out.item()
        print(f"{mode} step {t + 1}: loss {loss:.4f}, {s:.3f} s", flush=True)
        if t >= (1 if mode == "eager" else 2):  # warm-up: eager 1 step, compile 2 (compilation)
            timed += s
    counted = steps - (1 if mode == "eager" else 2)
    tok_s = c.batch * c.seq * counted / timed
    flops_per_token = 6 * (params - c.vocab * c.hidden) + 6 * c.layers * c.seq * c.heads * c.head_dim
    tflops = tok_s * flops_per_token / 1e12
    return {"impl": f"pytorch-{mode}", "torch": torch.__version__, "precision": "bf16-autocast",
            "layers": c.layers, "batch": c.batch, "seq": c.seq, "params": params,
            "tokens_per_s": round(tok_s, 1), "model_tflops": round(tflops, 2), "mfu": round(tflops / PEAK_TFLOPS, 4),
            "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None,
            "final_loss": round(loss, 4)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke check of this script on a tiny shape")
    ap.add_argument("--hidden", type=int, default=2048)
    a = ap.parse_args()
    scale = a.hidden / 2048  # --hidden shrinks the whole model for smoke checks
    c = argparse.Namespace(vocab=32000, hidden=a.hidden, heads=max(4, int(32 * scale)), kv_heads=max(2, int(8 * scale)),
                           head_dim=64, intermediate=int(5632 * scale) // 64 * 64, layers=a.layers, batch=a.batch,
                           seq=a.seq)
    c.head_dim = c.hidden // c.heads
    torch.backends.cuda.matmul.allow_tf32 = True
    for mode in a.modes.split(","):
        try:
            print(json.dumps(run(c, mode, a.steps, a.device)), flush=True)
        except Exception as e:  # report and go on to the next mode
            print(json.dumps({"impl": f"pytorch-{mode}", "error": repr(e)[:500]}), flush=True)
        if a.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

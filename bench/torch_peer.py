#!/usr/bin/env python3
"""PyTorch peer for `make bench`: the standard Fabrica bench model, written the
way an ordinary PyTorch user would write it (eager mode, no torch.compile).

Llama-style decoder: hidden 256, 4 layers, 4 heads (head_dim 64), 4 kv heads,
intermediate 704, vocab 8192, sequence 256, batch 8, untied embeddings,
RMSNorm with fp32 statistics, RoPE (HF rotate_half, theta 10000), SwiGLU MLP,
F.scaled_dot_product_attention(is_causal=True), cross-entropy loss,
torch.optim.AdamW(lr 3e-4, weight_decay 0.1), clip_grad_norm_(1.0).

--precision bf16 wraps forward+loss in torch.autocast("cpu", torch.bfloat16);
weights, gradients and optimizer state stay fp32.

--ddp (under torchrun): DistributedDataParallel over gloo, the batch of 8 split
among the ranks; rank 0 prints the JSON line with the tokens/s of all ranks.

Prints exactly one JSON line on stdout:
  {"impl":"pytorch","torch":...,"precision":...,"threads":...,
   "tokens_per_s":...,"step_ms":...,"peak_rss_mb":...,"final_loss":...,
   "import_rss_mb":...}
peak_rss_mb is ru_maxrss/1024 of the whole process; import_rss_mb is the same
measure taken right after `import torch`.
"""
import argparse
import json
import math
import resource
import sys
import time
import warnings

# The PyPI wheel warns on import when NumPy is absent; the bench does not need it.
warnings.filterwarnings("ignore", message=".*Failed to initialize NumPy.*")

import torch
import torch.nn as nn
import torch.nn.functional as F

# RSS right after `import torch` (the PyPI wheel maps its CUDA libraries even on
# CPU); reported so the peak can be read against what the import alone costs.
IMPORT_RSS_MB = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

# Standard bench model.
VOCAB = 8192
HIDDEN = 256
LAYERS = 4
HEADS = 4
KV_HEADS = 4
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 704
SEQ = 256
BATCH = 8
ROPE_THETA = 10000.0
RMS_EPS = 1e-5
LR = 3e-4
WEIGHT_DECAY = 0.1
CLIP = 1.0
INIT_STD = 0.02


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=RMS_EPS):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(q, k, cos, sin):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim, max_len, theta=ROPE_THETA):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
        freqs = torch.outer(torch.arange(max_len).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, seq_len):
        return self.cos[:seq_len], self.sin[:seq_len]


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, HEADS, HEAD_DIM).transpose(1, 2)
        k = self.k_proj(x).view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = self.v_proj(x).view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
        q, k = apply_rope(q, k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, t, HEADS * HEAD_DIM)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.up_proj = nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.down_proj = nn.Linear(INTERMEDIATE, HIDDEN, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = RMSNorm(HIDDEN)
        self.self_attn = Attention()
        self.post_attention_layernorm = RMSNorm(HIDDEN)
        self.mlp = MLP()

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = RMSNorm(HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)  # untied
        self.rope = RotaryEmbedding(HEAD_DIM, SEQ)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=INIT_STD)

    def forward(self, idx):
        cos, sin = self.rope(idx.shape[1])
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def time_steps(step, warmup, total, who):
    """Runs step(i) for i < total, timing those from `warmup` on: (last loss, seconds), or None
    (after saying so) when the last loss is not finite."""
    for i in range(warmup):
        step(i)
    loss = float("nan")
    t0 = time.perf_counter()
    for i in range(warmup, total):
        loss = step(i)
    elapsed = time.perf_counter() - t0
    if not math.isfinite(loss):
        print(f"{who}: non-finite loss {loss}", file=sys.stderr)
        return None
    return loss, elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ddp", action="store_true", help="DistributedDataParallel (gloo) under torchrun")
    ap.add_argument("--lora", action="store_true",
                    help="PEFT LoRA r 8, alpha 16 on every projection; base frozen (bf16 base with --precision bf16, "
                         "adapters fp32, as LLaMA-Factory sets it up)")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        ap.error("need --steps >= 1, --warmup >= 0, --threads >= 1")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    model = Llama()
    if args.lora:
        from peft import LoraConfig, get_peft_model
        if args.precision == "bf16":
            model = model.to(torch.bfloat16)
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
        for p in model.parameters():
            if p.requires_grad:
                p.data = p.data.float()
    model.train()
    rank, world = 0, 1
    if args.ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        model = torch.nn.parallel.DistributedDataParallel(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=LR, weight_decay=WEIGHT_DECAY)

    # Random token data, fixed seed, one fresh batch per step (generated up front); under DDP each
    # rank takes its slice of the batch.
    gen = torch.Generator().manual_seed(args.seed + 1)
    total = args.warmup + args.steps
    data = torch.randint(0, VOCAB, (total, BATCH, SEQ + 1), generator=gen)
    per_rank = BATCH // world
    data = data[:, rank * per_rank:(rank + 1) * per_rank].contiguous()

    use_bf16 = args.precision == "bf16"

    def step(i):
        x, y = data[i, :, :-1], data[i, :, 1:]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, CLIP)
        opt.step()
        return loss.item()

    timed = time_steps(step, args.warmup, total, "torch_peer")
    if timed is None:
        return 1
    loss, elapsed = timed

    tokens = BATCH * SEQ * args.steps
    if args.ddp:
        torch.distributed.destroy_process_group()
        if rank != 0:
            return 0
    print(json.dumps({
        "impl": "pytorch",
        "torch": torch.__version__,
        "precision": args.precision + ("+lora" if args.lora else ""),
        "threads": torch.get_num_threads(),
        "tokens_per_s": round(tokens / elapsed, 1),
        "step_ms": round(elapsed * 1000.0 / args.steps, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
        "final_loss": round(loss, 5),
        "import_rss_mb": round(IMPORT_RSS_MB, 1),
        "ranks": world,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())

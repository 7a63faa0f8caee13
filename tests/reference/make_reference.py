#!/usr/bin/env python3
"""Write the PyTorch reference fixtures that Fabrica's C++ tests compare against.

Usage:  /usr/bin/python3 tests/reference/make_reference.py OUT_DIR

Only needs torch (Debian's python3-torch is enough) and numpy. Everything is
computed in float32 on the CPU with fixed seeds, so the output is deterministic.
The model below is a plain-torch re-implementation of Hugging Face transformers'
LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM (eager attention path)
and uses exactly the same parameter names. See README.md in this folder.
"""

import json
import math
import os
import sys
import time
from functools import partial

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import save_file  # noqa: E402

IGNORE_INDEX = -100

# --------------------------------------------------------------------------------------
# Model configurations (written out as HF-style config.json)
# --------------------------------------------------------------------------------------

_COMMON = {
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 128,
    "torch_dtype": "float32",
    "use_cache": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "rope_scaling": None,
}

CONFIGS = {
    "llama": dict(
        _COMMON,
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        vocab_size=256,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        pretraining_tp=1,
    ),
    "qwen2": dict(
        _COMMON,
        model_type="qwen2",
        architectures=["Qwen2ForCausalLM"],
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        attention_bias=True,  # informational: Qwen2 always has q/k/v biases
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=2,
    ),
    "qwen3": dict(
        _COMMON,
        model_type="qwen3",
        architectures=["Qwen3ForCausalLM"],
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        attention_bias=False,
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=2,
    ),
}

# Training hyper-parameters for the 10-step trajectory.
TRAIN = {
    "lr": 3e-3,
    "weight_decay": 0.1,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-8,
    "max_grad_norm": 1.0,  # per-config override below (chosen so clipping triggers)
    "warmup_steps": 3,
    "total_steps": 10,
    "scheduler": "cosine",
    "num_cycles": 0.5,
    "grad_accum_steps": 2,
    "micro_batch_size": 2,
    "seq_len": 16,
}
# max_grad_norm per config: pre-clip norms of this tiny model at this init are ~2-3.3, so
# the default 1.0 would clip every step. These values make clip_grad_norm_ scale the
# gradients on some steps but not on others, with every pre-clip norm at least
# CLIP_MARGIN (relative) away from the threshold (asserted below).
MAX_GRAD_NORM = {"llama": 2.45, "qwen2": 2.48, "qwen3": 2.75}
CLIP_MARGIN = 0.005


def head_dim_of(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def has_qkv_bias(cfg):
    return cfg["model_type"] == "qwen2" or bool(cfg.get("attention_bias", False))


# --------------------------------------------------------------------------------------
# Building blocks, faithful to transformers' modeling_llama / qwen2 / qwen3
# --------------------------------------------------------------------------------------

def rms_norm(x, weight, eps):
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


def rope_cos_sin(seq_len, head_dim, cfg):
    """cos/sin of shape (T, head_dim): HF default rope, or the frequencies and attention scaling
    transformers computed for a scaled-RoPE config (cfg["_rope"], from rope_transformers.json)."""
    if "_rope" in cfg:
        inv_freq, scaling = torch.tensor(cfg["_rope"]["inv_freq"], dtype=torch.float32), cfg["_rope"]["scaling"]
    else:
        theta = cfg["rope_theta"]
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        scaling = 1.0
    pos = torch.arange(seq_len, dtype=torch.int64).float()
    freqs = (inv_freq[:, None] @ pos[None, :]).transpose(0, 1)  # (T, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * scaling, emb.sin() * scaling


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope_bhtd(x, cos, sin):
    """x: (B, H, T, D); cos/sin: (T, D)."""
    cos = cos[None, None]
    sin = sin[None, None]
    return (x * cos) + (rotate_half(x) * sin)


def repeat_kv(x, n_rep):
    """(B, KVH, T, D) -> (B, KVH*n_rep, T, D); query head h uses kv head h // n_rep."""
    b, kvh, t, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, kvh, n_rep, t, d).reshape(b, kvh * n_rep, t, d)


def causal_attention_bhtd(q, k, v, scale):
    """Eager attention as in HF: q (B,H,T,D), k/v (B,KVH,T,D) -> (B,H,T,D)."""
    n_rep = q.shape[1] // k.shape[1]
    k = repeat_kv(k, n_rep)
    v = repeat_kv(v, n_rep)
    t = q.shape[2]
    attn = torch.matmul(q, k.transpose(2, 3)) * scale
    mask = torch.full((t, t), torch.finfo(attn.dtype).min, dtype=attn.dtype).triu(1)
    attn = attn + mask[None, None]
    attn = F.softmax(attn, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(attn, v)


def document_attention_bhtd(q, k, v, scale, doc_start):
    """Eager attention with LLaMA-Factory's neat-packing mask (prepare_4d_attention_mask): query t
    sees key s iff s <= t and both lie in one document; doc_start (B, T) is each token's first."""
    n_rep = q.shape[1] // k.shape[1]
    k = repeat_kv(k, n_rep)
    v = repeat_kv(v, n_rep)
    t = q.shape[2]
    pos = torch.arange(t)
    allowed = (pos[None, None, :] <= pos[None, :, None]) & (doc_start[:, None, :] == doc_start[:, :, None])
    attn = torch.matmul(q, k.transpose(2, 3)) * scale
    attn = attn.masked_fill(~allowed[:, None], torch.finfo(attn.dtype).min)
    attn = F.softmax(attn, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(attn, v)


def linear(x, w, b=None):
    return F.linear(x, w, b)


def param_names(cfg):
    """Parameter names in HF's named_parameters() order."""
    names = ["model.embed_tokens.weight"]
    bias = has_qkv_bias(cfg)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj"):
            names.append(p + f"self_attn.{proj}.weight")
            if bias:
                names.append(p + f"self_attn.{proj}.bias")
        names.append(p + "self_attn.o_proj.weight")
        if cfg["model_type"] == "qwen3":
            names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        names += [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight"]
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    names.append("model.norm.weight")
    if not cfg["tie_word_embeddings"]:
        names.append("lm_head.weight")
    return names


def param_shape(cfg, name):
    h, it, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = head_dim_of(cfg)
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    leaf = name.split(".")[-2] if name.endswith((".weight", ".bias")) else name
    is_bias = name.endswith(".bias")
    table = {
        "embed_tokens": (v, h),
        "lm_head": (v, h),
        "q_proj": (nq * hd,) if is_bias else (nq * hd, h),
        "k_proj": (nkv * hd,) if is_bias else (nkv * hd, h),
        "v_proj": (nkv * hd,) if is_bias else (nkv * hd, h),
        "o_proj": (h, nq * hd),
        "q_norm": (hd,),
        "k_norm": (hd,),
        "gate_proj": (it, h),
        "up_proj": (it, h),
        "down_proj": (h, it),
        "input_layernorm": (h,),
        "post_attention_layernorm": (h,),
        "norm": (h,),
    }
    return table[leaf]


def init_params(cfg, seed):
    """HF-like init: Linear/Embedding weights ~ N(0, 0.02); biases ~ N(0, 0.02) (instead of 0);
    norm weights = 1 + 0.1 * N(0, 1) (instead of 1), so the tests exercise them."""
    g = torch.Generator().manual_seed(seed)
    std = cfg["initializer_range"]
    params = {}
    for name in param_names(cfg):
        shape = param_shape(cfg, name)
        if "norm" in name:
            t = 1.0 + 0.1 * torch.randn(shape, generator=g, dtype=torch.float32)
        else:
            t = torch.randn(shape, generator=g, dtype=torch.float32) * std
        params[name] = t.contiguous()
    return params


def forward(cfg, params, input_ids):
    """Returns logits (B, T, V) in float32."""
    b, t = input_ids.shape
    hd = head_dim_of(cfg)
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    eps = cfg["rms_norm_eps"]
    scale = hd ** -0.5
    cos, sin = rope_cos_sin(t, hd, cfg)
    x = F.embedding(input_ids, params["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        residual = x
        h = rms_norm(x, params[p + "input_layernorm.weight"], eps)
        q = linear(h, params[p + "self_attn.q_proj.weight"], params.get(p + "self_attn.q_proj.bias"))
        k = linear(h, params[p + "self_attn.k_proj.weight"], params.get(p + "self_attn.k_proj.bias"))
        v = linear(h, params[p + "self_attn.v_proj.weight"], params.get(p + "self_attn.v_proj.bias"))
        q = q.view(b, t, nq, hd)
        k = k.view(b, t, nkv, hd)
        v = v.view(b, t, nkv, hd)
        if cfg["model_type"] == "qwen3":  # per-head RMSNorm before RoPE
            q = rms_norm(q, params[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, params[p + "self_attn.k_norm.weight"], eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = apply_rope_bhtd(q, cos, sin)
        k = apply_rope_bhtd(k, cos, sin)
        o = causal_attention_bhtd(q, k, v, scale)  # (B, H, T, D)
        o = o.transpose(1, 2).reshape(b, t, nq * hd)
        x = residual + linear(o, params[p + "self_attn.o_proj.weight"])
        residual = x
        h = rms_norm(x, params[p + "post_attention_layernorm.weight"], eps)
        gate = linear(h, params[p + "mlp.gate_proj.weight"])
        up = linear(h, params[p + "mlp.up_proj.weight"])
        x = residual + linear(F.silu(gate) * up, params[p + "mlp.down_proj.weight"])
    x = rms_norm(x, params["model.norm.weight"], eps)
    lm_w = params["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else params["lm_head.weight"]
    return linear(x, lm_w).float()


def token_loss_sum(logits, labels):
    """Sum of next-token cross-entropy over non-ignored targets (HF shift: logits[:, :-1] vs labels[:, 1:])."""
    v = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1, :].float().reshape(-1, v), labels[:, 1:].reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum")


def num_targets(labels):
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


# --------------------------------------------------------------------------------------
# LR schedules, transcribed from transformers/optimization.py
# --------------------------------------------------------------------------------------

def _lambda_linear(step, *, num_warmup_steps, num_training_steps):
    if step < num_warmup_steps:
        return float(step) / float(max(1, num_warmup_steps))
    return max(0.0, float(num_training_steps - step) / float(max(1, num_training_steps - num_warmup_steps)))


def _lambda_cosine(step, *, num_warmup_steps, num_training_steps, num_cycles=0.5, min_lr_rate=0.0):
    if step < num_warmup_steps:
        return float(step) / float(max(1, num_warmup_steps))
    progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    factor = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
    factor = factor * (1 - min_lr_rate) + min_lr_rate
    return max(0.0, factor)


def _lambda_cosine_restarts(step, *, num_warmup_steps, num_training_steps, num_cycles=1):
    if step < num_warmup_steps:
        return float(step) / float(max(1, num_warmup_steps))
    progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    if progress >= 1.0:
        return 0.0
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((float(num_cycles) * progress) % 1.0))))


def _lambda_polynomial(step, *, num_warmup_steps, num_training_steps, lr_end, power, lr_init):
    if step < num_warmup_steps:
        return float(step) / float(max(1, num_warmup_steps))
    if step > num_training_steps:
        return lr_end / lr_init
    lr_range = lr_init - lr_end
    decay_steps = num_training_steps - num_warmup_steps
    pct_remaining = 1 - (step - num_warmup_steps) / decay_steps
    decay = lr_range * pct_remaining ** power + lr_end
    return decay / lr_init


def _lambda_constant(step):
    return 1.0


def _lambda_constant_warmup(step, *, num_warmup_steps):
    if step < num_warmup_steps:
        return float(step) / float(max(1.0, num_warmup_steps))
    return 1.0


def _lambda_inverse_sqrt(step, *, num_warmup_steps, timescale):
    if step < num_warmup_steps:
        return float(step) / float(max(1, num_warmup_steps))
    shift = timescale - num_warmup_steps
    return 1.0 / math.sqrt((step + shift) / timescale)


def _lambda_wsd(step, *, num_warmup_steps, num_stable_steps, num_decay_steps, warmup_type, decay_type,
                min_lr_ratio, num_cycles):
    if step < num_warmup_steps:
        progress = float(step) / float(max(1, num_warmup_steps))
        if warmup_type == "linear":
            factor = progress
        elif warmup_type == "cosine":
            factor = 0.5 * (1.0 - math.cos(math.pi * progress))
        else:  # "1-sqrt"
            factor = 1.0 - math.sqrt(1.0 - progress)
        factor = factor * (1.0 - min_lr_ratio) + min_lr_ratio
        return max(0.0, factor)
    if step < num_warmup_steps + num_stable_steps:
        return 1.0
    if step < num_warmup_steps + num_stable_steps + num_decay_steps:
        progress = float(step - num_warmup_steps - num_stable_steps) / float(max(1, num_decay_steps))
        if decay_type == "linear":
            factor = 1.0 - progress
        elif decay_type == "cosine":
            factor = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
        else:  # "1-sqrt"
            factor = 1.0 - math.sqrt(progress)
        factor = factor * (1.0 - min_lr_ratio) + min_lr_ratio
        return max(0.0, factor)
    return min_lr_ratio


def schedule_lambdas(num_warmup_steps, num_training_steps, base_lr):
    """name -> (params dict as given to transformers, lambda(step))."""
    w, n = num_warmup_steps, num_training_steps
    return {
        "linear": ({}, partial(_lambda_linear, num_warmup_steps=w, num_training_steps=n)),
        "cosine": ({"num_cycles": 0.5},
                   partial(_lambda_cosine, num_warmup_steps=w, num_training_steps=n, num_cycles=0.5)),
        "cosine_with_restarts": ({"num_cycles": 2},
                                 partial(_lambda_cosine_restarts, num_warmup_steps=w, num_training_steps=n,
                                         num_cycles=2)),
        "polynomial": ({"power": 1.0, "lr_end": 1e-7},
                       partial(_lambda_polynomial, num_warmup_steps=w, num_training_steps=n, lr_end=1e-7,
                               power=1.0, lr_init=base_lr)),
        "constant": ({}, _lambda_constant),
        # transformers' get_scheduler passes only num_warmup_steps; timescale defaults to
        # num_warmup_steps or 10000 when num_warmup_steps == 0.
        "constant_with_warmup": ({}, partial(_lambda_constant_warmup, num_warmup_steps=w)),
        "inverse_sqrt": ({"timescale": w or 10000},
                         partial(_lambda_inverse_sqrt, num_warmup_steps=w, timescale=w or 10000)),
        "cosine_with_min_lr": ({"num_cycles": 0.5, "min_lr_rate": 0.1},
                               partial(_lambda_cosine, num_warmup_steps=w, num_training_steps=n, num_cycles=0.5,
                                       min_lr_rate=0.1)),
        # num_stable_steps given explicitly -> transformers uses it (warns) and ignores
        # num_training_steps; steps >= warmup+stable+decay = 11 return min_lr_ratio.
        "warmup_stable_decay": ({"num_decay_steps": 4, "num_stable_steps": 3, "min_lr_ratio": 0.0,
                                 "warmup_type": "linear", "decay_type": "cosine", "num_cycles": 0.5},
                                partial(_lambda_wsd, num_warmup_steps=w, num_stable_steps=3, num_decay_steps=4,
                                        warmup_type="linear", decay_type="cosine", min_lr_ratio=0.0,
                                        num_cycles=0.5)),
    }


def write_schedules(out_dir):
    w, n, base_lr = 4, 20, 1e-3
    out = {"num_warmup_steps": w, "num_training_steps": n, "base_lr": base_lr,
           "note": "multipliers[k] = lr_lambda(k) = lr used by optimizer step k (0-based) / base_lr; "
                   "lrs[k] = base_lr * multipliers[k] (what torch LambdaLR sets)",
           "schedules": {}}
    for name, (params, fn) in schedule_lambdas(w, n, base_lr).items():
        mult = [float(fn(s)) for s in range(n)]
        # Cross-check against torch's LambdaLR driving a real optimizer.
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=base_lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, fn)
        lrs = []
        for _ in range(n):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        for m, lr in zip(mult, lrs):
            assert abs(base_lr * m - lr) <= 1e-18, (name, m, lr)
        out["schedules"][name] = {"params": params, "multipliers": mult, "lrs": lrs}
    with open(os.path.join(out_dir, "schedules.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    return out


# --------------------------------------------------------------------------------------
# Per-model fixtures
# --------------------------------------------------------------------------------------

def make_batch0(cfg, g):
    ids = torch.randint(0, cfg["vocab_size"], (2, 16), generator=g, dtype=torch.int64)
    labels = ids.clone()
    labels[0, :5] = IGNORE_INDEX
    labels[1, :3] = IGNORE_INDEX
    return ids, labels


def make_train_data(cfg, g, steps, accum, bsz, t):
    ids = torch.randint(0, cfg["vocab_size"], (steps, accum, bsz, t), generator=g, dtype=torch.int64)
    labels = ids.clone()
    for s in range(steps):
        for m in range(accum):
            for r in range(bsz):
                # Prompt mask: micro-batch 0 gets short prompts, micro-batch 1 long ones, so the
                # per-micro-batch target counts always differ.
                lo, hi = (1, 5) if m == 0 else (6, 11)
                prompt = int(torch.randint(lo, hi, (1,), generator=g))
                pad = int(torch.randint(0, 4, (1,), generator=g))  # right padding, labels -100
                labels[s, m, r, :prompt] = IGNORE_INDEX
                if pad:
                    labels[s, m, r, t - pad:] = IGNORE_INDEX
    # One fully-masked row (zero targets) to exercise that edge case.
    labels[5, 1, 0, :] = IGNORE_INDEX
    for s in range(steps):
        assert num_targets(labels[s, 0]) != num_targets(labels[s, 1])
    return ids, labels


def cosine_lambda(step, warmup, total, num_cycles=0.5):
    return _lambda_cosine(step, num_warmup_steps=warmup, num_training_steps=total, num_cycles=num_cycles)


def make_model_fixtures(name, cfg, seed, out_dir):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    names = param_names(cfg)
    init = init_params(cfg, seed)
    save_file(init, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})

    g = torch.Generator().manual_seed(seed + 1000)
    ids0, labels0 = make_batch0(cfg, g)

    # --- single micro-batch forward / backward ---
    params = {n: init[n].clone().requires_grad_(True) for n in names}
    logits = forward(cfg, params, ids0)
    loss = token_loss_sum(logits, labels0) / num_targets(labels0)
    loss.backward()
    ref = {
        "input_ids": ids0,
        "labels": labels0,
        "logits": logits.detach().clone(),
        "loss": loss.detach().reshape(1).clone(),
    }
    for n in names:
        ref["grad." + n] = params[n].grad.detach().clone()

    # --- 10-step training trajectory with gradient accumulation ---
    tr = dict(TRAIN)
    tr["max_grad_norm"] = MAX_GRAD_NORM[name]
    steps, accum = tr["total_steps"], tr["grad_accum_steps"]
    tids, tlabels = make_train_data(cfg, g, steps, accum, tr["micro_batch_size"], tr["seq_len"])
    params = {n: init[n].clone().requires_grad_(True) for n in names}
    plist = [params[n] for n in names]
    decay = [params[n] for n in names if params[n].dim() >= 2]
    no_decay = [params[n] for n in names if params[n].dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": tr["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"], foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, partial(cosine_lambda, warmup=tr["warmup_steps"], total=steps, num_cycles=tr["num_cycles"]))
    losses, norms, lrs, counts = [], [], [], []
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        n_items = sum(num_targets(tlabels[s, m]) for m in range(accum))
        counts.append([num_targets(tlabels[s, m]) for m in range(accum)])
        step_loss = torch.zeros((), dtype=torch.float32)
        for m in range(accum):
            lg = forward(cfg, params, tids[s, m])
            l = token_loss_sum(lg, tlabels[s, m]) / n_items
            l.backward()
            step_loss = step_loss + l.detach()
        total_norm = torch.nn.utils.clip_grad_norm_(plist, tr["max_grad_norm"])
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        losses.append(float(step_loss))
        norms.append(float(total_norm))
    for nrm in norms:
        assert abs(nrm - tr["max_grad_norm"]) > CLIP_MARGIN * tr["max_grad_norm"], (name, nrm)
    assert any(nrm > tr["max_grad_norm"] for nrm in norms) and any(nrm < tr["max_grad_norm"] for nrm in norms)
    # Parameters whose Adam second moment stays at rounding-noise level (e.g. Qwen2's
    # k_proj.bias: with rope_theta 1e6 and T=16 most of its gradient is ~1e-9, which Adam
    # normalises to O(lr) updates, so any fp32 re-implementation differs there by ~1e-5).
    # (Exact zeros, e.g. embedding rows of tokens never seen, are structural and not noisy.)
    noisy = []
    for n in names:
        v = opt.state[params[n]]["exp_avg_sq"]
        if bool(((v > 0) & (v.sqrt() < 1e-6)).any()):
            noisy.append(n)
    ref["train.input_ids"] = tids
    ref["train.labels"] = tlabels
    ref["train.num_targets"] = torch.tensor(counts, dtype=torch.int64)
    ref["train.losses"] = torch.tensor(losses, dtype=torch.float32)
    ref["train.grad_norms"] = torch.tensor(norms, dtype=torch.float32)
    ref["train.lrs"] = torch.tensor(lrs, dtype=torch.float32)
    for n in names:
        ref["final." + n] = params[n].detach().clone()

    meta = {
        "model": name,
        "lr": repr(tr["lr"]),
        "weight_decay": repr(tr["weight_decay"]),
        "beta1": repr(tr["beta1"]),
        "beta2": repr(tr["beta2"]),
        "eps": repr(tr["eps"]),
        "max_grad_norm": repr(tr["max_grad_norm"]),
        "clip_eps": "1e-06",
        "warmup_steps": str(tr["warmup_steps"]),
        "total_steps": str(steps),
        "scheduler": tr["scheduler"],
        "num_cycles": repr(tr["num_cycles"]),
        "grad_accum_steps": str(accum),
        "weight_decay_rule": "dim>=2",
        "loss_normalization": "sum_of_token_ce_over_all_micro_batches / num_targets_of_whole_step",
        "ignore_index": str(IGNORE_INDEX),
        "torch_version": torch.__version__,
        "noisy_final_params": ",".join(noisy),
    }
    save_file(ref, os.path.join(d, "reference.safetensors"), metadata=meta)
    return {"loss0": float(loss), "losses": losses, "grad_norms": norms, "lrs": lrs,
            "max_grad_norm": tr["max_grad_norm"], "counts": counts, "noisy": noisy}


# --------------------------------------------------------------------------------------
# Op-level fixtures
# --------------------------------------------------------------------------------------

def make_ops(out_dir, seed=1234):
    g = torch.Generator().manual_seed(seed)

    def rn(*shape):
        return torch.randn(shape, generator=g, dtype=torch.float32)

    t = {}
    meta = {}

    # RMSNorm
    eps = 1e-6
    x = rn(6, 40).requires_grad_(True)
    w = (1.0 + 0.1 * rn(40)).requires_grad_(True)
    dy = rn(6, 40)
    y = rms_norm(x, w, eps)
    y.backward(dy)
    t.update({"rmsnorm.x": x.detach(), "rmsnorm.w": w.detach(), "rmsnorm.y": y.detach(),
              "rmsnorm.dy": dy, "rmsnorm.dx": x.grad, "rmsnorm.dw": w.grad})
    meta["rmsnorm.eps"] = repr(eps)

    # RoPE, (B, T, H, D), positions 0..T-1
    theta = 10000.0
    x = rn(2, 5, 3, 8).requires_grad_(True)
    dy = rn(2, 5, 3, 8)
    cos, sin = rope_cos_sin(5, 8, {"rope_theta": theta})
    y = apply_rope_bhtd(x.transpose(1, 2), cos, sin).transpose(1, 2)
    y.backward(dy)
    t.update({"rope.x": x.detach(), "rope.y": y.detach().contiguous(), "rope.dy": dy, "rope.dx": x.grad})
    meta["rope.theta"] = repr(theta)
    meta["rope.layout"] = "B,T,H,D"

    # Causal GQA attention, (B, T, heads, D)
    q = rn(2, 7, 4, 8).requires_grad_(True)
    k = rn(2, 7, 2, 8).requires_grad_(True)
    v = rn(2, 7, 2, 8).requires_grad_(True)
    dout = rn(2, 7, 4, 8)
    scale = 1.0 / math.sqrt(8)
    out = causal_attention_bhtd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale).transpose(1, 2)
    out.backward(dout)
    t.update({"attn.q": q.detach(), "attn.k": k.detach(), "attn.v": v.detach(),
              "attn.out": out.detach().contiguous(), "attn.dout": dout,
              "attn.dq": q.grad, "attn.dk": k.grad, "attn.dv": v.grad})
    meta["attn.scale"] = repr(scale)
    meta["attn.layout"] = "B,T,heads,D"
    meta["attn.gqa"] = "query head h uses kv head h // (H / KVH)"

    # SwiGLU
    gate = rn(5, 12).requires_grad_(True)
    up = rn(5, 12).requires_grad_(True)
    dh = rn(5, 12)
    h = F.silu(gate) * up
    h.backward(dh)
    t.update({"swiglu.gate": gate.detach(), "swiglu.up": up.detach(), "swiglu.h": h.detach(),
              "swiglu.dh": dh, "swiglu.dgate": gate.grad, "swiglu.dup": up.grad})

    # Cross-entropy, mean over non-ignored
    logits = (2.0 * rn(9, 30)).requires_grad_(True)
    labels = torch.randint(0, 30, (9,), generator=g, dtype=torch.int64)
    labels[2] = IGNORE_INDEX
    labels[6] = IGNORE_INDEX
    loss = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="mean")
    loss.backward()
    t.update({"ce.logits": logits.detach(), "ce.labels": labels, "ce.loss": loss.detach().reshape(1),
              "ce.dlogits": logits.grad})
    meta["ce.ignore_index"] = str(IGNORE_INDEX)
    meta["ce.reduction"] = "mean over non-ignored"

    # Attention inside documents (neat packing): rows of several documents over several 64-key
    # tiles, a one-token document, a start on a tile boundary. Key s is visible to query t iff
    # doc_start[t] <= s <= t. Drawn last, so the fixtures above keep their values.
    T = 200
    starts = [[0, 37, 130, 131], [0, 64, 70, 190]]
    doc_start = torch.zeros(2, T, dtype=torch.int32)
    for b, row in enumerate(starts):
        for i, first in enumerate(row):
            end = row[i + 1] if i + 1 < len(row) else T
            doc_start[b, first:end] = first
    q = rn(2, T, 4, 16).requires_grad_(True)
    k = rn(2, T, 2, 16).requires_grad_(True)
    v = rn(2, T, 2, 16).requires_grad_(True)
    dout = rn(2, T, 4, 16)
    scale = 1.0 / math.sqrt(16)
    out = document_attention_bhtd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale,
                                  doc_start).transpose(1, 2)
    out.backward(dout)
    t.update({"docattn.q": q.detach(), "docattn.k": k.detach(), "docattn.v": v.detach(),
              "docattn.doc_start": doc_start, "docattn.out": out.detach().contiguous(), "docattn.dout": dout,
              "docattn.dq": q.grad, "docattn.dk": k.grad, "docattn.dv": v.grad})
    meta["docattn.scale"] = repr(scale)

    t = {k: v.contiguous() for k, v in t.items()}
    save_file(t, os.path.join(out_dir, "ops.safetensors"), metadata=meta)
    return t


# Scaled RoPE: the llama and qwen2 models with llama3 / yarn RoPE (transformers-4 rope_scaling and
# transformers-5 rope_parameters forms), their frequencies as transformers computed them
# (rope_transformers.json, written by make_rope_reference.py). Logits, loss, every gradient and
# 5 AdamW steps at a constant rate without clipping.
SCALED_ROPE = {"llama_llama3": ("llama", "reference_llama_llama3"), "qwen2_yarn": ("qwen2", "reference_qwen2_yarn")}


def make_scaled_rope_fixtures(name, base, case_name, seed, out_dir):
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "rope_transformers.json")) as f:
        case = next(c for c in json.load(f)["cases"] if c["name"] == case_name)
    cfg = {k: v for k, v in CONFIGS[base].items() if k not in ("rope_theta", "rope_scaling")}
    for key in ("rope_theta", "rope_scaling", "rope_parameters"):
        if key in case["config"]:
            cfg[key] = case["config"][key]
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    cfg = dict(cfg, _rope={"inv_freq": case["inv_freq"], "scaling": case["attention_scaling"]})
    names = param_names(cfg)
    init = init_params(cfg, seed)
    save_file(init, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    g = torch.Generator().manual_seed(seed + 1000)
    ids, labels = make_batch0(cfg, g)
    params = {n: init[n].clone().requires_grad_(True) for n in names}
    logits = forward(cfg, params, ids)
    loss = token_loss_sum(logits, labels) / num_targets(labels)
    loss.backward()
    ref = {"input_ids": ids, "labels": labels, "logits": logits.detach().clone(), "loss": loss.detach().reshape(1)}
    for n in names:
        ref["grad." + n] = params[n].grad.detach().clone()
    params = {n: init[n].clone().requires_grad_(True) for n in names}
    opt = torch.optim.AdamW([params[n] for n in names], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                            foreach=False)
    losses = []
    for _ in range(5):
        opt.zero_grad(set_to_none=True)
        l = token_loss_sum(forward(cfg, params, ids), labels) / num_targets(labels)
        l.backward()
        opt.step()
        losses.append(float(l))
    ref["train.losses"] = torch.tensor(losses, dtype=torch.float32)
    save_file(ref, os.path.join(d, "reference.safetensors"))
    return losses


# --------------------------------------------------------------------------------------

def main(argv):
    if len(argv) != 2:
        print(__doc__)
        print("usage: make_reference.py OUT_DIR", file=sys.stderr)
        return 2
    out_dir = argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    t0 = time.time()
    make_ops(out_dir)
    sch = write_schedules(out_dir)
    print(f"ops.safetensors, schedules.json ({len(sch['schedules'])} schedules)")
    for i, (name, cfg) in enumerate(CONFIGS.items()):
        s = make_model_fixtures(name, cfg, seed=42 + i, out_dir=out_dir)
        clipped = [n > s["max_grad_norm"] for n in s["grad_norms"]]
        print(f"[{name}] loss(mb0)={s['loss0']:.6f}  max_grad_norm={s['max_grad_norm']}")
        print(f"  targets/step  = {s['counts']}")
        print(f"  losses        = {[round(x, 5) for x in s['losses']]}")
        print(f"  grad_norms    = {[round(x, 4) for x in s['grad_norms']]}")
        print(f"  clipped       = {sum(clipped)}/{len(clipped)} steps {clipped}")
        print(f"  lrs           = {[float('%.6g' % x) for x in s['lrs']]}")
        print(f"  noisy final   = {s['noisy']}")
    for i, (name, (base, case)) in enumerate(SCALED_ROPE.items()):
        losses = make_scaled_rope_fixtures(name, base, case, seed=77 + i, out_dir=out_dir)
        print(f"[{name}] scaled RoPE ({case}): losses {[round(x, 5) for x in losses]}")
    print(f"done in {time.time() - t0:.2f}s -> {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Transformers peer of the MoE bench (bench/moe_bench.sh): the MoE bench model trained the way a
LLaMA-Factory user trains it, through transformers' own modeling code.

Qwen3MoeForCausalLM built from a config (random init, std 0.02): vocab 8192, hidden 512, 4 layers,
8 heads x 64 (8 kv heads), 8 experts, top-2, moe_intermediate_size 512, norm_topk_prob, the
load-balancing loss at router_aux_loss_coef 0.001 (output_router_logits, as LLaMA-Factory's
moe_aux_loss_coef sets it); sdpa attention; batch 4 x 256 random tokens, labels = inputs;
torch.optim.AdamW(lr 3e-4, weight_decay 0.1), clip_grad_norm_(1.0). Eager mode.

--experts picks transformers' experts implementation: eager (its loop over the experts hit),
batched_mm (every token through each of its k experts' weights, gathered per token) or grouped_mm
(tokens sorted by expert, torch's grouped GEMM). --dense runs transformers' Qwen3ForCausalLM of the
same active parameters instead (intermediate_size 1024 = 2 x 512), Fabrica's `--model moe-dense`.

Prints one JSON line, the keys of bench/torch_peer.py's plus "experts".
"""
import argparse
import json
import os
import resource
import sys
import warnings

warnings.filterwarnings("ignore", message=".*Failed to initialize NumPy.*")

import torch

IMPORT_RSS_MB = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

import transformers  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_peer import time_steps  # noqa: E402

VOCAB, HIDDEN, LAYERS, HEADS, HEAD_DIM = 8192, 512, 4, 8, 64
EXPERTS, TOP_K, EXPERT_WIDTH = 8, 2, 512
SEQ, BATCH = 256, 4
LR, WEIGHT_DECAY, CLIP = 3e-4, 0.1, 1.0


def build(dense, experts):
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  num_key_value_heads=HEADS, head_dim=HEAD_DIM, max_position_embeddings=SEQ, rms_norm_eps=1e-6,
                  rope_theta=10000.0, tie_word_embeddings=False, initializer_range=0.02)
    if dense:
        config = transformers.Qwen3Config(intermediate_size=TOP_K * EXPERT_WIDTH, **common)
        return transformers.Qwen3ForCausalLM._from_config(config, attn_implementation="sdpa")
    config = transformers.Qwen3MoeConfig(num_experts=EXPERTS, num_experts_per_tok=TOP_K,
                                         moe_intermediate_size=EXPERT_WIDTH, norm_topk_prob=True,
                                         router_aux_loss_coef=0.001, output_router_logits=True,
                                         decoder_sparse_step=1, mlp_only_layers=[], **common)
    return transformers.Qwen3MoeForCausalLM._from_config(config, attn_implementation="sdpa",
                                                         experts_implementation=experts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--experts", choices=["eager", "batched_mm", "grouped_mm"], default="grouped_mm")
    ap.add_argument("--dense", action="store_true")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        ap.error("need --steps >= 1, --warmup >= 0, --threads >= 1")
    if int(transformers.__version__.split(".")[0]) < 5:
        print(f"moe_peer: transformers {transformers.__version__}; the bench needs >= 5", file=sys.stderr)
        return 1

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build(args.dense, args.experts)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    gen = torch.Generator().manual_seed(1)
    total = args.warmup + args.steps
    data = torch.randint(0, VOCAB, (total, BATCH, SEQ), generator=gen)

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=data[i], labels=data[i]).loss  # CE + coef * aux for the MoE model
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        return loss.item()

    timed = time_steps(step, args.warmup, total, "moe_peer")
    if timed is None:
        return 1
    loss, elapsed = timed
    print(json.dumps({
        "impl": "transformers",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "model": "moe-dense" if args.dense else "moe",
        "experts": "dense" if args.dense else args.experts,
        "precision": "fp32",
        "threads": torch.get_num_threads(),
        "tokens_per_s": round(BATCH * SEQ * args.steps / elapsed, 1),
        "step_ms": round(elapsed * 1000.0 / args.steps, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
        "final_loss": round(loss, 5),
        "import_rss_mb": round(IMPORT_RSS_MB, 1),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Helper of bench/llamafactory_side_by_side.sh, run with LLaMA-Factory's venv.

  make-model DIR      a tiny Qwen3 folder: seeded random init saved by transformers (safetensors,
                      fp32, config.json with rope_parameters), the real Qwen3 tokenizer
  compare LF_DIR FAB_DIR TOLERANCE
                      per-step losses of LLaMA-Factory's trainer_log.jsonl and Fabrica's
                      metrics.jsonl, the worst relative difference; exit 1 above TOLERANCE
"""
import json
import os
import shutil
import sys


def make_model(out):
    import torch
    import transformers

    torch.manual_seed(0)
    tokenizer_dir = os.environ.get("QWEN3_TOKENIZER", "/work/shared/data/tokenizers/qwen3")
    config = transformers.Qwen3Config(
        vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        bos_token_id=151643, eos_token_id=151645, pad_token_id=151643)
    model = transformers.Qwen3ForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    for name in os.listdir(tokenizer_dir):
        shutil.copy(os.path.join(tokenizer_dir, name), out)
    written = json.load(open(os.path.join(out, "config.json")))
    print(f"model: {out} ({sum(p.numel() for p in model.parameters())} parameters, transformers "
          f"{transformers.__version__}, rope_parameters {written.get('rope_parameters')}, "
          f"top-level rope_theta {written.get('rope_theta')})")


def read_jsonl(path, step_key):
    losses = {}
    for line in open(path):
        row = json.loads(line)
        if "loss" in row and step_key in row:
            losses[int(row[step_key])] = float(row["loss"])
    return losses


def compare(lf_dir, fab_dir, tolerance):
    lf = read_jsonl(os.path.join(lf_dir, "trainer_log.jsonl"), "current_steps")
    fab = read_jsonl(os.path.join(fab_dir, "metrics.jsonl"), "step")
    steps = sorted(set(lf) | set(fab))
    worst, worst_step = 0.0, None
    print(f"{'step':>5} {'LLaMA-Factory':>14} {'Fabrica':>14} {'rel. diff':>10}")
    for s in steps:
        a, b = lf.get(s), fab.get(s)
        if a is None or b is None:
            print(f"{s:>5} {a!s:>14} {b!s:>14}  (missing on one side)")
            worst, worst_step = float("inf"), s
            continue
        rel = abs(a - b) / max(abs(a), 1e-12)
        if rel > worst:
            worst, worst_step = rel, s
        print(f"{s:>5} {a:>14.6f} {b:>14.6f} {rel:>10.2e}")
    if not steps:
        print("no losses logged")
        return 1
    print(f"worst relative difference: {worst:.3e} at step {worst_step} ({len(steps)} steps, tolerance {tolerance:g})")
    return 0 if worst <= tolerance else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["make-model"] and len(sys.argv) == 3:
        make_model(sys.argv[2])
    elif sys.argv[1:2] == ["compare"] and len(sys.argv) == 5:
        sys.exit(compare(sys.argv[2], sys.argv[3], float(sys.argv[4])))
    else:
        sys.exit(__doc__)

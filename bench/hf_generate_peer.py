#!/usr/bin/env python3
"""Hugging Face peer of fabrica_rollout_bench: the same model folder and prompts (written by
`fabrica_rollout_bench --write DIR`), sampled with transformers' `generate` the way a user
batches it: `--batch` prompts at a time, left-padded with an attention mask, do_sample with
temperature 1, top_p 1, top_k 0 (no filter, as Fabrica's side), exactly `--new-tokens` new
tokens per prompt (no stop id). --precision bf16 casts the model to bfloat16.

Prints one JSON line: generated tokens/s of the timed run (after one untimed batch), and tokens
per CPU-second of the process (user + system).
"""
import argparse
import json
import resource
import time
import warnings

warnings.filterwarnings("ignore")

import torch
import transformers
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).eval()
    with open(f"{args.model}/prompts.json") as f:
        prompts = json.load(f)[: args.prompts]
    pad = 0

    def run(batch_prompts):
        longest = max(len(p) for p in batch_prompts)
        ids = torch.tensor([[pad] * (longest - len(p)) + p for p in batch_prompts])
        mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in batch_prompts])
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0,
                             top_k=0, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                             eos_token_id=None, pad_token_id=pad)
        return (out.shape[1] - longest) * len(batch_prompts)

    with torch.inference_mode():
        run(prompts[: args.batch])
        start, cpu_start = time.perf_counter(), time.process_time()
        tokens = sum(run(prompts[i:i + args.batch]) for i in range(0, len(prompts), args.batch))
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    print(json.dumps({"impl": "transformers", "transformers": transformers.__version__, "torch": torch.__version__,
                      "precision": args.precision, "threads": args.threads, "prompts": args.prompts,
                      "new_tokens": args.new_tokens, "batch": args.batch, "generated_tokens": tokens,
                      "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1),
                      "cpu_seconds": round(cpu, 3), "tokens_per_cpu_s": round(tokens / cpu, 1),
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)}))


if __name__ == "__main__":
    main()

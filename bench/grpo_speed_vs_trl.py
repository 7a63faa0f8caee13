"""GRPO speed side by side with TRL's GRPOTrainer (issue 31): seconds per step and peak memory.

One job, both sides from the same folder: a random-initialised Qwen3 (by default hidden 128, 3 layers,
heads of 32 (--hidden, --layers),
a 300-token BPE tokenizer trained by `fabrica tokenizer train`, the weights written by transformers),
the "rotate four digits" prompts of bench/grpo_vs_trl.py in the chatml template, 8 prompts x 8
samples a step, exactly NEW tokens per response (a random model rarely ends early; both sides'
mean lengths are printed), temperature 1, reward 1 when the response holds a digit (Fabrica's
`format:[0-9]`, the same regex in Python for TRL), lr 1e-5, no KL, token-mean loss (TRL's "dapo"),
one optimizer step per rollout batch, CPU, THREADS threads each, fp32. Each side runs in its own
process: WARMUP steps, then STEPS timed ones (Fabrica: metrics.jsonl's timing_s/step; TRL: a
callback's step times); peak RSS is the process's ru_maxrss.

Usage (bench/.venv with torch, transformers >= 5; trl is pip-installed there when missing):
  bench/.venv/bin/python bench/grpo_speed_vs_trl.py --fabrica build/fabrica --work /tmp/grpo_speed
"""
import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grpo_vs_trl import make_sets, prompt_text, write_alpaca  # noqa: E402

PROMPTS, SAMPLES, NEW = 8, 8, 32


def make_model(fabrica, work, hidden, layers):
    """The tokenizer (trained by Fabrica) and random weights (written by transformers) in work/model.
    Run in a subprocess of its own: the parent stays small (a child's ru_maxrss starts from its
    parent's resident size at fork, and execve keeps it)."""
    model = work + "/model"
    os.makedirs(model, exist_ok=True)
    sft, _, _ = make_sets()
    with open(work + "/text.txt", "w") as f:
        f.writelines(q + a + "\n" for q, a in sft)
    subprocess.run([fabrica, "tokenizer", "train", "--input", work + "/text.txt", "--vocab-size", "300",
                    "--output", model], check=True, stdout=subprocess.DEVNULL)
    import torch
    import transformers
    tokenizer = json.load(open(model + "/tokenizer.json"))
    config = transformers.Qwen3Config(
        hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
        num_attention_heads=hidden // 32, num_key_value_heads=hidden // 64, head_dim=32, max_position_embeddings=128, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        vocab_size=len(tokenizer["model"]["vocab"]) + len(tokenizer["added_tokens"]))
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(config).save_pretrained(model)


def run_fabrica(fabrica, work, model, steps, threads):
    out = work + "/fabrica_out"
    yaml = (f"model_name_or_path: {model}\nstage: grpo\ndataset: {work}/rl.json\ntemplate: chatml\n"
            f"cutoff_len: 32\noutput_dir: {out}\noverwrite_output_dir: true\nmax_steps: {steps}\n"
            f"logging_steps: 1\nsave_steps: 0\nseed: 7\nreward: 'format:[0-9]'\n"
            f"per_device_train_batch_size: {PROMPTS}\nnum_generations: {SAMPLES}\ntemperature: 1.0\n"
            f"top_p: 1.0\ntop_k: 0\nmax_new_tokens: {NEW}\nlearning_rate: 1.0e-5\nlr_scheduler_type: constant\n"
            f"threads: {threads}\n")
    with open(work + "/fabrica.yaml", "w") as f:
        f.write(yaml)
    subprocess.run([fabrica, "train", work + "/fabrica.yaml"], check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in open(out + "/metrics.jsonl")]
    # peak_memory_bytes: the training process's own ru_maxrss
    return {"step_s": [r["timing_s/step"] for r in rows], "length": [r["response_length_mean"] for r in rows],
            "peak_rss_mb": max(r["peak_memory_bytes"] for r in rows) / 2**20}


def run_trl(work, model, steps, threads):
    """In this process (the caller starts it as a subprocess): prints one JSON line."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(threads)
    torch.manual_seed(7)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.padding_side = "left"
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    _, rl, _ = make_sets()
    data = Dataset.from_list([{"prompt": prompt_text(q)} for q, _ in rl])
    lengths = []

    def has_digit(prompts, completions, completion_ids=None, **_):
        if completion_ids is not None:
            lengths.extend(len(c) for c in completion_ids)
        return [1.0 if re.search("[0-9]", c) else 0.0 for c in completions]

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.times, self.start = [], 0.0

        def on_step_begin(self, *_, **__):
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            self.times.append(time.perf_counter() - self.start)

    config = GRPOConfig(output_dir=work + "/trl_out", learning_rate=1e-5, lr_scheduler_type="constant",
                        warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
                        per_device_train_batch_size=PROMPTS * SAMPLES, gradient_accumulation_steps=1,
                        num_generations=SAMPLES, num_iterations=1, max_completion_length=NEW, temperature=1.0,
                        top_p=1.0, top_k=0, beta=0.0, epsilon=0.2, loss_type="dapo", scale_rewards="group",
                        max_steps=steps, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=7,
                        bf16=False, disable_tqdm=True)
    times = StepTimes()
    trainer = GRPOTrainer(model=policy, reward_funcs=has_digit, args=config, train_dataset=data,
                          processing_class=tokenizer, callbacks=[times])
    trainer.train()
    print(json.dumps({"step_s": times.times, "length": [sum(lengths) / max(1, len(lengths))],
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fabrica", default="build/fabrica")
    ap.add_argument("--work", required=True)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128, help="the model's hidden size (heads of 32)")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--trl-only", action="store_true", help=argparse.SUPPRESS)  # the TRL subprocess
    ap.add_argument("--make-model", action="store_true", help=argparse.SUPPRESS)  # the model's subprocess
    args = ap.parse_args()
    work = os.path.abspath(args.work)
    total = args.warmup + args.steps
    if args.trl_only:
        return run_trl(work, work + "/model", total, args.threads)
    if args.make_model:
        return make_model(os.path.abspath(args.fabrica), work, args.hidden, args.layers)
    if subprocess.run([sys.executable, "-c", "import trl"], capture_output=True).returncode != 0:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "trl"], check=True)
    os.makedirs(work, exist_ok=True)
    model = work + "/model"
    if not os.path.exists(model + "/model.safetensors"):
        subprocess.run([sys.executable, os.path.abspath(__file__), "--fabrica", os.path.abspath(args.fabrica),
                        "--work", work, "--hidden", str(args.hidden), "--layers", str(args.layers), "--make-model"],
                       check=True)
    _, rl, _ = make_sets()
    write_alpaca(work + "/rl.json", rl)
    fab = run_fabrica(os.path.abspath(args.fabrica), work, model, total, args.threads)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--work", work, "--warmup", str(args.warmup),
                          "--steps", str(args.steps), "--threads", str(args.threads), "--trl-only"],
                         check=True, capture_output=True, text=True, env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    trl_run = json.loads(out.stdout.strip().splitlines()[-1])
    f_step, t_step = median(fab["step_s"][args.warmup:]), median(trl_run["step_s"][args.warmup:])
    print(f"GRPO step, {PROMPTS} prompts x {SAMPLES} samples, {NEW} new tokens, {args.threads} threads, "
          f"median of {args.steps} steps after {args.warmup}")
    print(f"  fabrica: {f_step:.3f} s/step  peak RSS {fab['peak_rss_mb']:.0f} MB  "
          f"response length {sum(fab['length']) / len(fab['length']):.1f}  steps {[round(s, 3) for s in fab['step_s']]}")
    print(f"  trl:     {t_step:.3f} s/step  peak RSS {trl_run['peak_rss_mb']:.0f} MB  "
          f"response length {trl_run['length'][0]:.1f}  steps {[round(s, 3) for s in trl_run['step_s']]}")
    print(f"  Fabrica/TRL: step rate x{t_step / f_step:.2f}, peak RSS x{fab['peak_rss_mb'] / trl_run['peak_rss_mb']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

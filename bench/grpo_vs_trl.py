"""GRPO side by side with TRL's GRPOTrainer, judged by held-out greedy accuracy.

The task is tests/train/grpo_learning_test.cpp's "rotate": four digits rotated left ("1234" ->
"2341"). The SFT demonstrations follow a wrong rule (rotate right, "4123") 55% of the time, so after
SFT the greedy answer is mostly wrong while some samples are right. From the same SFT folder (made by `fabrica train`), the
same GRPO job runs in Fabrica and in TRL, each in two update settings:
  on-policy   one optimizer step per rollout batch (Fabrica's grpo default; TRL's num_iterations 1)
  4x2         4 passes over 2 mini-batches, 8 optimizer steps per rollout batch (Fabrica
              ppo_epochs 4, ppo_mini_batch_size 4; TRL num_iterations 4, steps_per_generation 2)
8 prompts x 8 samples per rollout batch, temperature 1, exact-match reward, lr 1e-4 constant, no KL,
clip 0.2, token-mean loss (TRL's "dapo"), group-std-normalised advantages. Every output folder is
judged by transformers' greedy generate on 200 held-out questions.

Usage (a venv with torch, transformers >= 5 and trl):
  VENV/bin/python bench/grpo_vs_trl.py --fabrica build/fabrica --work /tmp/grpo_vs_trl [--rollouts 40]
"""
import argparse
import json
import os
import random
import subprocess
import sys


def make_sets(seed=2027):
    rng = random.Random(seed)
    seen, questions = set(), []
    while len(questions) < 2800:
        q = "".join(rng.choice("0123456789") for _ in range(4))
        if q not in seen:
            seen.add(q)
            questions.append(q)
    right, wrong = (lambda q: q[1:] + q[0]), (lambda q: q[-1] + q[:3])
    sft = [(q, right(q) if rng.random() < 0.45 else wrong(q)) for q in questions[:2000]]
    rl = [(q, right(q)) for q in questions[2000:2600]]
    held_out = [(q, right(q)) for q in questions[2600:]]
    return sft, rl, held_out


def write_alpaca(path, pairs):
    with open(path, "w") as f:
        json.dump([{"instruction": q, "input": "", "output": a} for q, a in pairs], f)


def fabrica_yaml(model, dataset, out, steps, lines, seed=7):
    return (f"model_name_or_path: {model}\ndataset: {dataset}\ntemplate: chatml\ncutoff_len: 32\n"
            f"output_dir: {out}\noverwrite_output_dir: true\nmax_steps: {steps}\nlogging_steps: 5\n"
            f"save_steps: 0\nseed: {seed}\n" + lines)


def run_fabrica(fabrica, work, name, yaml_text):
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        f.write(yaml_text)
    subprocess.run([fabrica, "train", path], check=True, stdout=subprocess.DEVNULL)


def prompt_text(q):
    return f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"


def run_trl(start, rl, out, rollouts, iterations, per_generation, seed):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(start)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32)
    answers = {prompt_text(q): a for q, a in rl}
    data = Dataset.from_list([{"prompt": prompt_text(q)} for q, _ in rl])

    def exact_match(prompts, completions, **_):
        return [1.0 if c.strip() == answers[p] else 0.0 for p, c in zip(prompts, completions)]

    config = GRPOConfig(output_dir=out, learning_rate=1e-4, lr_scheduler_type="constant", warmup_steps=0,
                        weight_decay=0.0, max_grad_norm=1.0, per_device_train_batch_size=64 // per_generation,
                        steps_per_generation=per_generation, gradient_accumulation_steps=1, num_generations=8,
                        num_iterations=iterations, max_completion_length=6, temperature=1.0, top_p=1.0, top_k=0,
                        beta=0.0, epsilon=0.2, loss_type="dapo", scale_rewards="group",
                        max_steps=rollouts * iterations * per_generation, logging_steps=10, save_strategy="no",
                        report_to=[], use_cpu=True, seed=seed, bf16=False, disable_tqdm=True)
    trainer = GRPOTrainer(model=model, reward_funcs=exact_match, args=config, train_dataset=data,
                          processing_class=tokenizer)
    trainer.train()
    trainer.save_model(out)
    tokenizer.save_pretrained(out)


def greedy_accuracy(folder, held_out, tokenizer_folder):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    batch = tokenizer([prompt_text(q) for q, _ in held_out], return_tensors="pt", padding=True,
                      add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=6, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    return sum(t.strip() == a for t, (_, a) in zip(texts, held_out)) / len(held_out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fabrica", default="build/fabrica")
    ap.add_argument("--work", required=True)
    ap.add_argument("--rollouts", type=int, default=40, help="rollout batches (Fabrica's grpo steps)")
    ap.add_argument("--only", default="", help="comma list of runs to do (default: all)")
    ap.add_argument("--seed", type=int, default=7, help="the GRPO runs' seed (the SFT start always uses 7)")
    args = ap.parse_args()
    fabrica = os.path.abspath(args.fabrica)
    work = os.path.abspath(args.work)
    os.makedirs(work + "/model", exist_ok=True)
    sft, rl, held_out = make_sets()
    write_alpaca(work + "/sft.json", sft)
    write_alpaca(work + "/rl.json", rl)
    with open(work + "/text.txt", "w") as f:
        f.writelines(q + a + "\n" for q, a in sft)
    start = work + "/sft"
    if not os.path.exists(start + "/model.safetensors"):
        subprocess.run([fabrica, "tokenizer", "train", "--input", work + "/text.txt", "--vocab-size", "300",
                        "--output", work + "/model"], check=True, stdout=subprocess.DEVNULL)
        tokenizer = json.load(open(work + "/model/tokenizer.json"))
        config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 128,
                  "intermediate_size": 352, "num_hidden_layers": 3, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 64, "rope_theta": 10000.0,
                  "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
                  "vocab_size": len(tokenizer["model"]["vocab"]) + len(tokenizer["added_tokens"])}
        with open(work + "/model/config.json", "w") as f:
            json.dump(config, f)
        run_fabrica(fabrica, work, "sft", fabrica_yaml(
            work + "/model", work + "/sft.json", start, 200,
            "stage: sft\nper_device_train_batch_size: 32\nlearning_rate: 3.0e-3\nlr_scheduler_type: cosine\n"
            "warmup_ratio: 0.05\nweight_decay: 0.01\n"))
    results = {"sft": greedy_accuracy(start, held_out, start)}
    print(f"after SFT: held-out greedy accuracy {100 * results['sft']:.1f}%", flush=True)
    grpo = ("stage: grpo\nreward: exact_match\nper_device_train_batch_size: 8\nnum_generations: 8\n"
            "temperature: 1.0\ntop_p: 1.0\ntop_k: 0\nmax_new_tokens: 6\nlearning_rate: 1.0e-4\n"
            "lr_scheduler_type: constant\n")
    runs = {
        "fabrica_on_policy": lambda out: run_fabrica(fabrica, work, "on_policy",
                                                     fabrica_yaml(start, work + "/rl.json", out, args.rollouts, grpo,
                                                                  args.seed)),
        "fabrica_4x2": lambda out: run_fabrica(fabrica, work, "4x2", fabrica_yaml(
            start, work + "/rl.json", out, args.rollouts, grpo + "ppo_epochs: 4\nppo_mini_batch_size: 4\n", args.seed)),
        "trl_on_policy": lambda out: run_trl(start, rl, out, args.rollouts, 1, 1, args.seed),
        "trl_4x2": lambda out: run_trl(start, rl, out, args.rollouts, 4, 2, args.seed),
    }
    only = [r for r in args.only.split(",") if r] or list(runs)
    for name in only:
        out = f"{work}/{name}_seed{args.seed}"
        runs[name](out)
        results[name] = greedy_accuracy(out, held_out, start)
        print(f"{name}: held-out greedy accuracy {100 * results[name]:.1f}% after {args.rollouts} rollout batches",
              flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Greedy generation on the committed tiny mixture-of-experts folders, run by hand in a venv holding
torch and transformers >= 5 (used: torch 2.15.0, transformers 5.25.0):

  python tests/reference/make_moe_generate_reference.py

For each of tests/reference/moe/{qwen3_moe,qwen2_moe,mixtral} (make_moe_reference.py's per-expert
folders), two prompts run one at a time through transformers' own generate(do_sample=False): the
first row of reference.safetensors' batch (7 tokens) and a short one. Written to
F/generate_reference.safetensors: prompt_P (T) i64, and for the NEW generated tokens tokens_P
(NEW) i64 and logits_P (NEW, vocab): the raw logits each token was picked from (the first from
the prompt's pass, the others from decode steps over the KV cache).
"""
import os

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe")
NEW = 10


def main():
    for name in ["qwen3_moe", "qwen2_moe", "mixtral"]:
        folder = os.path.join(HERE, name)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        batch = load_file(os.path.join(folder, "reference.safetensors"))
        prompts = [batch["input_ids"][0], torch.tensor([5, 9, 21, 7])]
        out = {}
        for p, prompt in enumerate(prompts):
            with torch.no_grad():
                g = model.generate(prompt[None, :], do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW,
                                   output_logits=True, return_dict_in_generate=True, pad_token_id=0)
            out[f"prompt_{p}"] = prompt.long().contiguous()
            out[f"tokens_{p}"] = g.sequences[0, prompt.numel():].long().contiguous()
            out[f"logits_{p}"] = torch.cat(g.logits, 0).float().contiguous()
            print(name, "prompt", p, "tokens", out[f"tokens_{p}"].tolist())
        save_file(out, os.path.join(folder, "generate_reference.safetensors"),
                  metadata={"transformers": transformers.__version__, "torch": torch.__version__})


if __name__ == "__main__":
    main()

"""PEFT fixture, run by hand with a venv holding torch, transformers and peft (used: torch 2.15,
transformers 5.6, peft 0.18.1):

  python make_peft_fixture.py fixture OUT_DIR
      A tiny Qwen3 base (transformers, seeded), a LoRA adapter written by peft itself (r 4,
      alpha 8, rsLoRA, every projection, lm_head in modules_to_save, B and lm_head made
      non-zero so the adapter changes the logits) and peft's logits for fixed ids:
      OUT_DIR/base/, OUT_DIR/adapter/, OUT_DIR/logits.safetensors. Committed in
      tests/reference/peft; the C++ test loads base + adapter through Fabrica and compares its
      logits, with the adapters and merged, with peft's.

  python make_peft_fixture.py check BASE ADAPTER MERGED
      An adapter written by Fabrica loaded with peft onto BASE in transformers, against the
      folder `fabrica export` merged (loaded by transformers): the largest logit difference.
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM
from peft import LoraConfig, PeftModel, get_peft_model

IDS = torch.tensor([[1, 5, 9, 33, 2, 60, 17, 8], [4, 4, 40, 3, 22, 63, 0, 11]])


def fixture(out):
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=64, tie_word_embeddings=False,
                      rope_theta=10000.0, torch_dtype="float32")
    base = Qwen3ForCausalLM(cfg).eval()
    base.save_pretrained(os.path.join(out, "base"), safe_serialization=True)
    lc = LoraConfig(r=4, lora_alpha=8, use_rslora=True, lora_dropout=0.0, task_type="CAUSAL_LM",
                    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                    modules_to_save=["lm_head"])
    model = get_peft_model(base, lc)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(os.path.join(out, "adapter"))
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=IDS).logits.float().contiguous()
    save_file({"input_ids": IDS.contiguous(), "logits": logits}, os.path.join(out, "logits.safetensors"))
    print("logits", tuple(logits.shape), "written to", out)


def check(base, adapter, merged):
    b = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    with_adapter = PeftModel.from_pretrained(b, adapter).eval()
    m = AutoModelForCausalLM.from_pretrained(merged, torch_dtype=torch.float32).eval()
    ids = IDS % b.config.vocab_size
    with torch.no_grad():
        a = with_adapter(input_ids=ids).logits
        c = m(input_ids=ids).logits
    diff = (a - c).abs().max().item()
    scale = a.abs().max().item()
    print(f"peft(base + Fabrica adapter) vs Fabrica merged export: max |diff| {diff:.3e} (logit scale {scale:.3f})")
    return 0 if diff <= 1e-4 * max(1.0, scale) else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "fixture":
        fixture(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "check":
        sys.exit(check(*sys.argv[2:]))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)

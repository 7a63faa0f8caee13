#!/usr/bin/env python3
"""LoRA on qwen3_moe, qwen2_moe and mixtral as LLaMA-Factory sets it up for lora_target all, run by
hand with a venv holding torch, transformers >= 5 and peft (written with torch 2.15.0,
transformers 5.25.0, peft 0.21.2; the versions land in each file's metadata):

  python tests/reference/make_moe_lora_fixture.py

For each tiny folder make_moe_reference.py wrote (tests/reference/moe/F, per-expert layout):
LLaMA-Factory's targets for lora_target all (find_all_linear_modules: every nn.Linear's own name
but lm_head's; in transformers 5 the experts are 3-D parameters and the routers are not nn.Linear,
so they get none: attention everywhere, the dense layers' and the shared expert's projections, and
qwen2_moe's shared_expert_gate), a PEFT model with r 4, lora_alpha 8, lora_dropout 0 on them, B
made non-zero so the adapters change the logits, and on that folder's batch with the
load-balancing loss on (output_router_logits, router_aux_loss_coef 0.1, as moe_aux_loss_coef).
(qwen3_moe: attention only; see main() on peft's target_parameters.)
  F_lora/: the adapter as peft saves it (adapter_config.json, adapter_model.safetensors);
  F_lora/reference.safetensors:
    logits (padding rows zero), loss (cross-entropy + coef * aux), aux_loss;
    grad.<saved name>: the gradient of that loss for every adapter tensor, by the adapter file's
      names (base_model.model....lora_A.weight).
"""
import json
import os

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe")


def find_all_linear_modules(model):
    """LLaMA-Factory's (src/llamafactory/model/model_utils/misc.py) for a text-only model."""
    names = set()
    for name, module in model.named_modules():
        if "lm_head" in name:
            continue
        if "Linear" in module.__class__.__name__ and "Embedding" not in module.__class__.__name__:
            names.add(name.split(".")[-1])
    return sorted(names)


def main():
    for name in ["qwen3_moe", "qwen2_moe", "mixtral"]:
        ref = load_file(os.path.join(HERE, name, "reference.safetensors"))
        ids, labels, lengths = ref["input_ids"], ref["labels"], ref["lengths"]
        mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
        model = AutoModelForCausalLM.from_pretrained(os.path.join(HERE, name), dtype=torch.float32)
        model.config.output_router_logits = True
        targets = find_all_linear_modules(model)
        if name == "qwen3_moe":
            # peft 0.21 turns gate_proj / up_proj / down_proj on qwen3_moe (by short or full name)
            # into target_parameters on the fused experts (a LoRA inside each expert, rank_pattern
            # 2r on gate_up_proj) and then adapts no dense layer's MLP. Fabrica adapts the dense
            # layers' linears and never the experts, so this fixture adapts attention only.
            targets = [t for t in targets if t not in ("gate_proj", "up_proj", "down_proj")]
        torch.manual_seed(3)  # peft draws A
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets,
                                                 task_type="CAUSAL_LM"))
        gen = torch.Generator().manual_seed(4)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        adapter_dir = os.path.join(HERE, name + "_lora")
        model.save_pretrained(adapter_dir)
        os.remove(os.path.join(adapter_dir, "README.md"))  # peft's model card template
        config_path = os.path.join(adapter_dir, "adapter_config.json")
        with open(config_path) as f:
            config = json.load(f)
        config["base_model_name_or_path"] = "tests/reference/moe/" + name  # not this machine's path
        with open(config_path, "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
        model.train()
        out = model(input_ids=ids, attention_mask=mask, labels=labels, output_router_logits=True)
        out.loss.backward()
        tensors = {"logits": (out.logits * mask[..., None]).detach().contiguous(),
                   "loss": out.loss.detach().reshape(1), "aux_loss": out.aux_loss.detach().reshape(1)}
        for n, p in model.named_parameters():
            if p.requires_grad:
                tensors["grad." + n.replace(".default", "")] = p.grad.detach().contiguous()
        save_file(tensors, os.path.join(adapter_dir, "reference.safetensors"),
                  metadata={"transformers": transformers.__version__, "torch": torch.__version__,
                            "peft": peft.__version__, "targets": ",".join(targets)})
        print(name, "loss", out.loss.item(), "targets", targets,
              "adapters", sum(k.startswith("grad.") for k in tensors))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""LoRA on Qwen2-VL / Qwen2.5-VL as LLaMA-Factory 0.9 sets it up, run by hand with a venv holding
torch, transformers >= 5 and peft (used: torch 2.11, transformers 5.x, peft 0.18; the versions land
in each file's metadata):

  python make_vlm_lora_fixture.py OUT_DIR      (OUT_DIR = tests/reference/vlm)

For each of the tiny folders make_vlm_fixture.py wrote (OUT_DIR/qwen2_vl, OUT_DIR/qwen2_5_vl):
the LoRA targets LLaMA-Factory resolves for lora_target all with freeze_vision_tower false and
freeze_multi_modal_projector true (find_all_linear_modules, then patch_target_modules: the code
below is theirs, src/llamafactory/model/model_utils/misc.py and visual.py, for these two model
types), a PEFT model with r 4, lora_alpha 8, lora_dropout 0 on them, B made non-zero so the
adapters change the logits, and:
  OUT_DIR/NAME_lora/: the adapter as peft saves it (adapter_config.json, whose target_modules
    peft shrinks to the shortest suffixes that match the same modules, adapter_model.safetensors);
  OUT_DIR/NAME_lora_reference.safetensors, on make_vlm_fixture.py's batch (NAME_reference.safetensors):
    logits, loss (transformers' mean over the shifted targets);
    grad.<saved name>: the gradient of that loss for every adapter tensor, by the name the adapter
      file gives it (base_model.model....lora_A.weight);
    merged.<name>: every weight merge_and_unload() changed, by its transformers-5 name;
    merged_logits: the merged model's logits.
"""
import json
import os
import sys

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForImageTextToText

# LLaMA-Factory's COMPOSITE_MODELS entries for qwen2_vl and qwen2_5_vl (the same for both).
PROJECTOR_KEY = "visual.merger"
VISION_MODEL_KEYS = ["visual.patch_embed", "visual.blocks"]
LANGUAGE_MODEL_KEYS = ["language_model", "lm_head"]
LORA_CONFLICT_KEYS = ["patch_embed"]


def find_all_linear_modules(model, freeze_vision_tower):
    forbidden = {"lm_head", PROJECTOR_KEY}
    if freeze_vision_tower:
        forbidden.update(VISION_MODEL_KEYS)
    names = set()
    for name, module in model.named_modules():
        if any(f in name for f in forbidden):
            continue
        if "Linear" in module.__class__.__name__ and "Embedding" not in module.__class__.__name__:
            names.add(name.split(".")[-1])
    return list(names)


def patch_target_modules(model, targets, freeze_vision_tower, freeze_projector, freeze_language_model):
    forbidden = set()
    if freeze_vision_tower:
        forbidden.update(VISION_MODEL_KEYS)
    if freeze_projector:
        forbidden.add(PROJECTOR_KEY)
    if freeze_language_model:
        forbidden.update(LANGUAGE_MODEL_KEYS)
    forbidden.update(LORA_CONFLICT_KEYS)
    return [name for name, _ in model.named_modules()
            if any(t in name for t in targets) and not any(f in name for f in forbidden)]


def saved_name(name):
    return name.replace(".default", "")


def main(out):
    for name in ["qwen2_vl", "qwen2_5_vl"]:
        ref = load_file(os.path.join(out, name + "_reference.safetensors"))
        torch.manual_seed(3)
        model = AutoModelForImageTextToText.from_pretrained(os.path.join(out, name), dtype=torch.float32)
        targets = patch_target_modules(model, find_all_linear_modules(model, False), False, True, False)
        lc = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM")
        model = get_peft_model(model, lc)
        gen = torch.Generator().manual_seed(4)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        adapter_dir = os.path.join(out, name + "_lora")
        model.save_pretrained(adapter_dir)
        os.remove(os.path.join(adapter_dir, "README.md"))  # peft's model card template
        kwargs = dict(input_ids=ref["input_ids"], labels=ref["labels"], pixel_values=ref["pixel_values"],
                      image_grid_thw=ref["image_grid_thw"], mm_token_type_ids=(ref["input_ids"] == 60).int())
        model.train()
        outputs = model(**kwargs)
        outputs.loss.backward()
        tensors = {"logits": outputs.logits.detach().contiguous(), "loss": outputs.loss.detach().reshape(1)}
        for n, p in model.named_parameters():
            if p.requires_grad:
                tensors["grad." + saved_name(n)] = p.grad.detach().contiguous()
        before = {n.replace(".base_layer", ""): p.detach().clone()
                  for n, p in model.base_model.model.named_parameters() if "lora_" not in n}
        merged = model.merge_and_unload()
        merged.eval()
        for n, p in merged.named_parameters():
            if not torch.equal(p, before[n]):
                tensors["merged." + n] = p.detach().contiguous()
        with torch.no_grad():
            tensors["merged_logits"] = merged(**{k: v for k, v in kwargs.items() if k != "labels"}).logits.contiguous()
        save_file(tensors, os.path.join(out, name + "_lora_reference.safetensors"),
                  metadata={"transformers": transformers.__version__, "torch": torch.__version__,
                            "peft": peft.__version__})
        merged_count = sum(k.startswith("merged.") for k in tensors)
        print(name, "loss", outputs.loss.item(), "targets", len(targets), "merged tensors", merged_count)


if __name__ == "__main__":
    main(sys.argv[1])

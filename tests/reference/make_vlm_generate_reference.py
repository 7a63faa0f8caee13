#!/usr/bin/env python3
"""Greedy generation with images on the committed tiny Qwen2-VL / Qwen2.5-VL folders, run by hand in a
venv holding torch and transformers >= 5 (used: torch 2.15.0, transformers 5.25.0):

  python make_vlm_generate_reference.py VLM_DIR      (VLM_DIR: tests/reference/vlm)

For each of VLM_DIR/qwen2_vl and VLM_DIR/qwen2_5_vl (written by make_vlm_fixture.py), two prompts run
one at a time through transformers' own generate(do_sample=False) with pixel_values, image_grid_thw
and mm_token_type_ids, as the processor hands them over:
  prompt 0: text, an image (grid 1x6x8), text, a second image (1x4x4), text;
  prompt 1: an image (1x4x6) first, then text.
The pixel values are those of NAME_reference.safetensors (images 0 and 1, then image 2). Written to
VLM_DIR/NAME_generate_reference.safetensors: prompt_P (T) i64, pixels_P, grid_P, and for the
NEW generated tokens tokens_P (NEW) i64 and logits_P (NEW, vocab): the raw logits each token was
picked from (the first from the prompt's pass, whose M-RoPE positions include the images; the
others from decode steps at positions shifted by the rope delta).
"""
import os
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import Qwen2VLForConditionalGeneration, Qwen2_5_VLForConditionalGeneration

IMAGE, START, END = 60, 58, 59
NEW = 10


def image_run(grid):
    return [START] + [IMAGE] * int(grid.prod() // 4) + [END]


def main(vlm_dir):
    classes = {"qwen2_vl": Qwen2VLForConditionalGeneration, "qwen2_5_vl": Qwen2_5_VLForConditionalGeneration}
    for name, cls in classes.items():
        model = cls.from_pretrained(os.path.join(vlm_dir, name), dtype=torch.float32).eval()
        ref = load_file(os.path.join(vlm_dir, name + "_reference.safetensors"))
        grids, pixels = ref["image_grid_thw"], ref["pixel_values"]
        first = [0] + torch.cumsum(grids.prod(dim=1), 0).tolist()
        gen = torch.Generator().manual_seed(3)
        text = lambda n: torch.randint(3, 50, (n,), generator=gen).tolist()
        prompts = [(text(3) + image_run(grids[0]) + text(4) + image_run(grids[1]) + text(2), [0, 1]),
                   (image_run(grids[2]) + text(3), [2])]
        tensors = {}
        for p, (ids, images) in enumerate(prompts):
            input_ids = torch.tensor([ids])
            grid = grids[images]
            pixel_values = torch.cat([pixels[first[i]:first[i + 1]] for i in images])
            with torch.no_grad():
                out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                     pixel_values=pixel_values, image_grid_thw=grid,
                                     mm_token_type_ids=(input_ids == IMAGE).int(), max_new_tokens=NEW,
                                     min_new_tokens=NEW, do_sample=False, output_logits=True,
                                     return_dict_in_generate=True)
            tensors[f"prompt_{p}"] = input_ids[0].clone()
            tensors[f"pixels_{p}"] = pixel_values.contiguous()
            tensors[f"grid_{p}"] = grid.contiguous()
            tensors[f"tokens_{p}"] = out.sequences[0, len(ids):].clone()
            tensors[f"logits_{p}"] = torch.cat(out.logits).contiguous()
            print(name, "prompt", p, len(ids), "tokens", tensors[f"tokens_{p}"].tolist())
        save_file(tensors, os.path.join(vlm_dir, name + "_generate_reference.safetensors"),
                  metadata={"transformers": transformers.__version__, "torch": torch.__version__})


if __name__ == "__main__":
    main(sys.argv[1])

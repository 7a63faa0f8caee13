#!/usr/bin/env python3
"""Qwen2-VL and Qwen2.5-VL fixture, run by hand with a venv holding torch and transformers >= 5
(used: torch 2.15.0, transformers 5.25.0; /work/venvs/hf):

  python make_vlm_fixture.py OUT_DIR      (writes OUT_DIR/qwen2_vl/ and OUT_DIR/qwen2_5_vl/)

Per model type, a tiny Qwen2VLForConditionalGeneration / Qwen2_5_VLForConditionalGeneration with
random weights written by transformers itself (save_pretrained: config.json with text_config and
vision_config, transformers-5 tensor names), and NAME_reference.safetensors beside it with, for one batch of two
rows (row 0: two images with text between them, row 1: one image) and random pixel_values in
the processor's layout (patches x channels*2*patch*patch):
  input_ids, labels, pixel_values, image_grid_thw;
  position_ids: get_rope_index's (3, B, T);
  vision_out: the vision tower's merged features (model.visual(...).pooler_output);
  logits; loss (mean over the shifted targets, transformers' ForCausalLMLoss);
  grad.<name>: the gradient of that loss for every parameter (transformers-5 names);
  greedy_prompt, greedy_tokens: a text-only prompt and the 8 tokens greedy generate() adds;
  adamw_losses: the losses of 3 AdamW steps (lr 1e-3, weight decay 0.01 on tensors of >= 2
  dimensions only, as Fabrica and LLaMA-Factory group them), the first being `loss`.
The tower uses patch_size 4 (96 values per patch, not 1176) to keep the fixture small; the code
paths are those of patch_size 14. Qwen2.5-VL's window_size 16 makes windows of 2x2 merge groups,
so the 6x8-patch image spans several windows, one of them partial; block 1 is a full-attention block.
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import (Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2_5_VLConfig,
                          Qwen2_5_VLForConditionalGeneration)

IMAGE, VIDEO, START, END = 60, 61, 58, 59
VOCAB = 64
GRIDS = torch.tensor([[1, 6, 8], [1, 4, 4], [1, 4, 6]])  # row 0: images 0 and 1; row 1: image 2
TEXT = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]})
VISION = dict(depth=2, num_heads=2, in_channels=3, patch_size=4, spatial_merge_size=2, temporal_patch_size=2)


def configs():
    qwen2 = Qwen2VLConfig(text_config=dict(TEXT), vision_config=dict(VISION, embed_dim=16, mlp_ratio=2, hidden_size=32),
                          image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START,
                          vision_end_token_id=END, tie_word_embeddings=False)
    qwen25 = Qwen2_5_VLConfig(text_config=dict(TEXT),
                              vision_config=dict(VISION, hidden_size=16, intermediate_size=24, out_hidden_size=32,
                                                 window_size=16, fullatt_block_indexes=[1]),
                              image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START,
                              vision_end_token_id=END, tie_word_embeddings=False)
    return {"qwen2_vl": (qwen2, Qwen2VLForConditionalGeneration), "qwen2_5_vl": (qwen25, Qwen2_5_VLForConditionalGeneration)}


def image_run(grid):
    return [START] + [IMAGE] * int(grid.prod() // 4) + [END]


def batch(gen):
    text = lambda n: torch.randint(0, 50, (n,), generator=gen).tolist()
    row0 = text(3) + image_run(GRIDS[0]) + text(4) + image_run(GRIDS[1]) + text(5)
    row1 = text(2) + image_run(GRIDS[2]) + text(6)
    T = max(len(row0), len(row1))
    rows = [row0 + [0] * (T - len(row0)), row1 + text(T - len(row1))]
    ids = torch.tensor(rows)
    labels = ids.clone()
    labels[ids == IMAGE] = -100
    labels[0, len(row0):] = -100  # row 0's padding
    labels[:, :2] = -100
    return ids, labels


def main(out):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    ids, labels = batch(gen)
    for name, (config, cls) in configs().items():
        torch.manual_seed(2)
        model = cls(config).float().eval()
        with torch.no_grad():  # non-trivial norms and biases
            for n, p in model.named_parameters():
                if p.ndim == 1:
                    p.add_(0.1 * torch.randn(p.shape, generator=gen))
        folder = os.path.join(out, name)
        model.save_pretrained(folder)
        patch_values = 3 * 2 * 4 * 4
        pixel_values = torch.randn(int(GRIDS.prod(dim=1).sum()), patch_values, generator=gen)
        mm = (ids == IMAGE).int()
        position_ids, _ = model.model.get_rope_index(ids, mm, image_grid_thw=GRIDS)
        tensors = {"input_ids": ids, "labels": labels, "pixel_values": pixel_values, "image_grid_thw": GRIDS,
                   "position_ids": position_ids.contiguous()}
        with torch.no_grad():
            tensors["vision_out"] = model.model.visual(pixel_values, grid_thw=GRIDS).pooler_output.contiguous()
            prompt = ids[1:, 10:16]  # text only: M-RoPE's positions are the plain ones
            greedy = model.generate(prompt, max_new_tokens=8, do_sample=False, min_new_tokens=8)
            tensors["greedy_prompt"], tensors["greedy_tokens"] = prompt.clone(), greedy[:, 6:].clone()
        model.train()
        kwargs = dict(input_ids=ids, labels=labels, pixel_values=pixel_values, image_grid_thw=GRIDS,
                      mm_token_type_ids=mm)
        outputs = model(**kwargs)
        outputs.loss.backward()
        tensors["logits"] = outputs.logits.detach().contiguous()
        tensors["loss"] = outputs.loss.detach().reshape(1)
        for n, p in model.named_parameters():
            tensors["grad." + n] = p.grad.detach().contiguous()
        decay = [p for p in model.parameters() if p.ndim >= 2]
        rest = [p for p in model.parameters() if p.ndim < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                                lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
        losses = [outputs.loss.item()]
        opt.step()
        for _ in range(2):
            opt.zero_grad()
            loss = model(**kwargs).loss
            loss.backward()
            opt.step()
            losses.append(loss.item())
        tensors["adamw_losses"] = torch.tensor(losses)
        save_file(tensors, os.path.join(out, name + "_reference.safetensors"),
                  metadata={"transformers": transformers.__version__, "torch": torch.__version__})
        print(name, "loss", losses, "tokens", ids.shape)


if __name__ == "__main__":
    main(sys.argv[1])

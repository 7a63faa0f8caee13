#!/usr/bin/env python3
"""Transformers peer of the vision-language bench (bench/vlm_bench.sh): what LLaMA-Factory runs for
a Qwen2.5-VL SFT, through transformers' own modeling code and image processors.

make-model DIR   writes the bench model as an HF folder (random init, std 0.02, seed 0):
                 Qwen2_5_VLForConditionalGeneration, text hidden 512, 4 layers, 8 heads x 64
                 (4 kv heads), intermediate 1408, vocab 8192; vision tower depth 4, width 256,
                 4 heads, intermediate 512, patch 14, merge 2, window 112, full attention at
                 blocks 1 and 3; and Qwen2-VL's preprocessor_config.json.
make-images DIR  writes the image set of the preprocessing bench: photo-like JPEGs and a PNG of the
                 sizes users send (640x480 to 1920x1080, one portrait), seeded.
train            trains the folder as LLaMA-Factory's default freezing does (freeze_vision_tower,
                 freeze_multi_modal_projector: the tower and merger frozen, the language model
                 trained in full): batch 4 rows x 512 tokens, each row one 448x448 image (1024
                 patches, 256 image tokens) between vision_start / vision_end, then random text;
                 labels the ids with the image tokens -100; sdpa attention; AdamW(lr 3e-4,
                 weight_decay 0.1), clip_grad_norm_(1.0). --train-tower trains tower and merger too.
images FILES     LLaMA-Factory's image path on each file, as its Qwen2-VL plugin feeds the processor
                 (PIL open, the image_max_pixels 768x768 pre-resize, RGB), then transformers'
                 Qwen2-VL image processor (--processor pil, or fast: transformers 5's default, on torchvision); images/s.

train and images print one JSON line.
"""
import argparse
import json
import math
import os
import resource
import sys
import time
import warnings

warnings.filterwarnings("ignore", message=".*Failed to initialize NumPy.*")

VOCAB, IMAGE_PAD, VISION_START, VISION_END, VIDEO_PAD = 8192, 8190, 8188, 8189, 8191
BATCH, SEQ, IMAGE_SIDE = 4, 512, 448
PATCH, MERGE, TEMPORAL = 14, 2, 2
LR, WEIGHT_DECAY, CLIP = 3e-4, 0.1, 1.0
LF_MAX_PIXELS, LF_MIN_PIXELS = 768 * 768, 32 * 32


def make_model(folder):
    import torch
    import transformers
    torch.manual_seed(0)
    text = dict(vocab_size=VOCAB, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 8, 8]},
                tie_word_embeddings=False, initializer_range=0.02, bos_token_id=8186, eos_token_id=8187)
    vision = dict(depth=4, hidden_size=256, num_heads=4, intermediate_size=512, patch_size=PATCH,
                  spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL, window_size=112,
                  fullatt_block_indexes=[1, 3], out_hidden_size=512, in_channels=3, initializer_range=0.02)
    config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE_PAD,
                                           video_token_id=VIDEO_PAD, vision_start_token_id=VISION_START,
                                           vision_end_token_id=VISION_END, tie_word_embeddings=False)
    model = transformers.Qwen2_5_VLForConditionalGeneration._from_config(config)
    model.save_pretrained(folder)
    with open(os.path.join(folder, "preprocessor_config.json"), "w") as f:  # Qwen2-VL-2B's
        json.dump({"do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
                   "image_mean": [0.48145466, 0.4578275, 0.40821073],
                   "image_processor_type": "Qwen2VLImageProcessor",
                   "image_std": [0.26862954, 0.26130258, 0.27577711], "max_pixels": 12845056, "merge_size": 2,
                   "min_pixels": 3136, "patch_size": 14, "resample": 3, "rescale_factor": 0.00392156862745098,
                   "size": {"longest_edge": 12845056, "shortest_edge": 3136}, "temporal_patch_size": 2}, f)
    return 0


def make_images(folder):
    import numpy as np
    from PIL import Image
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    sizes = [(640, 480, "jpg"), (1024, 768, "jpg"), (1280, 960, "jpg"), (1920, 1080, "jpg"), (768, 1024, "jpg"),
             (800, 600, "png")]
    for i, (w, h, ext) in enumerate(sizes):
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        base = np.stack([128 + 100 * np.sin(x / (37 + 11 * c) + y / (53 + 7 * c) + c) for c in range(3)], -1)
        pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, f"{i}_{w}x{h}.{ext}"), quality=90)
    return 0


def batch(torch, gen):
    """One training batch: ids, labels, pixel_values, image_grid_thw."""
    grid = IMAGE_SIDE // PATCH
    image_tokens = grid * grid // (MERGE * MERGE)
    ids = torch.randint(0, 8000, (BATCH, SEQ), generator=gen)
    ids[:, 0] = VISION_START
    ids[:, 1:1 + image_tokens] = IMAGE_PAD
    ids[:, 1 + image_tokens] = VISION_END
    labels = ids.clone()
    labels[ids == IMAGE_PAD] = -100
    values = 3 * TEMPORAL * PATCH * PATCH
    pixels = torch.randn(BATCH * grid * grid, values, generator=gen)
    thw = torch.tensor([[1, grid, grid]] * BATCH)
    return ids, labels, pixels, thw


def train(args):
    import torch
    import_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    import transformers
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_peer import time_steps

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(args.folder, attn_implementation="sdpa",
                                                                           dtype=torch.float32)
    model.train()
    for name, p in model.named_parameters():  # LLaMA-Factory's vision_model_keys / projector_key
        if not args.train_tower and (".visual." in "." + name or name.startswith("visual.")):
            p.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=LR, weight_decay=WEIGHT_DECAY)
    gen = torch.Generator().manual_seed(1)
    total = args.warmup + args.steps
    data = [batch(torch, gen) for _ in range(total)]

    def step(i):
        ids, labels, pixels, thw = data[i]
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels, pixel_values=pixels,
                     image_grid_thw=thw).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, CLIP)
        opt.step()
        return loss.item()

    timed = time_steps(step, args.warmup, total, "vlm_peer")
    if timed is None:
        return 1
    loss, elapsed = timed
    print(json.dumps({
        "impl": "transformers", "torch": torch.__version__, "transformers": transformers.__version__,
        "model": "vlm", "train_tower": args.train_tower, "precision": "fp32", "threads": torch.get_num_threads(),
        "tokens_per_s": round(BATCH * SEQ * args.steps / elapsed, 1),
        "step_ms": round(elapsed * 1000.0 / args.steps, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
        "final_loss": round(loss, 5), "import_rss_mb": round(import_rss, 1),
    }))
    return 0


def lf_preprocess(image):
    """LLaMA-Factory's Qwen2VLPlugin._preprocess_image with its default pixel bounds."""
    from PIL import Image
    if image.width * image.height > LF_MAX_PIXELS:
        f = math.sqrt(LF_MAX_PIXELS / (image.width * image.height))
        image = image.resize((int(image.width * f), int(image.height * f)))
    if image.width * image.height < LF_MIN_PIXELS:
        f = math.sqrt(LF_MIN_PIXELS / (image.width * image.height))
        image = image.resize((int(image.width * f), int(image.height * f)))
    if min(image.width, image.height) < 28:
        image = image.resize((max(image.width, 28), max(image.height, 28)))
    if image.width / image.height > 200:
        image = image.resize((image.height * 180, image.height))
    if image.height / image.width > 200:
        image = image.resize((image.width, image.width * 180))
    return image.convert("RGB") if image.mode != "RGB" else image


def images(args):
    import torch
    from PIL import Image
    import transformers
    torch.set_num_threads(args.threads)
    if args.processor == "pil":
        processor = transformers.Qwen2VLImageProcessorPil.from_pretrained(args.folder)
    else:
        processor = transformers.Qwen2VLImageProcessor.from_pretrained(args.folder)  # torchvision

    def once():
        patches = 0
        for path in args.files:
            image = lf_preprocess(Image.open(path))
            out = processor(images=[image], return_tensors="pt")
            patches += int(out["pixel_values"].shape[0])
        return patches

    for _ in range(args.warmup):
        once()
    start = time.perf_counter()
    patches = sum(once() for _ in range(args.repeat))
    elapsed = time.perf_counter() - start
    print(json.dumps({"impl": "transformers", "processor": args.processor, "threads": torch.get_num_threads(),
                      "images": len(args.files) * args.repeat, "patches": patches,
                      "images_per_s": round(len(args.files) * args.repeat / elapsed, 2)}))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("make-model").add_argument("folder")
    sub.add_parser("make-images").add_argument("folder")
    t = sub.add_parser("train")
    t.add_argument("--folder", required=True)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--warmup", type=int, default=1)
    t.add_argument("--steps", type=int, default=3)
    t.add_argument("--train-tower", action="store_true")
    i = sub.add_parser("images")
    i.add_argument("--folder", required=True, help="where preprocessor_config.json is")
    i.add_argument("--processor", choices=["pil", "fast"], default="pil")
    i.add_argument("--threads", type=int, default=2)
    i.add_argument("--warmup", type=int, default=1)
    i.add_argument("--repeat", type=int, default=5)
    i.add_argument("files", nargs="+")
    args = ap.parse_args()
    if args.command == "make-model":
        return make_model(args.folder)
    if args.command == "make-images":
        return make_images(args.folder)
    if args.command == "train":
        return train(args)
    return images(args)


if __name__ == "__main__":
    sys.exit(main())

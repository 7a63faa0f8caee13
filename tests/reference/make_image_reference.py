"""Reference for src/image (tests/image/qwen2_vl_processor_test.cpp): Qwen2-VL's image pipeline as
LLaMA-Factory runs it, written to tests/reference/image/.

Made with llamafactory 0.9.5 (its Qwen2VLPlugin._regularize_images: the pre-resize into
[image_min_pixels, image_max_pixels], sides >= 28, aspect <= 200, RGB), transformers 5.25.0
(Qwen2VLImageProcessorPil, the PIL path) and Pillow 13.0.0:

  /work/venvs/lf/bin/python tests/reference/make_image_reference.py ../shared tests/reference/image

For each image the fixture keeps image_grid_thw, the processor's value for each uint8 level and
channel (rescale then normalise: every pixel value is one of these 3 x 256 floats, checked here
bit for bit), HF's resized image as a lossless PNG (the full pixel_values rebuilt from it by the
same patch order are checked here to equal HF's bit for bit), and 256 of HF's pixel_values read
straight from its output at random flat indices (so the patch order is checked too).

Inputs: the mllm_demo JPEGs of ../shared/data/llamafactory, and PNGs made here (committed):
a tall 1:150 strip, a 1000x700 RGB image above the default image_max_pixels (its resized image
is not kept: the sampled values check it), an RGBA image larger than image_max_pixels (premultiplied pre-resize; a
lower image_max_pixels keeps it small), a palette image larger than it (nearest pre-resize), a small grey image (raised to 28 and to
min_pixels), and a JPEG with EXIF orientation 6 for the decoder test.
"""
import json
import os
import sys

import numpy as np
from PIL import Image, ImageOps

os.environ.setdefault("DISABLE_VERSION_CHECK", "1")
import transformers  # noqa: E402
from llamafactory.data.mm_plugin import Qwen2VLPlugin  # noqa: E402
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil  # noqa: E402

# Qwen/Qwen2-VL-2B-Instruct's preprocessor_config.json.
PREPROCESSOR_CONFIG = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2VLProcessor",
}
IMAGE_MIN_PIXELS, IMAGE_MAX_PIXELS = 32 * 32, 768 * 768  # LLaMA-Factory's defaults
# The RGBA and palette images go through the pre-resize with a lower image_max_pixels (an LLaMA-Factory
# option), which keeps them and their fixtures small.
SMALL_MAX_PIXELS = {"rgba_300x201.png": 160 * 160, "palette_260x190.png": 160 * 160}
SAMPLES_ONLY = {"big_1000x700.png"}  # checked at the sampled indices only


def smooth_pattern(width, height, channels, seed):
    """Integer gradients with wrap-around and checker edges: small as PNG, still exercises the
    filters (smooth ramps, hard edges, values clipped at 0 and 255)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.int64)
    planes = []
    for c in range(channels):
        a, b = rng.integers(1, 4), rng.integers(1, 4)
        v = (a * x + b * y + 60 * ((x // 37 + y // 23 + c) % 2)) % 256
        planes.append(v.astype(np.uint8))
    return np.stack(planes, axis=-1)


def make_inputs(out_dir):
    made = {}
    tall = Image.fromarray(smooth_pattern(20, 3000, 3, 1), "RGB")  # 1:150
    tall.save(os.path.join(out_dir, "tall_20x3000.png"))
    made["tall_20x3000.png"] = tall
    rgba = smooth_pattern(300, 201, 4, 2)
    rgba[..., 3] = np.where((np.arange(300)[None, :] // 30) % 3 == 0, 255, rgba[..., 3])  # opaque, 0 and partial
    rgba[:40, :40, 3] = 0
    Image.fromarray(rgba, "RGBA").save(os.path.join(out_dir, "rgba_300x201.png"))
    made["rgba_300x201.png"] = None
    palette = Image.fromarray(smooth_pattern(260, 190, 3, 3), "RGB").quantize(colors=64, dither=Image.Dither.NONE)
    palette.save(os.path.join(out_dir, "palette_260x190.png"))
    made["palette_260x190.png"] = None
    big = Image.fromarray(smooth_pattern(1000, 700, 3, 6), "RGB")  # above the default image_max_pixels
    big.save(os.path.join(out_dir, "big_1000x700.png"))
    made["big_1000x700.png"] = None
    grey = Image.fromarray(smooth_pattern(33, 17, 1, 4)[..., 0], "L")
    grey.save(os.path.join(out_dir, "grey_33x17.png"))
    made["grey_33x17.png"] = None
    exif_image = Image.fromarray(smooth_pattern(40, 24, 3, 5), "RGB")
    exif = Image.Exif()
    exif[0x0112] = 6
    exif_image.save(os.path.join(out_dir, "exif6_40x24.jpg"), exif=exif, quality=95)
    return list(made)


def hf_lut(processor):
    ramp = np.tile(np.arange(256, dtype=np.uint8)[None, None, :], (3, 1, 1))  # channel-first, 3 x 1 x 256
    values = processor.normalize(processor.rescale(ramp, processor.rescale_factor), processor.image_mean,
                                 processor.image_std)
    return np.asarray(values, dtype=np.float32).reshape(3, 256)


def patchify(resized, grid_h, grid_w, m=2, p=14, t=2):
    """resized: H x W x 3 uint8 -> patches x (3 * t * p * p) level indices, transformers' order."""
    chw = resized.transpose(2, 0, 1)
    x = chw.reshape(3, grid_h // m, m, p, grid_w // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
    x = np.broadcast_to(x[:, :, :, :, :, None, :, :], (*x.shape[:5], t, *x.shape[5:]))
    return x.reshape(grid_h * grid_w, 3 * t * p * p)


def unpatchify(levels, grid_h, grid_w, m=2, p=14, t=2):
    x = levels.reshape(grid_h // m, grid_w // m, m, m, 3, t, p, p)[:, :, :, :, :, 0]
    x = x.transpose(4, 0, 2, 5, 1, 3, 6).reshape(3, grid_h * p, grid_w * p)
    return np.ascontiguousarray(x.transpose(1, 2, 0))


def main():
    shared, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "preprocessor_config.json"), "w") as f:
        json.dump(PREPROCESSOR_CONFIG, f, indent=2)
    processor = Qwen2VLImageProcessorPil(**{k: v for k, v in PREPROCESSOR_CONFIG.items() if "_type" not in k
                                            and k != "processor_class"})
    lut = hf_lut(processor)
    plugin = Qwen2VLPlugin(image_token="<|image_pad|>", video_token="<|video_pad|>", audio_token=None)
    made = make_inputs(out_dir)
    jpegs = [os.path.join(shared, "data/llamafactory/mllm_demo_data", f"{i}.jpg") for i in (1, 2, 3)]
    rng = np.random.default_rng(0)
    cases = []
    for path in jpegs + [os.path.join(out_dir, name) for name in made if not name.startswith("exif")]:
        max_pixels = SMALL_MAX_PIXELS.get(os.path.basename(path), IMAGE_MAX_PIXELS)
        image = plugin._regularize_images([path], image_min_pixels=IMAGE_MIN_PIXELS,
                                          image_max_pixels=max_pixels)["images"][0]
        out = processor(images=[image], return_tensors="np")
        pixels = np.asarray(out["pixel_values"], dtype=np.float32)
        _, grid_h, grid_w = (int(v) for v in out["image_grid_thw"][0])
        # Every value is one of the 256 levels of its channel: find them, and check the round trip.
        channel = np.tile(np.repeat(np.arange(3), 2 * 14 * 14), pixels.shape[0]).reshape(pixels.shape)
        levels = np.empty(pixels.shape, dtype=np.uint8)
        for c in range(3):
            sel = channel == c
            idx = np.searchsorted(lut[c], pixels[sel])
            idx = np.clip(idx, 0, 255)
            assert np.array_equal(lut[c][idx], pixels[sel]), f"{path}: a value outside the processor's levels"
            levels[sel] = idx
        resized = unpatchify(levels, grid_h, grid_w)
        assert np.array_equal(patchify(resized, grid_h, grid_w), levels), "patch order round trip"
        name = os.path.basename(path)
        png = os.path.splitext(name)[0] + ".hf_resized.png"
        if name in SAMPLES_ONLY:
            png = None  # its resized image would be a large fixture: the samples check its pixels
        else:
            Image.fromarray(resized, "RGB").save(os.path.join(out_dir, png), optimize=True)
        flat = pixels.reshape(-1)
        picks = np.sort(rng.choice(flat.size, size=256, replace=False))
        cases.append({
            "image": ("shared:" + os.path.relpath(path, shared)) if path in jpegs else name,
            "image_min_pixels": IMAGE_MIN_PIXELS,
            "image_max_pixels": max_pixels,
            "regularized_size": [image.width, image.height],
            "grid_thw": [1, grid_h, grid_w],
            "hf_resized": png,
            "samples": [[int(i), float(flat[i])] for i in picks],
        })
    # The decoder's EXIF orientation against Pillow's exif_transpose.
    exif_path = os.path.join(out_dir, "exif6_40x24.jpg")
    transposed = np.asarray(ImageOps.exif_transpose(Image.open(exif_path)).convert("RGB"))
    Image.fromarray(transposed, "RGB").save(os.path.join(out_dir, "exif6_40x24.pillow.png"))
    reference = {
        "versions": {"transformers": transformers.__version__, "pillow": Image.__version__,
                     "llamafactory": "0.9.5"},
        "lut": lut.tolist(),
        "cases": cases,
        "exif": {"file": "exif6_40x24.jpg", "pillow": "exif6_40x24.pillow.png"},
    }
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(reference, f)


if __name__ == "__main__":
    main()

"""Reference for the multimodal datasets (tests/dataset/multimodal_test.cpp): what LLaMA-Factory
itself makes of its mllm_demo dataset (../shared/data/llamafactory, untouched) under the qwen2_vl
template, written to tests/reference/mllm/reference.json.

LLaMA-Factory 0.9.5's own code runs: _load_single_dataset (the sharegpt converter, the images column
and media_dir), get_template_and_fix_tokenizer("qwen2_vl"), its Qwen2VLPlugin (pre-resize into
[image_min_pixels, image_max_pixels], <image> -> <|vision_start|><|image_pad|>*n<|vision_end|>) and
SupervisedDatasetProcessor, with the shared Qwen3 tokenizer (it has Qwen2-VL's vision tokens) and
transformers 5.25.0's Qwen2VLImageProcessorPil with Qwen2-VL-2B-Instruct's preprocessor_config.json
(tests/reference/image/preprocessor_config.json). Two settings: LLaMA-Factory's defaults with
cutoff_len 2048, and image_max_pixels 128*128 with cutoff_len 96 (which cuts text, and images).

  /work/venvs/lf/bin/python tests/reference/make_mllm_reference.py ../shared tests/reference/mllm
"""
import json
import os
import sys
import types

os.environ.setdefault("DISABLE_VERSION_CHECK", "1")
os.environ.setdefault("HF_DATASETS_CACHE", "/tmp/fab_lf_datasets_cache")

import transformers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil  # noqa: E402

from llamafactory.data.loader import _load_single_dataset  # noqa: E402
from llamafactory.data.parser import get_dataset_list  # noqa: E402
from llamafactory.data.processor import SupervisedDatasetProcessor  # noqa: E402
from llamafactory.data.template import get_template_and_fix_tokenizer  # noqa: E402
from llamafactory.hparams import DataArguments, ModelArguments  # noqa: E402
from transformers import Seq2SeqTrainingArguments  # noqa: E402

SETTINGS = [
    {"name": "defaults", "cutoff_len": 2048, "image_min_pixels": 32 * 32, "image_max_pixels": 768 * 768},
    {"name": "small", "cutoff_len": 96, "image_min_pixels": 32 * 32, "image_max_pixels": 128 * 128},
]


def main():
    shared, out_dir = sys.argv[1], sys.argv[2]
    here = os.path.dirname(os.path.abspath(__file__))
    config = json.load(open(os.path.join(here, "image", "preprocessor_config.json")))
    dataset_dir = os.path.join(shared, "data", "llamafactory")
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(shared, "data", "tokenizers", "qwen3"))
    results = []
    for setting in SETTINGS:
        data_args = DataArguments(template="qwen2_vl", dataset="mllm_demo", dataset_dir=dataset_dir,
                                  cutoff_len=setting["cutoff_len"])
        model_args = ModelArguments(model_name_or_path="unused")
        training_args = Seq2SeqTrainingArguments(output_dir="/tmp/fab_lf_out")
        template = get_template_and_fix_tokenizer(tokenizer, data_args)
        image_processor = Qwen2VLImageProcessorPil(
            **{k: v for k, v in config.items() if k not in ("image_processor_type", "processor_class")})
        processor = types.SimpleNamespace(image_processor=image_processor, tokenizer=tokenizer,
                                          image_min_pixels=setting["image_min_pixels"],
                                          image_max_pixels=setting["image_max_pixels"],
                                          model_input_names=["pixel_values", "image_grid_thw"])
        dataset_attr = get_dataset_list(["mllm_demo"], dataset_dir)[0]
        dataset = _load_single_dataset(dataset_attr, model_args, data_args, training_args)
        proc = SupervisedDatasetProcessor(template=template, tokenizer=tokenizer, processor=processor,
                                          data_args=data_args)
        batch = {k: dataset[k] for k in dataset.column_names}
        out = proc.preprocess_dataset(batch)
        samples = []
        for i in range(len(out["input_ids"])):
            images = out["images"][i] or []
            grids = []
            if images:
                grids = [[int(v) for v in g] for g in
                         template.mm_plugin._get_mm_inputs(images, [], [], processor)["image_grid_thw"]]
            samples.append({"input_ids": out["input_ids"][i], "labels": out["labels"][i],
                            "images": [os.path.relpath(p, dataset_dir) for p in images], "grid_thw": grids})
        results.append({**setting, "samples": samples})
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump({"versions": {"llamafactory": "0.9.5", "transformers": transformers.__version__},
                   "settings": results}, f)


if __name__ == "__main__":
    main()

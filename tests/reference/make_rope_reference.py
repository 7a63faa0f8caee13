"""RoPE frequencies computed by Hugging Face transformers itself, for the configs in CASES:
writes tests/reference/rope_transformers.json (committed), which tests/models/rope_scaling_test.cpp
and make_reference.py's scaled-RoPE models read.

Needs torch and transformers, which `make test` does not install (several GB); run by hand in a
venv that has both, e.g. the benchmark's:
    bench/.venv/bin/pip install transformers
    bench/.venv/bin/python tests/reference/make_rope_reference.py
Each config is written as config.json and loaded with AutoConfig.from_pretrained, as a user's
folder would be; the model family's rotary embedding module gives inv_freq and attention_scaling.
"""
import importlib
import json
import os
import sys
import tempfile

import torch
import transformers
from transformers import AutoConfig

BASE = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}

CASES = {
    "llama_theta_top_level": {"model_type": "llama", "rope_theta": 500000.0, "max_position_embeddings": 2048},
    "qwen3_transformers5_rope_parameters": {
        "model_type": "qwen3", "max_position_embeddings": 40960,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
    "llama_no_theta": {"model_type": "llama", "max_position_embeddings": 2048},
    "llama_linear": {"model_type": "llama", "rope_theta": 10000.0, "max_position_embeddings": 8192,
                     "rope_scaling": {"type": "linear", "factor": 4.0}},
    "llama_dynamic": {"model_type": "llama", "rope_theta": 10000.0, "max_position_embeddings": 4096,
                      "rope_scaling": {"type": "dynamic", "factor": 2.0}},
    "qwen2_yarn": {"model_type": "qwen2", "rope_theta": 1000000.0, "max_position_embeddings": 131072,
                   "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}},
    "qwen3_yarn_mscale_betas": {
        "model_type": "qwen3", "max_position_embeddings": 65536,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 8.0,
                            "original_max_position_embeddings": 8192, "mscale": 0.707, "mscale_all_dim": 1.0,
                            "beta_fast": 16, "beta_slow": 2}},
    "llama31_llama3": {"model_type": "llama", "rope_theta": 500000.0, "max_position_embeddings": 131072,
                       "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
    "mistral_transformers5_llama3": {
        "model_type": "mistral", "max_position_embeddings": 32768, "head_dim": 64, "hidden_size": 256,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 1000000.0, "factor": 32.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}},
    # The scaled-RoPE models of make_reference.py (a small original context, so that the scaling
    # changes most pairs within its 16-token sequences).
    "reference_llama_llama3": {
        "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 128,
        "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 32}},
    "reference_qwen2_yarn": {
        "model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 128,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                            "original_max_position_embeddings": 32}},
}

ROTARY = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral"}


def frequencies(config_dict):
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config_dict, f)
        config = AutoConfig.from_pretrained(folder)
    kind = config_dict["model_type"]
    module = importlib.import_module(f"transformers.models.{kind}.modeling_{kind}")
    rotary = getattr(module, f"{ROTARY[kind]}RotaryEmbedding")(config)
    return [float(x) for x in rotary.inv_freq.tolist()], float(rotary.attention_scaling)


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rope_transformers.json")
    cases = []
    for name, extra in CASES.items():
        config = {**BASE, **extra}
        inv_freq, scaling = frequencies(config)
        cases.append({"name": name, "config": config, "inv_freq": inv_freq, "attention_scaling": scaling})
    doc = {"transformers": transformers.__version__, "torch": torch.__version__, "cases": cases}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"make_rope_reference: {len(cases)} configs, transformers {transformers.__version__} -> {out}")


if __name__ == "__main__":
    sys.exit(main())

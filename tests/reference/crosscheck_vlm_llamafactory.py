"""Run by hand: `fabrica train` and llamafactory-cli train side by side on mllm_demo, the same
model folder and the same YAML, their per-step losses within 1e-3 (docs/architecture/vision.md).

  DISABLE_VERSION_CHECK=1 CUDA_VISIBLE_DEVICES= /work/venvs/lf/bin/python \
      tests/reference/crosscheck_vlm_llamafactory.py build/fabrica ../shared

Measured with LLaMA-Factory 0.9.5, transformers 5.25.0, torch 2.15.0 (CPU) and Pillow 13.0.0.
The folder: tests/reference/vlm/qwen2_vl_scratch/config.json (a tiny qwen2_vl, patch_size 14), the
shared Qwen3 tokenizer (Qwen2-VL's vision tokens), Qwen2-VL-2B's preprocessor_config.json, weights
from one `fabrica train` step from scratch (LLaMA-Factory needs weights to load). Two settings:
LLaMA-Factory's default freezing, and the tower and merger trained too. One batch of all 6 samples,
3 steps, fp32.

Two stand-ins for what this venv lacks, neither on the path of sft: trl's value-head class and
PPO (trl >= 0.25 dropped them), and torchvision (transformers' Qwen2-VL video processor needs it,
so AutoProcessor fails): the processor is Qwen2VLImageProcessorPil beside the tokenizer, which is
all LLaMA-Factory's Qwen2-VL plugin uses for images. LLaMA-Factory's gradient checkpointing fails
under transformers 5 (func.__self__), so the YAML sets disable_gradient_checkpointing.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import types

SETTINGS = {
    "default_freezing": {},
    "tower_trained": {"freeze_vision_tower": "false", "freeze_multi_modal_projector": "false"},
}


def run_llamafactory(yaml_path):
    import trl
    if not hasattr(trl, "AutoModelForCausalLMWithValueHead"):
        trl.AutoModelForCausalLMWithValueHead = type("AutoModelForCausalLMWithValueHead", (), {})
    ppo = types.ModuleType("llamafactory.train.ppo")
    ppo.run_ppo = None
    sys.modules["llamafactory.train.ppo"] = ppo
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    import llamafactory.model.loader as loader

    class ImageOnlyProcessor(types.SimpleNamespace):
        def save_pretrained(self, *args, **kwargs):
            pass

    class PilAutoProcessor:
        @staticmethod
        def from_pretrained(path, **kwargs):
            config = json.load(open(os.path.join(path, "preprocessor_config.json")))
            image = Qwen2VLImageProcessorPil(
                **{k: v for k, v in config.items() if k not in ("image_processor_type", "processor_class")})
            return ImageOnlyProcessor(image_processor=image, tokenizer=AutoTokenizer.from_pretrained(path),
                                      model_input_names=["pixel_values", "image_grid_thw"])

    loader.AutoProcessor = PilAutoProcessor
    from llamafactory.train.tuner import run_exp
    sys.argv = [sys.argv[0], yaml_path]
    run_exp()


def write_yaml(path, model, shared, output_dir, extra):
    lines = {"model_name_or_path": model, "stage": "sft", "do_train": "true", "finetuning_type": "full",
             "dataset": "mllm_demo", "dataset_dir": os.path.join(shared, "data", "llamafactory"),
             "template": "qwen2_vl", "cutoff_len": "2048", "per_device_train_batch_size": "6",
             "learning_rate": "1.0e-3", "logging_steps": "1", "max_steps": "3", "output_dir": output_dir,
             "overwrite_output_dir": "true", "report_to": "none", "disable_gradient_checkpointing": "true", **extra}
    with open(path, "w") as f:
        f.writelines(f"{k}: {v}\n" for k, v in lines.items())


def run(command, log, env):
    with open(log, "w") as out:
        if subprocess.call(command, stdout=out, stderr=subprocess.STDOUT, env=env) != 0:
            sys.exit(f"FAIL: {' '.join(command)} (see {log})")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--llamafactory":
        return run_llamafactory(sys.argv[2])
    fabrica, shared = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    work = tempfile.mkdtemp(prefix="vlm_crosscheck_")
    env = dict(os.environ, FABRICA_CACHE=os.path.join(work, "cache"), HF_DATASETS_CACHE=os.path.join(work, "hf"),
               DISABLE_VERSION_CHECK="1", CUDA_VISIBLE_DEVICES="")
    scratch = os.path.join(work, "scratch")
    os.makedirs(scratch)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(shared, "data", "tokenizers", "qwen3", f), scratch)
    shutil.copy(os.path.join(repo, "tests", "reference", "image", "preprocessor_config.json"), scratch)
    shutil.copy(os.path.join(repo, "tests", "reference", "vlm", "qwen2_vl_scratch", "config.json"), scratch)
    model = os.path.join(work, "model")
    write_yaml(os.path.join(work, "init.yaml"), scratch, shared, model, {"max_steps": "1"})
    run([fabrica, "train", os.path.join(work, "init.yaml")], os.path.join(work, "init.log"), env)
    worst = 0.0
    for name, extra in SETTINGS.items():
        runs = {}
        for who in ("fabrica", "llamafactory"):
            yaml_path = os.path.join(work, f"{name}_{who}.yaml")
            write_yaml(yaml_path, model, shared, os.path.join(work, f"{name}_{who}"), extra)
            command = [fabrica, "train", yaml_path] if who == "fabrica" else \
                [sys.executable, os.path.abspath(__file__), "--llamafactory", yaml_path]
            run(command, os.path.join(work, f"{name}_{who}.log"), env)
        fab = [json.loads(line)["loss"] for line in open(os.path.join(work, f"{name}_fabrica", "metrics.jsonl"))]
        state = json.load(open(os.path.join(work, f"{name}_llamafactory", "trainer_state.json")))
        lf = [h["loss"] for h in state["log_history"] if "loss" in h]
        assert len(fab) == len(lf) == 3, (fab, lf)
        for step, (a, b) in enumerate(zip(fab, lf), 1):
            print(f"{name} step {step}: fabrica {a:.7f}  llamafactory {b:.7f}  |diff| {abs(a - b):.1e}")
            assert math.isfinite(a)
            worst = max(worst, abs(a - b))
    shutil.rmtree(work)
    print(f"worst |loss difference| {worst:.1e}")
    sys.exit(0 if worst <= 1e-3 else 1)


if __name__ == "__main__":
    main()

"""LoRA SFT reference (Debian's python3-torch): PEFT's formulas written out, on the qwen3
fixture model of make_reference.py.

  out = W x + (B A dropout(x)) * scaling,  scaling = alpha / r  (alpha / sqrt(r) with rsLoRA)

A starts kaiming_uniform_(a=sqrt(5)) (torch's generator), B small random instead of zero so
that every adapter gets a gradient from step 1. The adapter is written as a PEFT folder
(adapter_config.json + adapter_model.safetensors, PEFT's key names), which the C++ test loads
through adapter_name_or_path, then 5 AdamW steps (only the adapters train; gradient
accumulation 2, clipping, cosine schedule) give the losses the C++ run must reproduce.

usage: make_lora_reference.py OUT_DIR   (reads OUT_DIR/qwen3, written by make_reference.py)
"""
import json
import math
import os
import sys
from functools import partial

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_reference as R  # noqa: E402
from safetensors_io import load_file, save_file  # noqa: E402

CASES = {
    # name: (rank, alpha, rslora, targets)
    "lora_all": (4, 8, False, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "lora_rslora_qv": (8, 16, True, ["q_proj", "v_proj"]),
}
STEPS, LR = 5, 1e-2

_ADAPTERS = {}  # id(base weight) -> (A, B, scaling)
_plain_linear = R.linear


def lora_linear(x, w, b=None):
    y = _plain_linear(x, w, b)
    if id(w) in _ADAPTERS:
        a, bm, scaling = _ADAPTERS[id(w)]
        y = y + (x @ a.t() @ bm.t()) * scaling
    return y


R.linear = lora_linear


def make_case(name, rank, alpha, rslora, targets, out_dir):
    base = os.path.join(out_dir, "qwen3")
    cfg = json.load(open(os.path.join(base, "config.json")))
    weights, _ = load_file(os.path.join(base, "model.safetensors"))
    ref, _ = load_file(os.path.join(base, "reference.safetensors"))
    g = torch.Generator().manual_seed(1234)
    scaling = alpha / math.sqrt(rank) if rslora else alpha / rank
    adapters = {}
    for i in range(cfg["num_hidden_layers"]):
        for t in targets:
            module = f"model.layers.{i}.{'mlp' if t in ('gate_proj', 'up_proj', 'down_proj') else 'self_attn'}.{t}"
            w = weights[module + ".weight"]
            out_f, in_f = w.shape
            bound = 1.0 / math.sqrt(in_f)  # kaiming_uniform_(a=sqrt(5))
            a = (torch.rand((rank, in_f), generator=g) * 2 - 1) * bound
            bm = torch.randn((out_f, rank), generator=g) * 0.01
            adapters[module] = (a.requires_grad_(True), bm.requires_grad_(True))
    params = dict(weights)
    for module, (a, bm) in adapters.items():
        _ADAPTERS[id(params[module + ".weight"])] = (a, bm, scaling)
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    tensors = {}
    for module, (a, bm) in adapters.items():
        tensors[f"base_model.model.{module}.lora_A.weight"] = a.detach().clone()
        tensors[f"base_model.model.{module}.lora_B.weight"] = bm.detach().clone()
    save_file(tensors, os.path.join(d, "adapter_model.safetensors"), metadata={"format": "pt"})
    json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0,
               "use_rslora": rslora, "target_modules": targets, "modules_to_save": None, "bias": "none",
               "base_model_name_or_path": base}, open(os.path.join(d, "adapter_config.json"), "w"), indent=2)

    plist = [t for pair in adapters.values() for t in pair]
    opt = torch.optim.AdamW(plist, lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, partial(R.cosine_lambda, warmup=1, total=STEPS))
    tids, tlabels = ref["train.input_ids"], ref["train.labels"]
    accum = tids.shape[1]
    losses, norms = [], []
    for s in range(STEPS):
        opt.zero_grad(set_to_none=True)
        n_items = sum(R.num_targets(tlabels[s, m]) for m in range(accum))
        step_loss = 0.0
        for m in range(accum):
            loss = R.token_loss_sum(R.forward(cfg, params, tids[s, m]), tlabels[s, m]) / n_items
            loss.backward()
            step_loss += float(loss)
        norms.append(float(torch.nn.utils.clip_grad_norm_(plist, 1.0)))
        opt.step()
        sched.step()
        losses.append(step_loss)
    final = {f"base_model.model.{m}.lora_{k}.weight": t.detach().clone()
             for m, (a, bm) in adapters.items() for k, t in (("A", a), ("B", bm))}
    save_file({"losses": torch.tensor(losses, dtype=torch.float32), "grad_norms": torch.tensor(norms, dtype=torch.float32),
               **{"final." + k: v for k, v in final.items()}},
              os.path.join(d, "reference.safetensors"), metadata={"lr": repr(LR), "steps": str(STEPS)})
    _ADAPTERS.clear()
    return losses, norms


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    for name, (rank, alpha, rslora, targets) in CASES.items():
        losses, norms = make_case(name, rank, alpha, rslora, targets, argv[1])
        print(f"[{name}] losses {[round(x, 5) for x in losses]} grad_norms {[round(x, 4) for x in norms]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

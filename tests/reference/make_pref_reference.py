#!/usr/bin/env python3
"""Reference losses of the preference stages (DPO family, KTO, reward model) for Fabrica's tests.

Written from the published formulas (DPO, cDPO label smoothing, SLiC hinge, IPO, ORPO, SimPO, KTO,
the Bradley-Terry reward loss) as LLaMA-Factory's CustomDPOTrainer / CustomKTOTrainer /
PairwiseTrainer and TRL's DPOTrainer / KTOTrainer state them; gradients by torch autograd, so the
C++ side's hand-derived backward is checked against them. The model is make_reference.py's plain
torch Llama at fixed weights; every case trains 5 AdamW steps on one fixed batch.

usage: make_pref_reference.py OUT_DIR    (writes OUT_DIR/pref/)
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_reference import CONFIGS, IGNORE_INDEX, forward, init_params, param_names  # noqa: E402
from safetensors_io import save_file  # noqa: E402

STEPS = 5
LR = 1e-3
CFG = dict(CONFIGS["llama"])
SEED = 4242

# name -> (stage, settings); settings use Fabrica's (LLaMA-Factory's) config keys.
CASES = {
    "dpo_sigmoid": ("dpo", {"pref_loss": "sigmoid", "pref_beta": 0.1}),
    "dpo_sigmoid_smoothing": ("dpo", {"pref_loss": "sigmoid", "pref_beta": 0.5, "dpo_label_smoothing": 0.2}),
    "dpo_sigmoid_ftx": ("dpo", {"pref_loss": "sigmoid", "pref_beta": 0.1, "pref_ftx": 0.5}),
    "dpo_hinge": ("dpo", {"pref_loss": "hinge", "pref_beta": 0.1}),
    "dpo_ipo": ("dpo", {"pref_loss": "ipo", "pref_beta": 0.1}),
    "dpo_orpo": ("dpo", {"pref_loss": "orpo", "pref_beta": 0.1}),
    "dpo_simpo": ("dpo", {"pref_loss": "simpo", "pref_beta": 2.0, "simpo_gamma": 0.5}),
    "kto": ("kto", {"pref_beta": 0.1, "kto_chosen_weight": 1.0, "kto_rejected_weight": 1.5}),
    "rm": ("rm", {}),
}


def make_sequences(g, n, t_max, prompt_min=3):
    """n sequences of random lengths: (ids (n, t_max), labels (n, t_max), lengths); prompts masked."""
    ids = torch.zeros(n, t_max, dtype=torch.int64)
    labels = torch.full((n, t_max), IGNORE_INDEX, dtype=torch.int64)
    lengths = []
    for i in range(n):
        length = int(torch.randint(t_max - 4, t_max + 1, (1,), generator=g))
        prompt = int(torch.randint(prompt_min, prompt_min + 3, (1,), generator=g))
        row = torch.randint(3, CFG["vocab_size"], (length,), generator=g)
        ids[i, :length] = row
        labels[i, prompt:length] = row[prompt:]
        lengths.append(length)
    return ids, labels, torch.tensor(lengths, dtype=torch.int64)


def row_logps(logits, labels):
    """Sum of log p(label) over each row's targets (the shift as HF: logits[:, :-1] vs labels[:, 1:])."""
    lp = logits[:, :-1].log_softmax(-1)
    target = labels[:, 1:]
    mask = target != IGNORE_INDEX
    picked = torch.gather(lp, 2, target.clamp(min=0).unsqueeze(2)).squeeze(2)
    return (picked * mask).sum(-1), mask.sum(-1)


def dpo_losses(s, c, r, rc, rr):
    """Per-pair losses (policy c, r; reference rc, rr), the log-probabilities as the loss uses them."""
    loss_type, beta = s["pref_loss"], s["pref_beta"]
    if loss_type in ("sigmoid", "hinge", "ipo"):
        x = (c - r) - (rc - rr)
        if loss_type == "sigmoid":
            ls = s.get("dpo_label_smoothing", 0.0)
            losses = -F.logsigmoid(beta * x) * (1 - ls) - F.logsigmoid(-beta * x) * ls
        elif loss_type == "hinge":
            losses = torch.relu(1 - beta * x)
        else:
            losses = (x - 1 / (2 * beta)) ** 2
    elif loss_type == "orpo":
        log_odds = (c - r) - (torch.log1p(-torch.exp(c)) - torch.log1p(-torch.exp(r)))
        losses = -c - beta * F.logsigmoid(log_odds)
    else:  # simpo
        losses = -F.logsigmoid(beta * (c - r) - s["simpo_gamma"])
    return losses


def pair_forward(params, ids, labels, avg):
    """Chosen (even sequences) and rejected (odd) in one batch of 2B rows."""
    order = list(range(0, ids.shape[0], 2)) + list(range(1, ids.shape[0], 2))
    logps, counts = row_logps(forward(CFG, params, ids[order]), labels[order])
    if avg:
        logps = logps / counts
    n = ids.shape[0] // 2
    chosen_mean = logps[:n] if avg else logps[:n] / counts[:n]  # what pref_ftx takes
    return logps[:n], logps[n:], chosen_mean


def train(params, loss_fn):
    names = param_names(CFG) + [n for n in params if n.startswith("v_head")]
    p = {n: params[n].clone().requires_grad_(True) for n in names}
    opt = torch.optim.AdamW([p[n] for n in names], lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                            foreach=False)
    losses, first_metrics = [], None
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss, metrics = loss_fn(p)
        loss.backward()
        opt.step()
        losses.append(float(loss))
        first_metrics = first_metrics or metrics
    return losses, first_metrics


def dpo_case(init, s, ids, labels):
    avg = s["pref_loss"] in ("ipo", "orpo", "simpo")
    with torch.no_grad():
        rc, rr, _ = pair_forward(init, ids, labels, avg)

    def loss_fn(p):
        c, r, c_avg = pair_forward(p, ids, labels, avg)
        losses = dpo_losses(s, c, r, rc, rr)
        losses = losses + s.get("pref_ftx", 0.0) * -c_avg
        if s["pref_loss"] in ("orpo", "simpo"):
            cr, rj = s["pref_beta"] * c.detach(), s["pref_beta"] * r.detach()
        else:
            cr, rj = s["pref_beta"] * (c - rc).detach(), s["pref_beta"] * (r - rr).detach()
        return losses.mean(), {"rewards/chosen": float(cr.mean()), "rewards/rejected": float(rj.mean()),
                               "logps/chosen": float(c.mean()), "logps/rejected": float(r.mean())}
    return train(init, loss_fn)


def kto_case(init, s, ids, labels, desirable):
    comp, kl_rows = list(range(0, ids.shape[0], 2)), list(range(1, ids.shape[0], 2))
    beta, wd, wu = s["pref_beta"], s["kto_chosen_weight"], s["kto_rejected_weight"]
    with torch.no_grad():
        ref, _ = row_logps(forward(CFG, init, ids[comp]), labels[comp])
        ref_kl, _ = row_logps(forward(CFG, init, ids[kl_rows]), labels[kl_rows])
    good = torch.tensor(desirable, dtype=torch.bool)
    kls = []

    def loss_fn(p):
        logp, _ = row_logps(forward(CFG, p, ids[comp]), labels[comp])
        with torch.no_grad():
            policy_kl, _ = row_logps(forward(CFG, p, ids[kl_rows]), labels[kl_rows])
            kl = (policy_kl - ref_kl).mean().clamp(min=0)
        ratio = logp - ref
        chosen = wd * (1 - torch.sigmoid(beta * (ratio[good] - kl)))
        rejected = wu * (1 - torch.sigmoid(beta * (kl - ratio[~good])))
        kls.append(float(kl))
        return torch.cat([chosen, rejected]).mean(), {"kl": float(kl)}
    losses, metrics = train(init, loss_fn)
    assert max(kls) > 0, kls  # the KL term is live
    return losses, dict(metrics, kl_per_step=kls)


def rm_case(init, ids, labels, lengths):
    order = list(range(0, ids.shape[0], 2)) + list(range(1, ids.shape[0], 2))
    n = ids.shape[0] // 2
    c = CFG["hidden_size"]

    def loss_fn(p):
        q = dict(p)
        q["lm_head.weight"] = torch.eye(c)  # forward() then returns the final hidden states
        hidden = forward(CFG, q, ids[order])
        last = lengths[order] - 1
        h = hidden[torch.arange(2 * n), last]
        scores = h @ p["v_head.summary.weight"][0] + p["v_head.summary.bias"][0]
        return -F.logsigmoid(scores[:n] - scores[n:]).mean(), {"accuracy": float((scores[:n] > scores[n:]).float().mean())}
    return train(init, loss_fn)


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = os.path.join(argv[1], "pref")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(SEED)
    init = init_params(CFG, SEED)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CFG, f, indent=2)
        f.write("\n")
    save_file(init, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    bound = 1 / math.sqrt(CFG["hidden_size"])
    v_head = {"v_head.summary.weight": (torch.rand(1, CFG["hidden_size"], generator=g) * 2 - 1) * bound,
              "v_head.summary.bias": (torch.rand(1, generator=g) * 2 - 1) * bound}
    save_file(v_head, os.path.join(out, "value_head.safetensors"), metadata={"format": "pt"})
    ids, labels, lengths = make_sequences(g, 8, 14)  # 4 items of 2 sequences each
    desirable = [1, 0, 1, 0]
    # KTO: the KL rows are desirable completions (items 2, 0, 0, 2), whose log-probabilities
    # training raises, so the KL estimate leaves 0 and its clamp and term are exercised.
    kto_ids, kto_labels, kto_lengths = ids.clone(), labels.clone(), lengths.clone()
    for item, source in enumerate([2, 0, 0, 2]):
        for t in (kto_ids, kto_labels, kto_lengths):
            t[2 * item + 1] = t[2 * source]
    ref = {"ids": ids, "labels": labels, "lengths": lengths, "desirable": torch.tensor(desirable, dtype=torch.int64),
           "kto_ids": kto_ids, "kto_labels": kto_labels, "kto_lengths": kto_lengths}
    meta = {"steps": str(STEPS), "lr": repr(LR), "torch_version": torch.__version__}
    for name, (stage, s) in CASES.items():
        if stage == "dpo":
            losses, metrics = dpo_case(init, s, ids, labels)
        elif stage == "kto":
            losses, metrics = kto_case(init, s, kto_ids, kto_labels, desirable)
        else:
            losses, metrics = rm_case(dict(init, **v_head), ids, labels, lengths)
        ref[name + ".losses"] = torch.tensor(losses, dtype=torch.float32)
        meta[name] = json.dumps({"stage": stage, "settings": s, "first_step": metrics})
        print(f"[{name}] losses {[round(x, 6) for x in losses]}")
    save_file(ref, os.path.join(out, "reference.safetensors"), metadata=meta)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Megatron's router options on the committed tiny mixture-of-experts folders, run by hand in a venv
holding torch and transformers >= 5 (used: torch 2.15.0, transformers 5.25.0):

  python tests/reference/make_moe_router_reference.py

transformers' own modeling code runs the model; the terms Megatron-Core adds are written here from
its formulas (megatron/core/transformer/moe/moe_utils.py and router.py), on the router logits
transformers returns (output_router_logits), padding rows masked as Megatron's padding_mask does:
  aux_loss      per MoE layer  E / (k T^2) * sum_e tokens_e * sum_t p_te   (switch_load_balancing_loss_func;
                tokens_e the top-k picks of the layer's T unmasked rows, before any capacity drop)
  seq_aux_loss  the same within each sequence (row of the batch), divided by the batch size
  z-loss        per MoE layer  mean_t logsumexp(z_t)^2                     (z_loss_func)
The objective is loss_ce + aux_coeff * sum over layers + z_coeff * sum over layers, as each
Megatron layer attaches its own terms (MoEAuxLossAutoScaler).
Capacity (moe_expert_capacity_factor): each expert keeps at most ceil(R k / E * factor) of the
picks of the R real rows: the most probable by their final routing weight ("probs"; ties to the
earlier token) or the earliest ("position"); a dropped pick's weight is zeroed (Megatron multiplies
the probs by the capacity mask), here by wrapping transformers' router. One deliberate difference
from Megatron, which counts every row of logits.shape[0]: padding rows take no capacity (Fabrica
drops them; what they hold is implementation-defined and they must not push real tokens out).

For each of tests/reference/moe/{qwen3_moe,qwen2_moe,mixtral} and each case below, written to
F/router_reference.safetensors: CASE.loss_ce, CASE.aux (mean over layers, unweighted), CASE.z
(likewise), CASE.logits (real positions; padding zero) and CASE.grad.<name> (per-expert names).
"""
import math
import os
import sys
import types

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_moe_reference import HERE, to_saved_names  # noqa: E402

# name: (balancing, aux_coeff, z_coeff, capacity_factor, drop_policy)
CASES = {
    "layer_z": ("aux_loss", 0.05, 0.01, 0.0, "probs"),
    "seq_cap": ("seq_aux_loss", 0.05, 0.0, 1.0, "probs"),
    "drop_position": ("none", 0.0, 0.0, 0.5, "position"),
}


def cap_router(router, factor, policy, real):
    """Wraps one transformers router so that picks past the expert capacity, and padding rows
    (real[t] false), get weight 0."""
    inner = router.forward

    def forward(self, hidden):
        logits, scores, idx = inner(hidden)
        n, k = idx.shape
        E = logits.shape[-1]
        capacity = math.ceil(int(real.sum()) * k / E * factor)
        keep = real.float()[:, None].repeat(1, k)
        w = scores.detach().tolist()
        for e in range(E):
            picks = [(t, j) for t in range(n) for j in range(k) if real[t] and int(idx[t, j]) == e]
            if policy == "probs":
                picks.sort(key=lambda tj: -w[tj[0]][tj[1]])  # stable: ties keep token order
            for t, j in picks[capacity:]:
                keep[t, j] = 0
        return logits, scores * keep, idx

    router.forward = types.MethodType(forward, router)


def routers(model):
    return [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]


def switch_loss(p, picks, rows, E, k):
    return E * (picks * p).sum() / (k * rows * rows)


def terms(router_logits, mask, balancing, k, seq):
    """The pass's balancing and z terms, each summed over layers (objective) and averaged (logged)."""
    aux_sum, z_sum = 0.0, 0.0
    m = mask.reshape(-1).float()
    for z in router_logits:
        z = z.float()
        E = z.shape[-1]
        p = torch.softmax(z, dim=-1)
        chosen = torch.zeros_like(p).scatter(1, torch.topk(p, k, dim=-1).indices, 1.0)
        if balancing == "aux_loss":
            aux_sum = aux_sum + switch_loss((p * m[:, None]).sum(0), (chosen * m[:, None]).sum(0), m.sum(), E, k)
        elif balancing == "seq_aux_loss":
            B = z.shape[0] // seq
            per = 0.0
            for b in range(B):
                rows = slice(b * seq, (b + 1) * seq)
                mb = m[rows][:, None]
                per = per + switch_loss((p[rows] * mb).sum(0), (chosen[rows] * mb).sum(0), mb.sum(), E, k)
            aux_sum = aux_sum + per / B
        elif balancing == "none":  # not in the objective; Fabrica logs aux_loss's per-layer value
            aux_sum = aux_sum + switch_loss((p * m[:, None]).sum(0), (chosen * m[:, None]).sum(0), m.sum(), E, k).detach()
        z_sum = z_sum + (torch.logsumexp(z, dim=-1) ** 2 * m).sum() / m.sum()
    return aux_sum, z_sum, len(router_logits)


def main():
    for name in ["qwen3_moe", "qwen2_moe", "mixtral"]:
        folder = os.path.join(HERE, name)
        batch = load_file(os.path.join(folder, "reference.safetensors"))
        ids, labels, lengths = batch["input_ids"], batch["labels"], batch["lengths"]
        mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
        out = {}
        for case, (balancing, aux_coeff, z_coeff, factor, policy) in CASES.items():
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
            model.train()
            model.router_aux_loss_coef = 0.0  # transformers' own aux term out of .loss
            if factor > 0:
                for r in routers(model):
                    cap_router(r, factor, policy, mask.reshape(-1).bool())
            res = model(input_ids=ids, attention_mask=mask, labels=labels, output_router_logits=True)
            k = model.config.num_experts_per_tok
            aux, z, layers = terms(res.router_logits, mask, balancing, k, ids.shape[1])
            loss = res.loss + (aux_coeff * aux if balancing != "none" else 0.0) + z_coeff * z
            loss.backward()
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            out[f"{case}.loss_ce"] = res.loss.detach().reshape(1)
            out[f"{case}.aux"] = torch.tensor([float(torch.as_tensor(aux).detach()) / layers])
            out[f"{case}.z"] = torch.tensor([float(z) / layers])
            out[f"{case}.logits"] = (res.logits * mask[..., None]).detach().contiguous()
            for n, g in to_saved_names(model, folder, grads).items():
                out[f"{case}.grad.{n}"] = g.contiguous()
            print(name, case, "ce", float(res.loss), "aux", float(aux) / layers, "z", float(z) / layers)
        save_file(out, os.path.join(folder, "router_reference.safetensors"),
                  metadata={"transformers": transformers.__version__, "torch": torch.__version__})


if __name__ == "__main__":
    main()

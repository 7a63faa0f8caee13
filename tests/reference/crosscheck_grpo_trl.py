#!/usr/bin/env python3
"""Issue 31 item 6, by hand: TRL's GRPOTrainer._compute_loss against the verl formulas Fabrica's
tests hold it to (make_grpo_reference.py; GrpoReference / GrpoPolicyLossReference pass within
1e-5), on the same weights and the same completions fed in.

The fixture's batch (make_grpo_reference.py: its tiny Llama, 6 responses of 2 to 8 tokens after
prompts of 3 to 6, at temperature 0.7, group advantages) with old and reference log-probabilities a
moderate distance from the policy's (ratios within [0.6, 1.7], the PPO clip reached, the KL terms
inside verl's clamps). For TRL's loss_type grpo, bnpo, dapo and dr_grpo, with and without the KL
term (beta 0.1), TRL's own _compute_loss (trl 1.16: its code runs as it is, on the policy's
per-token log-probabilities, which our plain-torch forward gives it in place of a transformers
model) and the verl formula of the loss_agg_mode Fabrica maps it to: the losses, and the gradients
of every parameter through the same forward. Then two cases where they are meant to differ (verl's
dual clip, which TRL has not; verl's clamp of the k3 KL at 10), to show the comparison can fail.

Usage (a venv with torch and trl; bench/.venv has both):
  bench/.venv/bin/python tests/reference/crosscheck_grpo_trl.py
"""
import os
import sys
from collections import defaultdict
from types import SimpleNamespace

import torch
import trl
from trl import GRPOTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_grpo_reference as ref  # noqa: E402

AGG_OF = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean",
          "dr_grpo": "seq-mean-token-sum-norm"}
BETA = 0.1


def trl_trainer(loss_type, beta):
    """A GRPOTrainer holding only what _compute_loss reads (one process, no accumulation)."""
    t = GRPOTrainer.__new__(GRPOTrainer)
    t.loss_type, t.beta = loss_type, beta
    t.epsilon_low, t.epsilon_high = ref.CLIP_LOW, ref.CLIP_HIGH
    t.importance_sampling_level = "token"
    t.top_entropy_quantile, t.off_policy_mask_threshold = 1.0, None
    t.use_vllm, t.aux_loss_enabled = False, False
    t.max_completion_length = ref.MAX_NEW_TOKENS
    t.args = SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1)
    t.model = SimpleNamespace(training=True)
    t.current_gradient_accumulation_steps = 1
    t.accelerator = SimpleNamespace(num_processes=1, gather=lambda x: x, reduce=lambda x, reduction="sum": x)
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    t._entropy_bonus_enabled = False
    return t


def completion_view(x, prompts, responses):
    """(B, T - 1) per-position values -> (B, longest response), response token k of row i at k."""
    longest = int(responses.max())
    index = torch.zeros(len(prompts), longest, dtype=torch.int64)
    mask = torch.zeros(len(prompts), longest, dtype=torch.float64)
    for i, (p, r) in enumerate(zip(prompts.tolist(), responses.tolist())):
        index[i, :r] = torch.arange(p - 1, p - 1 + r)
        mask[i, :r] = 1
    return torch.gather(x, 1, index) * mask, mask


def run(case, old_shift, ref_shift, loss_type, beta, clip_c=ref.CLIP_C):
    init = ref.init_params(ref.CFG, ref.SEED)
    g = torch.Generator().manual_seed(ref.SEED)
    ids, labels, prompts, responses = ref.make_rollouts(g)
    names = ref.param_names(ref.CFG)
    grads, losses = [], []
    for side in ("trl", "verl"):
        p = {n: init[n].clone().double().requires_grad_(True) for n in names}
        lp, m = ref.token_logps(p, ids, labels, ref.TEMPERATURE)
        old = (lp.detach() + old_shift) * m
        ref_lp = (lp.detach() + ref_shift) * m
        adv = ref.group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.5], dtype=torch.float64),
                                   [0, 0, 0, 1, 1, 2], True)
        if side == "trl":
            logp_c, mask = completion_view(lp, prompts, responses)
            t = trl_trainer(loss_type, beta)
            t._get_per_token_logps_and_entropies = lambda *a, **k: (logp_c, torch.zeros_like(logp_c), None)
            inputs = {"prompt_ids": ids, "prompt_mask": torch.ones_like(ids), "completion_ids": mask.long(),
                      "completion_mask": mask, "advantages": adv,
                      "old_per_token_logps": completion_view(old, prompts, responses)[0],
                      "ref_per_token_logps": completion_view(ref_lp, prompts, responses)[0],
                      "num_items_in_batch": mask.sum()}
            loss = t._compute_loss(None, inputs)
        else:
            mode = AGG_OF[loss_type]
            saved = ref.CLIP_C
            ref.CLIP_C = clip_c
            loss, _, _ = ref.policy_loss(lp, old, adv.unsqueeze(1), m, mode)
            ref.CLIP_C = saved
            if beta:
                loss = loss + beta * ref.agg_loss(ref.kl_penalty(lp, ref_lp, "k3"), m, mode)
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append(torch.cat([p[n].grad.flatten() for n in names]))
    loss_diff = abs(losses[0] - losses[1]) / max(1.0, abs(losses[1]))
    grad_diff = float((grads[0] - grads[1]).abs().max() / grads[1].abs().max())
    print(f"{case:42s} loss TRL {losses[0]: .10f} verl {losses[1]: .10f}  relative difference: loss "
          f"{loss_diff:.1e}, gradients {grad_diff:.1e}")
    return loss_diff, grad_diff


def main():
    print(f"trl {trl.__version__}, torch {torch.__version__}; float64 throughout")
    g = torch.Generator().manual_seed(31)
    shape = (6, 11)  # (B, T - 1) of the fixture's batch (its longest row: 12 tokens)
    old_shift = torch.rand(shape, generator=g, dtype=torch.float64) * 0.8 - 0.3   # ratios e^[-0.5, 0.3]
    ref_shift = torch.rand(shape, generator=g, dtype=torch.float64) * 1.0 - 0.5
    worst = 0.0
    for loss_type in AGG_OF:
        for beta in (0.0, BETA):
            worst = max(worst, *run(f"{loss_type}, beta {beta}", old_shift, ref_shift, loss_type, beta))
    print(f"worst relative difference over the shared semantics: {worst:.1e}")
    assert worst < 1e-12, worst
    # Where they are meant to differ: a ratio of 4 on a negative advantage (verl's dual clip at 3),
    # and a reference 13 nats above the policy (verl's k3 clamped at 10).
    far = old_shift.clone()
    far[1, 4] = -1.4
    dual = run("dapo, a ratio past the dual clip", far, ref_shift, "dapo", 0.0)[0]
    same = run("dapo, the same with clip_ratio_c 1e9", far, ref_shift, "dapo", 0.0, clip_c=1e9)[0]
    high = ref_shift.clone()
    high[1, 4] = 13.0
    clamp = run("dapo, beta 0.1, k3 past its clamp", old_shift, high, "dapo", BETA)[0]
    assert dual > 1e-3 and same < 1e-12 and clamp > 1e-3, (dual, same, clamp)
    print("ok: equal where the semantics are shared; verl's dual clip and k3 clamp differ from TRL, as expected")


if __name__ == "__main__":
    main()

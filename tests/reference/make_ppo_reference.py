#!/usr/bin/env python3
"""Reference of stage ppo's critic side for Fabrica's tests, written from verl's published formulas
(verl/trainer/ppo/core_algos.py: compute_gae_advantage_return, compute_value_loss, agg_loss,
kl_penalty; verl/utils/torch_functional.py: masked_whiten, clip_by_value; the trainer's
apply_kl_penalty), gradients by torch autograd.

A fixed batch of responses of make_reference.py's tiny Llama with a value head (the critic),
padded to the longest response as verl holds them (response lengths 1 to 8), with fixed scores,
rollout-time ("old") and reference log-probabilities and old values. For several (gamma, lam)
and with and without the KL penalty in the reward: the whitened advantages and the returns. For
each loss_agg_mode: the value loss, vf_clipfrac, vpred_mean and the gradient of every critic
parameter, the old values set so that the value clip is hit on both sides.

usage: make_ppo_reference.py OUT_DIR    (writes OUT_DIR/ppo/)
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_reference import CONFIGS, forward, init_params, param_names  # noqa: E402
from safetensors_io import save_file  # noqa: E402

CFG = dict(CONFIGS["llama"])
SEED = 1819
CLIPRANGE_VALUE = 0.5
KL_COEF = 0.1
AGG_MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
# (gamma, lam, kl penalty in the reward or "none")
GAE_CASES = [(1.0, 1.0, "none"), (1.0, 0.95, "none"), (0.99, 0.95, "k1"), (0.9, 0.0, "k3"), (1.0, 1.0, "k2")]
LOSS_CASE = 2  # the returns the value loss is fitted to


def masked_mean(x, mask):
    return (x * mask).sum() / mask.sum()


def masked_whiten(values, mask):
    """verl's masked_whiten with shift_mean: the unbiased masked variance."""
    mean = masked_mean(values, mask)
    centered = values - mean
    variance = masked_mean(centered ** 2, mask)
    n = mask.sum()
    variance = variance * n / (n - 1)
    return (values - mean) * torch.rsqrt(variance + 1e-8)


def kl_penalty(logp, ref, kind):
    if kind == "k1":
        return logp - ref
    if kind == "k2":
        return 0.5 * (logp - ref).square()
    kl = torch.clamp(ref - logp, min=-20, max=20)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


def token_level_rewards(scores, mask, old, ref, kind):
    """The score on each response's last token, minus KL_COEF * kl per token (apply_kl_penalty)."""
    lengths = mask.sum(-1).long()
    r = torch.zeros_like(mask)
    r[torch.arange(r.shape[0]), lengths - 1] = scores
    if kind == "none":
        return r, 0.0
    kld = kl_penalty(old, ref, kind) * mask
    current_kl = ((kld * mask).sum(-1) / mask.sum(-1)).mean()
    return r - KL_COEF * kld, float(current_kl)


def gae(rewards, values, mask, gamma, lam):
    """verl's compute_gae_advantage_return, masks and all."""
    nextvalues = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    lastgaelam = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    reversed_adv = []
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * mask[:, t] + (1 - mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * mask[:, t] + (1 - mask[:, t]) * lastgaelam
        reversed_adv.append(lastgaelam)
    advantages = torch.stack(reversed_adv[::-1], dim=1)
    returns = advantages + values
    return masked_whiten(advantages, mask), returns


def agg_loss(loss_mat, mask, mode):
    if mode == "token-mean":
        return masked_mean(loss_mat, mask)
    seq_sum = (loss_mat * mask).sum(-1)
    if mode == "seq-mean-token-sum":
        return seq_sum.mean()
    return (seq_sum / mask.sum(-1)).mean()


def value_loss(vpreds, returns, values, mask, mode):
    """verl's compute_value_loss (clip_by_value: max(min(x, hi), lo))."""
    vpredclipped = torch.max(torch.min(vpreds, values + CLIPRANGE_VALUE), values - CLIPRANGE_VALUE)
    l1 = (vpreds - returns) ** 2
    l2 = (vpredclipped - returns) ** 2
    loss = 0.5 * agg_loss(torch.max(l1, l2), mask, mode)
    clipfrac = masked_mean(torch.gt(l2, l1).double(), mask)
    return loss, clipfrac


def critic_values(params, ids, prompts, responses):
    """The value head at position P - 1 + k for response token k, (B, R) padded with 0."""
    c = CFG["hidden_size"]
    q = dict(params)
    q["lm_head.weight"] = torch.eye(c)  # forward() then returns the final hidden states
    hidden = forward(CFG, q, ids).double()
    scores = hidden @ params["v_head.summary.weight"][0].double() + params["v_head.summary.bias"][0].double()
    out = torch.zeros(ids.shape[0], int(responses.max()), dtype=torch.float64)
    for i, (p, r) in enumerate(zip(prompts.tolist(), responses.tolist())):
        out[i, :r] = scores[i, p - 1 : p - 1 + r]
    return out


def make_batch(g):
    prompts = [3, 4, 5, 3, 4, 6, 2]
    responses = [5, 1, 7, 4, 8, 3, 2]
    t = max(p + r for p, r in zip(prompts, responses))
    n = len(prompts)
    ids = torch.zeros(n, t, dtype=torch.int64)
    mask = torch.zeros(n, max(responses), dtype=torch.float64)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, : p + r] = torch.randint(3, CFG["vocab_size"], (p + r,), generator=g)
        mask[i, :r] = 1
    return ids, torch.tensor(prompts), torch.tensor(responses), mask


def f32(x):
    """What the C++ side reads back (f32), in float64."""
    return x.float().double()


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = os.path.join(argv[1], "ppo")
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(SEED)
    init = init_params(CFG, SEED)
    bound = 1.0 / CFG["hidden_size"] ** 0.5
    v_head = {"v_head.summary.weight": (torch.rand(1, CFG["hidden_size"], generator=g) * 2 - 1) * bound,
              "v_head.summary.bias": (torch.rand(1, generator=g) * 2 - 1) * bound}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CFG, f, indent=2)
        f.write("\n")
    save_file(init, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    save_file(v_head, os.path.join(out, "value_head.safetensors"), metadata={"format": "pt"})
    critic = dict(init, **v_head)
    ids, prompts, responses, mask = make_batch(g)
    scores = f32(torch.tensor([1.0, 0.0, -0.5, 1.0, 0.25, 2.0, 0.0], dtype=torch.float64))
    old = f32((torch.rand(mask.shape, generator=g, dtype=torch.float64) * -3.0) * mask)
    ref = f32((old + torch.rand(mask.shape, generator=g, dtype=torch.float64) * 1.6 - 0.8) * mask)
    with torch.no_grad():
        vpred0 = critic_values(critic, ids, prompts, responses)
    # Old values: the critic's own, moved so that the clip of +-0.5 is hit from both sides.
    shift = torch.rand(mask.shape, generator=g, dtype=torch.float64) * 1.6 - 0.8
    values = f32((vpred0 + shift) * mask)
    fixture = {"ids": ids, "prompt_lengths": prompts, "response_lengths": responses, "scores": scores.float(),
               "old_logp": old.float(), "ref_logp": ref.float(), "values": values.float()}
    meta = {"cliprange_value": repr(CLIPRANGE_VALUE), "kl_coef": repr(KL_COEF), "torch_version": torch.__version__}
    gae_cases = []
    for gamma, lam, kind in GAE_CASES:
        rewards, current_kl = token_level_rewards(scores, mask, old, ref, kind)
        adv, ret = gae(rewards, values, mask, gamma, lam)
        name = f"gae.{gamma}.{lam}.{kind}"
        gae_cases.append(name)
        rows = lambda x: [x[i, : int(responses[i])].tolist() for i in range(len(responses))]  # noqa: E731
        meta[name] = json.dumps({"gamma": gamma, "lam": lam, "kl_penalty": kind, "advantages": rows(adv),
                                 "returns": rows(ret), "reward_kl_penalty": current_kl})
        if len(gae_cases) - 1 == LOSS_CASE:
            fixture["returns"] = ret.float()
        print(f"[{name}] advantages mean {float(masked_mean(adv, mask)):.3e} returns mean "
              f"{float(masked_mean(ret, mask)):.6f}")
    meta["gae_cases"] = json.dumps(gae_cases)
    returns = f32(fixture["returns"].double())
    names = param_names(CFG) + ["v_head.summary.weight", "v_head.summary.bias"]
    for mode in AGG_MODES:
        p = {n: critic[n].clone().requires_grad_(True) for n in names}
        vpreds = critic_values(p, ids, prompts, responses)
        loss, clipfrac = value_loss(vpreds, returns, values, mask, mode)
        assert 0 < float(clipfrac) < 1, clipfrac  # the clip is live, and not everywhere
        loss.backward()
        name = f"value.{mode}"
        meta[name] = json.dumps({"vf_loss": float(loss), "vf_clipfrac": float(clipfrac),
                                 "vpred_mean": float(masked_mean(vpreds, mask))})
        for n in names:
            grad = p[n].grad if p[n].grad is not None else torch.zeros_like(p[n])
            fixture[name + ".grad." + n] = grad.float()
        print(f"[{name}] vf_loss {float(loss):.8f} vf_clipfrac {float(clipfrac):.4f}")
    save_file(fixture, os.path.join(out, "reference.safetensors"), metadata=meta)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

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
parameter, the old values set so that the value clip is hit on both sides. And the actor side at
a rollout temperature of TEMPERATURE: the policy's (the same Llama's) per-token log-probabilities
and entropies of softmax(logits / TEMPERATURE), as verl's actor takes them (dp_actor.py:
logits.div_(temperature)), and the clipped surrogate with the GAE advantages (compute_policy_loss,
token-mean) with the gradient of every policy parameter.

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
TEMPERATURE = 0.7  # the rollout temperature of the actor's log-probabilities (not 1: the test sees it)
CLIP_RATIO = 0.2
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


def actor_logps(params, ids, prompts, responses):
    """log p of response token k (predicted at position P - 1 + k) under softmax(logits /
    TEMPERATURE) and the entropy of that distribution, (B, R) padded with 0."""
    lp = (forward(CFG, params, ids) / TEMPERATURE).double().log_softmax(-1)
    logp = torch.zeros(ids.shape[0], int(responses.max()), dtype=torch.float64)
    entropy = torch.zeros_like(logp)
    for i, (p, r) in enumerate(zip(prompts.tolist(), responses.tolist())):
        rows = lp[i, p - 1 : p - 1 + r]
        logp[i, :r] = torch.gather(rows, 1, ids[i, p : p + r].unsqueeze(1)).squeeze(1)
        entropy[i, :r] = -(rows.exp() * rows).sum(-1)
    return logp, entropy


def actor_loss(logp, old, adv, mask):
    """verl's compute_policy_loss (dual-clip 3), token-mean, with per-token advantages."""
    ratio = torch.exp(torch.clamp(logp - old, min=-20.0, max=20.0))
    clip1 = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - CLIP_RATIO, 1 + CLIP_RATIO))
    losses = torch.where(adv < 0, torch.minimum(-adv * 3.0, clip1), clip1)
    clipfrac = masked_mean(torch.gt(-adv * torch.clamp(ratio, 1 - CLIP_RATIO, 1 + CLIP_RATIO), -adv * ratio).double(),
                           mask)
    return masked_mean(losses, mask), clipfrac


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
            fixture["actor_advantages"] = adv.float()
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
    # The actor: the policy's log-probabilities at TEMPERATURE; rollout-time ones near them, so that
    # some ratios leave the clip range; the surrogate with the whitened GAE advantages.
    with torch.no_grad():
        logp, entropy = actor_logps(init, ids, prompts, responses)
    actor_old = f32((logp + torch.rand(mask.shape, generator=g, dtype=torch.float64) * 0.6 - 0.3) * mask)
    fixture.update({"actor_logp": logp.float(), "actor_entropy": (entropy * mask).float(), "actor_old_logp":
                    actor_old.float()})
    p = {n: init[n].clone().requires_grad_(True) for n in param_names(CFG)}
    loss, clipfrac = actor_loss(actor_logps(p, ids, prompts, responses)[0], actor_old,
                                f32(fixture["actor_advantages"].double()), mask)
    assert 0 < float(clipfrac) < 1, clipfrac
    loss.backward()
    meta["actor"] = json.dumps({"temperature": TEMPERATURE, "clip_ratio": CLIP_RATIO, "pg_loss": float(loss),
                                "pg_clipfrac": float(clipfrac)})
    for n in param_names(CFG):
        fixture["actor.grad." + n] = p[n].grad.float()
    print(f"[actor at temperature {TEMPERATURE}] pg_loss {float(loss):.8f} pg_clipfrac {float(clipfrac):.4f}")
    save_file(fixture, os.path.join(out, "reference.safetensors"), metadata=meta)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

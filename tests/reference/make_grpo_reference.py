#!/usr/bin/env python3
"""Reference of stage grpo's objective for Fabrica's tests, written from verl's published formulas
(verl/trainer/ppo/core_algos.py: compute_grpo_outcome_advantage, compute_policy_loss with
dual-clip, agg_loss, kl_penalty), gradients by torch autograd.

A fixed batch of rollouts of make_reference.py's tiny Llama (prompts masked; responses of
different lengths), with "old" and reference log-probabilities set near the policy's so that the
ratio clip, the dual clip and the KL clamps are all reached. The policy's log-probabilities are
of softmax(logits / TEMPERATURE), the rollout temperature, as verl's actor (dp_actor.py:
logits.div_(temperature)) and TRL's GRPOTrainer (logits / temperature) take them. For each
loss_agg_mode and each KL setting (none, k1, k2, k3): the loss and the gradient of every
parameter; one more case at temperature 1; the policy's per-token log-probabilities and entropies
at TEMPERATURE. And the group-normalised advantages of groups of 1, 2 and 8 responses, with and
without the std.

Issue 31's losses on the same batch (POLICY_CASES): GSPO written as TRL's sequence-level ratio
(importance_sampling_level "sequence": exp of the mean log-ratio, the gradient through the mean),
against old log-probabilities whose per-response mean ratios reach both clips and stay inside;
CISPO (MiniMax-M1: -sg(clamp(ratio, 1 - low, 1 + high)) A logp); Dr. GRPO's sum / (B
max_new_tokens) (TRL's dr_grpo); and TRL's mask_truncated_completions (responses marked cut take no
part). The advantages of rloo (verl), TRL's scale_rewards group / batch (std + 1e-4) and
REINFORCE++'s whitened discounted returns (verl); DAPO's overlong penalty.

Rollout correction (ROLLOUT_IS_CASES), written from verl's compute_rollout_correction_weights
(trainer/ppo/rollout_corr_helper.py) and its use in compute_policy_loss (pg_losses *
rollout_is_weights, the KL term unweighted): rollout log-probabilities off the old ones by up to
1.3 nats a token (one past the safety bound of 20), token-level (truncated at 2) and
sequence-level weights, with and without rollout_is_batch_normalize, under vanilla, cispo and
gspo; the loss, every gradient and verl's rollout_is_mean / _ratio_fraction_high / _low /
_batch_norm_factor.

usage: make_grpo_reference.py OUT_DIR    (writes OUT_DIR/grpo/)
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_reference import CONFIGS, IGNORE_INDEX, forward, init_params, param_names  # noqa: E402
from safetensors_io import save_file  # noqa: E402

CFG = dict(CONFIGS["llama"])
SEED = 1818
CLIP_LOW, CLIP_HIGH, CLIP_C = 0.2, 0.28, 3.0
KL_COEF = 0.1
TEMPERATURE = 0.7  # the rollout temperature the log-probabilities are taken at (not 1: the tests see it)
AGG_MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
MAX_NEW_TOKENS = 10  # seq-mean-token-sum-norm's constant length (the longest response is 8)
TRUNCATED = [0, 1, 0, 0, 1, 0]  # responses cut at max_new_tokens, for mask_truncated_completions
# (policy loss, loss_agg_mode, KL type, masked): each against a formula of its own below.
POLICY_CASES = [("gspo", "token-mean", "none", False), ("gspo", "seq-mean-token-mean", "k3", False),
                ("gspo", "seq-mean-token-sum", "none", False), ("cispo", "token-mean", "none", False),
                ("cispo", "seq-mean-token-sum", "k1", False), ("vanilla", "seq-mean-token-sum-norm", "none", False),
                ("vanilla", "token-mean", "k2", True), ("gspo", "seq-mean-token-sum-norm", "none", True)]
KL_TYPES = ["none", "k1", "k2", "k3"]
# (level, batch normalize, policy loss, loss_agg_mode, KL type)
ROLLOUT_IS_CASES = [("token", False, "vanilla", "token-mean", "k3"), ("sequence", False, "vanilla", "seq-mean-token-mean", "none"),
                    ("token", True, "cispo", "token-mean", "none"), ("sequence", True, "gspo", "seq-mean-token-sum", "none")]
IS_THRESHOLD = 2.0
SAFETY_BOUND = 20.0


def group_advantages(scores, index, norm_by_std, eps=1e-6):
    """verl's GRPO outcome advantage: a group of one has mean 0 and std 1."""
    out = scores.clone()
    for g in sorted(set(index)):
        members = [i for i, x in enumerate(index) if x == g]
        s = scores[members]
        if len(members) == 1:
            mean, std = torch.tensor(0.0, dtype=s.dtype), torch.tensor(1.0, dtype=s.dtype)
        else:
            mean, std = s.mean(), s.std()  # unbiased
        out[members] = (s - mean) / (std + eps) if norm_by_std else s - mean
    return out


def masked_mean(x, mask):
    return (x * mask).sum() / mask.sum()


def agg_loss(loss_mat, mask, mode):
    if mode == "seq-mean-token-sum-norm":  # TRL's dr_grpo: every row counts in B, masked or not
        return (loss_mat * mask).sum() / (loss_mat.shape[0] * MAX_NEW_TOKENS)
    if mode == "token-mean":
        return masked_mean(loss_mat, mask)
    seq_sum = (loss_mat * mask).sum(-1)
    if mode == "seq-mean-token-sum":
        return seq_sum.mean()
    return (seq_sum / mask.sum(-1)).mean()


def kl_penalty(logp, ref, kind):
    if kind == "k1":
        return logp - ref
    if kind == "k2":
        return 0.5 * (logp - ref).square()
    kl = torch.clamp(ref - logp, min=-20, max=20)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


def policy_loss(logp, old, adv, mask, mode, is_weight=1.0):
    neg_kl = torch.clamp(logp - old, min=-20.0, max=20.0)
    ratio = torch.exp(neg_kl)
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH)
    clip1 = torch.maximum(l1, l2)
    l3 = -adv * CLIP_C
    clip2 = torch.minimum(l3, clip1)
    losses = torch.where(adv < 0, clip2, clip1)
    clipfrac = masked_mean(torch.gt(l2, l1).double(), mask)
    lower = masked_mean((torch.gt(clip1, l3) & (adv < 0)).double(), mask)
    return agg_loss(losses * is_weight, mask, mode), clipfrac, lower


def gspo_loss(logp, old, adv, mask, mode, is_weight=1.0):
    """TRL's importance_sampling_level "sequence": one ratio per response, exp(mean log-ratio)."""
    seq_log_ratio = ((logp - old) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
    ratio = torch.exp(seq_log_ratio).expand_as(logp)
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH)
    losses = torch.maximum(l1, l2)
    return agg_loss(losses * is_weight, mask, mode), masked_mean(torch.gt(l2, l1).double(), mask), torch.tensor(0.0)


def cispo_loss(logp, old, adv, mask, mode, is_weight=1.0):
    """MiniMax-M1's CISPO: the clipped ratio as a constant weight of the log-probability."""
    ratio = torch.exp(torch.clamp(logp - old, min=-20.0, max=20.0))
    weight = torch.clamp(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH).detach()
    losses = -weight * adv * logp
    return agg_loss(losses * is_weight, mask, mode), masked_mean(torch.ne(weight, ratio).double(), mask), torch.tensor(0.0)


def rollout_is_weights(old, rollout, mask, level, normalize):
    """verl's compute_rollout_correction_weights: the weights (constants) and its metrics."""
    log_ratio = old - rollout
    if level == "token":
        w = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
        high = masked_mean((w > IS_THRESHOLD).double(), mask)
        low = masked_mean((w < 1 / IS_THRESHOLD).double(), mask)
    else:
        s = (log_ratio * mask).sum(-1, keepdim=True)
        w = torch.exp(torch.clamp(s, -SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
        high = (s > torch.log(torch.tensor(IS_THRESHOLD, dtype=s.dtype))).double().mean()
        low = (s < torch.log(torch.tensor(1 / IS_THRESHOLD, dtype=s.dtype))).double().mean()
    w = w * mask
    metrics = {"rollout_is_mean": float(masked_mean(w, mask)), "rollout_is_ratio_fraction_high": float(high),
               "rollout_is_ratio_fraction_low": float(low)}
    w = w.clamp(max=IS_THRESHOLD).detach()
    if normalize:
        if level == "token":
            mean = masked_mean(w, mask)
        else:
            mean = ((w * mask).sum(-1) / mask.sum(-1)).mean()
        w = w / mean
        metrics["rollout_is_batch_norm_factor"] = float(mean)
    return w, metrics


def rloo_advantages(scores, index):
    """verl's compute_rloo_outcome_advantage."""
    out = scores.clone()
    for g in sorted(set(index)):
        members = [i for i, x in enumerate(index) if x == g]
        n = len(members)
        if n > 1:
            mean = scores[members].mean()
            out[members] = scores[members] * n / (n - 1) - mean * n / (n - 1)
    return out


def trl_advantages(scores, index, scale):
    """TRL's GRPOTrainer: r - the group's mean, over the group's or the batch's std + 1e-4."""
    out = scores.clone()
    for g in sorted(set(index)):
        members = [i for i, x in enumerate(index) if x == g]
        out[members] = scores[members] - scores[members].mean()
        if scale == "group" and len(members) == 1:  # TRL's std of one reward is NaN; the test skips it
            out[members] = 0.0
        elif scale == "group":
            out[members] = out[members] / (scores[members].std() + 1e-4)
    return out / (scores.std() + 1e-4) if scale == "batch" else out


def reinforce_pp_advantages(scores, lengths, gamma):
    """verl's compute_reinforce_plus_plus_outcome_advantage over a padded (B, T) batch."""
    t = max(lengths)
    mask = torch.zeros(len(lengths), t, dtype=torch.float64)
    rewards = torch.zeros(len(lengths), t, dtype=torch.float64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        rewards[i, n - 1] = scores[i]
    returns = torch.zeros_like(rewards)
    running = torch.zeros(len(lengths), dtype=torch.float64)
    for k in reversed(range(t)):
        running = rewards[:, k] + gamma * running
        returns[:, k] = running
        running = running * mask[:, k]
    mean = masked_mean(returns, mask)
    var = masked_mean((returns - mean) ** 2, mask) * mask.sum() / (mask.sum() - 1)
    whitened = (returns - mean) * torch.rsqrt(var + 1e-8)
    return [whitened[i, :n].tolist() for i, n in enumerate(lengths)]


def token_logps(params, ids, labels, temperature, with_entropy=False):
    """log p of each target (position t predicts token t + 1) under softmax(logits / temperature),
    (B, T - 1), and the target mask (and the entropy of each position's distribution)."""
    logits = forward(CFG, params, ids) / temperature  # verl: logits.div_(temperature), in the logits' f32
    lp = logits.double()[:, :-1].log_softmax(-1)
    target = labels[:, 1:]
    mask = (target != IGNORE_INDEX).double()
    logp = torch.gather(lp, 2, target.clamp(min=0).unsqueeze(2)).squeeze(2) * mask
    if not with_entropy:
        return logp, mask
    entropy = -(lp.exp() * lp).sum(-1) * mask
    return logp, mask, entropy


def make_rollouts(g):
    prompts = [3, 4, 5, 3, 4, 6]
    responses = [5, 2, 7, 4, 8, 3]
    t = max(p + r for p, r in zip(prompts, responses))
    n = len(prompts)
    ids = torch.zeros(n, t, dtype=torch.int64)
    labels = torch.full((n, t), IGNORE_INDEX, dtype=torch.int64)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        row = torch.randint(3, CFG["vocab_size"], (p + r,), generator=g)
        ids[i, : p + r] = row
        labels[i, p : p + r] = row[p:]
    return ids, labels, torch.tensor(prompts), torch.tensor(responses)


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = os.path.join(argv[1], "grpo")
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(SEED)
    init = init_params(CFG, SEED)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CFG, f, indent=2)
        f.write("\n")
    save_file(init, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    ids, labels, prompt_lens, response_lens = make_rollouts(g)
    with torch.no_grad():
        logp, mask, entropy = token_logps(init, ids, labels, TEMPERATURE, with_entropy=True)
    # Old log-probabilities: ratios spread over the clip range, some far past 1 + clip (dual clip
    # for negative advantages), one past the -20 clamp; reference ones across the k3 clamps.
    shift = (torch.rand(logp.shape, generator=g, dtype=torch.float64) * 1.2 - 0.6)
    shift[0, 4] = -1.6
    shift[2, 6] = -1.5
    shift[3, 5] = 1.4
    shift[4, 7] = 25.0
    old = (logp + shift) * mask
    ref_shift = torch.rand(logp.shape, generator=g, dtype=torch.float64) * 2.0 - 1.0
    ref_shift[1, 4] = 13.0  # k3 past its clamp of 10
    ref_shift[4, 9] = -30.0  # k3's log-ratio past its clamp of 20
    ref = (logp + ref_shift) * mask
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.5], dtype=torch.float64)
    index = [0, 0, 0, 1, 1, 2]
    adv = group_advantages(rewards, index, True)
    fixture = {"ids": ids, "labels": labels, "prompt_lengths": prompt_lens, "response_lengths": response_lens,
               "old_logp": old.float(), "ref_logp": ref.float(), "advantages": adv.float(),  # the C++ side reads f32
               "policy_logp": logp.float(), "policy_entropy": entropy.float()}
    meta = {"clip_ratio_low": repr(CLIP_LOW), "clip_ratio_high": repr(CLIP_HIGH), "clip_ratio_c": repr(CLIP_C),
            "kl_loss_coef": repr(KL_COEF), "temperature": repr(TEMPERATURE), "torch_version": torch.__version__}
    names = param_names(CFG)
    cases = []
    # Every mode and KL type at TEMPERATURE; one case at temperature 1 (named NAME@1).
    runs = [(mode, kind, TEMPERATURE) for mode in AGG_MODES for kind in KL_TYPES] + [("token-mean", "k3", 1.0)]
    for mode, kind, temperature in runs:
        p = {n: init[n].clone().requires_grad_(True) for n in names}
        lp, m = token_logps(p, ids, labels, temperature)
        pg, clipfrac, lower = policy_loss(lp, old.float().double(), adv.float().double().unsqueeze(1), m, mode)
        loss = pg
        if kind != "none":
            loss = loss + KL_COEF * agg_loss(kl_penalty(lp, ref.float().double(), kind), m, mode)
        loss.backward()
        name = f"{mode}.{kind}" + ("" if temperature == TEMPERATURE else f"@{temperature:g}")
        cases.append(name)
        meta[name] = json.dumps({"loss": float(loss), "pg_clipfrac": float(clipfrac),
                                 "pg_clipfrac_lower": float(lower)})
        for n in names:
            fixture[name + ".grad." + n] = p[n].grad.float()
        print(f"[{name}] loss {float(loss):.8f} clipfrac {float(clipfrac):.4f} lower {float(lower):.4f}")
    meta["cases"] = json.dumps(cases)
    # GSPO's old log-probabilities: per-response mean log-ratios past 1 + high (A > 0: clipped; A < 0:
    # not), below 1 - low (A < 0: clipped) and inside, with per-token noise.
    seq_shift = torch.tensor([-0.5, 0.3, -0.5, -0.1, 0.4, 0.02], dtype=torch.float64).unsqueeze(1)
    noise = torch.rand(logp.shape, generator=g, dtype=torch.float64) * 0.1 - 0.05
    old_gspo = (logp + seq_shift + noise) * mask
    fixture["old_logp_gspo"] = old_gspo.float()
    fixture["truncated"] = torch.tensor(TRUNCATED, dtype=torch.int64)
    meta["max_new_tokens"] = repr(MAX_NEW_TOKENS)
    policy_cases = []
    for policy, mode, kind, masked in POLICY_CASES:
        p = {n: init[n].clone().requires_grad_(True) for n in names}
        lp, m = token_logps(p, ids, labels, TEMPERATURE)
        if masked:
            m = m * (1 - torch.tensor(TRUNCATED, dtype=torch.float64)).unsqueeze(1)
        a = adv.float().double().unsqueeze(1)
        the_old = (old_gspo if policy == "gspo" else old).float().double()
        if policy == "gspo":
            pg, clipfrac, lower = gspo_loss(lp, the_old, a, m, mode)
        elif policy == "cispo":
            pg, clipfrac, lower = cispo_loss(lp, the_old, a, m, mode)
        else:
            pg, clipfrac, lower = policy_loss(lp, the_old, a, m, mode)
        loss = pg
        if kind != "none":
            loss = loss + KL_COEF * agg_loss(kl_penalty(lp, ref.float().double(), kind), m, mode)
        loss.backward()
        name = f"{policy}.{mode}.{kind}" + (".masked" if masked else "")
        policy_cases.append(name)
        meta[name] = json.dumps({"loss": float(loss), "pg_clipfrac": float(clipfrac),
                                 "pg_clipfrac_lower": float(lower)})
        for n in names:
            fixture[name + ".grad." + n] = p[n].grad.float()
        print(f"[{name}] loss {float(loss):.8f} clipfrac {float(clipfrac):.4f}")
    meta["policy_cases"] = json.dumps(policy_cases)
    # Advantages of groups of 1, 2 and 8 (one of them with equal rewards: std 0).
    adv_index = [0, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3]
    adv_rewards = torch.tensor([0.7, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 2.5, 0.0, 1.0, -1.0, 0.3, 0.3], dtype=torch.float64)
    meta["advantages"] = json.dumps({"index": adv_index, "rewards": adv_rewards.tolist(),
                                     "norm": group_advantages(adv_rewards, adv_index, True).tolist(),
                                     "mean_only": group_advantages(adv_rewards, adv_index, False).tolist(),
                                     "rloo": rloo_advantages(adv_rewards, adv_index).tolist(),
                                     "trl_group": trl_advantages(adv_rewards, adv_index, "group").tolist(),
                                     "trl_batch": trl_advantages(adv_rewards, adv_index, "batch").tolist(),
                                     "batch_std": float(adv_rewards.std())})
    lengths = [3, 1, 5, 2, 4, 4, 1, 2, 3, 5, 2, 1, 3]
    meta["reinforce_pp"] = json.dumps({"lengths": lengths, "gamma_1": reinforce_pp_advantages(adv_rewards, lengths, 1.0),
                                       "gamma_0.9": reinforce_pp_advantages(adv_rewards, lengths, 0.9)})
    # DAPO's overlong penalty (verl's DAPORewardManager) at max_new_tokens 20, buffer 8, factor 0.5.
    meta["overlong"] = json.dumps({str(n): min(-(n - (20 - 8)) / 8 * 0.5, 0) for n in [1, 12, 13, 16, 20]})
    # Rollout correction: the rollout engine's log-probabilities off the old ones (of vanilla/cispo,
    # and of gspo) by up to 1.3 nats a token; one token past the safety bound.
    rollout_shift = torch.rand(logp.shape, generator=g, dtype=torch.float64) * 2.6 - 1.3
    rollout_shift[2, 7] = 25.0
    for suffix, the_old in [("", old), ("_gspo", old_gspo)]:
        fixture["rollout_logp" + suffix] = ((the_old.float().double() - rollout_shift) * mask).float()
    is_cases = []
    for level, normalize, policy, mode, kind in ROLLOUT_IS_CASES:
        suffix = "_gspo" if policy == "gspo" else ""
        the_old = (old_gspo if policy == "gspo" else old).float().double()
        p = {n: init[n].clone().requires_grad_(True) for n in names}
        lp, m = token_logps(p, ids, labels, TEMPERATURE)
        w, metrics = rollout_is_weights(the_old, fixture["rollout_logp" + suffix].double(), m, level, normalize)
        a = adv.float().double().unsqueeze(1)
        loss_fn = {"vanilla": policy_loss, "gspo": gspo_loss, "cispo": cispo_loss}[policy]
        pg, clipfrac, lower = loss_fn(lp, the_old, a, m, mode, w)
        loss = pg
        if kind != "none":
            loss = loss + KL_COEF * agg_loss(kl_penalty(lp, ref.float().double(), kind), m, mode)
        loss.backward()
        name = f"rollout_is.{level}{'.normalize' if normalize else ''}.{policy}.{mode}.{kind}"
        is_cases.append(name)
        meta[name] = json.dumps(dict(metrics, loss=float(loss), pg_clipfrac=float(clipfrac),
                                     pg_clipfrac_lower=float(lower)))
        for n in names:
            fixture[name + ".grad." + n] = p[n].grad.float()
        print(f"[{name}] loss {float(loss):.8f} {metrics}")
    meta["rollout_is_cases"] = json.dumps(is_cases)
    meta["rollout_is_threshold"] = repr(IS_THRESHOLD)
    save_file(fixture, os.path.join(out, "reference.safetensors"), metadata=meta)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

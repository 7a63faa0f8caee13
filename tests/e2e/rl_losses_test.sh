#!/usr/bin/env bash
# Issue 31's RL keys through `fabrica train` on a tiny model: every policy_loss, TRL's loss_type,
# importance_sampling_level, scale_rewards and epsilon / epsilon_high spellings, each
# adv_estimator of stage grpo, mask_truncated_completions, DAPO's filter_groups (with its counts in
# metrics.jsonl) and overlong shaping; rollout_logp_diff_mean / _max logged every step, 0 with
# logp_kernels rollout (the default, fp32 and bf16) and not with the training kernels; and each
# key's refusals (exit 2, naming the key); rollout correction (rollout_is token / sequence, batch
# normalised, the issue's rollout_correction spelling, fp32 and bf16) with verl's metrics.
# Usage: rl_losses_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$@"
e2e_workdir
tiny_model model
rl_task 6
{ grpo_config; echo "lr_scheduler_type: constant"; echo "seed: 3"; } > run.yaml

# name: overrides (each run 2 steps); the python below checks what each must log.
runs=(
  "gspo:policy_loss=gspo loss_type=grpo"
  "sequence:importance_sampling_level=sequence epsilon=0.1 epsilon_high=0.3"
  "cispo:policy_loss=cispo clip_ratio_low=1 clip_ratio_high=4"
  "dr_grpo:loss_type=dr_grpo scale_rewards=none"
  "dapo:loss_type=dapo scale_rewards=batch mask_truncated_completions=true overlong_buffer_len=4 overlong_penalty_factor=1"
  "rloo:adv_estimator=rloo"
  "rpp:adv_estimator=reinforce_plus_plus gamma=0.9"
  "filter:filter_groups=true max_num_gen_batches=3 scale_rewards=group"
  "tis:rollout_correction=token_is"
  "seq_is:rollout_is=sequence rollout_is_threshold=1.5 rollout_is_batch_normalize=true"
  "tis_bf16:rollout_is=token bf16=true"
  "training_kernels:logp_kernels=training"
)
for entry in "${runs[@]}"; do
  name=${entry%%:*}
  # shellcheck disable=SC2086
  "$fabrica" train run.yaml output_dir=$name ${entry#*:} >$name.log 2>&1 || { cat $name.log; fail "grpo $name"; }
done
/usr/bin/python3 - <<'PY' || fail "rl loss metrics"
import json
def rows(d):
    return [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
# logp_kernels rollout (the default): the training forward's log-probabilities are the rollout
# engine's bit for bit, fp32 and bf16; with the training kernels they differ by rounding.
for name in ["gspo", "sequence", "cispo", "dr_grpo", "dapo", "rloo", "rpp", "filter", "tis", "seq_is", "tis_bf16",
             "training_kernels"]:
    r = rows(name)
    assert len(r) == 2, (name, r)
    for j in r:
        for key in ["loss", "pg_loss", "pg_clipfrac", "rollout_logp_diff_mean", "rollout_logp_diff_max"]:
            assert key in j, (name, key, j)
        if name == "training_kernels":
            assert 0 < j["rollout_logp_diff_max"] < 1e-3, (name, j)
        else:
            assert j["rollout_logp_diff_mean"] == 0 and j["rollout_logp_diff_max"] == 0, (name, j)
f = rows("filter")
for j in f:
    for key in ["filter_groups/num_gen_batches", "filter_groups/kept_groups", "filter_groups/dropped_groups",
                "filter_groups/refilled_groups"]:
        assert key in j, (key, j)
    assert 1 <= j["filter_groups/num_gen_batches"] <= 3, j
    assert j["filter_groups/kept_groups"] + j["filter_groups/refilled_groups"] == 2, j
rpp = rows("rpp")
assert all(abs(j["advantages_mean"]) < 1e-6 for j in rpp), rpp  # whitened over the batch's tokens
d = rows("dapo")
assert all(j["reward_min"] < 0 or j["response_length_mean"] <= 4 for j in d), d  # the overlong penalty
# Rollout correction: verl's metrics every step; the engine's log-probabilities being the training
# forward's, every weight is exactly 1.
for name in ["tis", "seq_is", "tis_bf16"]:
    for j in rows(name):
        for key in ["rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_ratio_fraction_high",
                    "rollout_corr/rollout_is_ratio_fraction_low"]:
            assert key in j, (name, key, j)
        assert j["rollout_corr/rollout_is_mean"] == 1, (name, j)
        assert j["rollout_corr/rollout_is_ratio_fraction_high"] == 0, (name, j)
        assert ("rollout_corr/rollout_is_batch_norm_factor" in j) == (name == "seq_is"), (name, j)
print("ok: rollout correction (weights 1); rollout_logp_diff 0 with the rollout kernels, fp32 and bf16; with the "
      "training kernels up to", max(j["rollout_logp_diff_max"] for j in rows("training_kernels")))
print("ok: 8 loss / advantage settings trained; filter_groups gen batches", [j["filter_groups/num_gen_batches"] for j in f])
PY
grep -q "^loss_agg_mode: seq-mean-token-sum-norm" dr_grpo/train_config.yaml || fail "loss_type dr_grpo: no loss_agg_mode"
grep -q "^policy_loss: gspo" sequence/train_config.yaml || fail "importance_sampling_level sequence: not gspo"
/usr/bin/python3 -c "
v = {l.split(':')[0]: l.split(':', 1)[1].strip() for l in open('sequence/train_config.yaml') if ':' in l}
assert abs(float(v['clip_ratio_high']) - 0.3) < 1e-12 and abs(float(v['clip_ratio_low']) - 0.1) < 1e-12, v
" || fail "epsilon / epsilon_high did not set clip_ratio_low / _high"

refuse() {  # refuse NAME EXPECTED_TEXT OVERRIDES...
  local name=$1 text=$2 rc=0
  shift 2
  "$fabrica" train run.yaml output_dir=bad_$name "$@" >bad_$name.log 2>&1 || rc=$?
  [ "$rc" -eq 2 ] && grep -qF -- "$text" bad_$name.log || { cat bad_$name.log; fail "$name not refused"; }
}
refuse policy 'policy_loss "ppo2" must be vanilla, gspo or cispo' policy_loss=ppo2
refuse loss_type 'loss_type "sapo" must be grpo, bnpo, dr_grpo or dapo' loss_type=sapo
refuse loss_type_agg 'loss_type dapo means loss_agg_mode token-mean, but loss_agg_mode is seq-mean-token-mean' \
  loss_type=dapo loss_agg_mode=seq-mean-token-mean
refuse level 'importance_sampling_level sequence is policy_loss gspo, but policy_loss is cispo' \
  importance_sampling_level=sequence policy_loss=cispo
refuse level_name 'importance_sampling_level "seq" must be token or sequence' importance_sampling_level=seq
refuse gae 'adv_estimator "gae" with stage grpo' adv_estimator=gae
refuse scale 'scale_rewards "batchwise" must be group, batch or none' scale_rewards=batchwise
refuse scale_std 'norm_adv_by_std false and scale_rewards group disagree' scale_rewards=group norm_adv_by_std=false
refuse scale_rloo 'scale_rewards is the scaling of adv_estimator grpo' scale_rewards=batch adv_estimator=rloo
refuse gen_batches 'max_num_gen_batches must be at least 1, got 0' filter_groups=true max_num_gen_batches=0
refuse overlong 'overlong_buffer_len must be in [0, max_new_tokens 8], got 9' overlong_buffer_len=9
refuse low 'clip_ratio_low must be in [0, 1), got 1' epsilon=1
refuse twice 'key "clip_ratio_high" is set twice' epsilon_high=0.3 clip_ratio_high=0.3
refuse rollout_is 'rollout_is "tokens" must be token or sequence' rollout_correction=tokens
refuse is_threshold 'rollout_is_threshold must be > 0, got 0' rollout_is=token rollout_is_threshold=0
refuse logp_kernels 'logp_kernels "decode" must be rollout or training' logp_kernels=decode
echo "ok: 16 bad settings refused with exit 2, each naming its key"

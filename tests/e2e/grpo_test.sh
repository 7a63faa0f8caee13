#!/usr/bin/env bash
# stage grpo through `fabrica train` on a tiny model: {prompt, answer} JSONL prompts, a command
# reward (JSON lines in, a score per line out) summed with exact_match; reward_mean and the other
# metrics in metrics.jsonl at every step; a second run with the same seed reproduces the first
# bit for bit; a run resumed from its step-2 checkpoint reproduces steps 3-4 and the final
# weights; LoRA and full fine-tuning with the KL term to the reference; 2 data-parallel ranks
# with ZeRO-2; tensor parallel refused.
# Usage: grpo_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$@"
e2e_workdir
tiny_model model
rl_task 6
cat > run.yaml <<YAML
model_name_or_path: model
stage: grpo
dataset: prompts.jsonl
template: qwen3_nothink
reward: exact_match,command:/usr/bin/python3 $work/score.py
num_generations: 4
per_device_train_batch_size: 2
ppo_mini_batch_size: 1
ppo_epochs: 2
temperature: 1.0
top_p: 0.9
top_k: 50
max_new_tokens: 8
learning_rate: 1.0e-2
lr_scheduler_type: constant
max_steps: 4
logging_steps: 1
save_steps: 2
seed: 3
output_dir: out
YAML

rl_three_runs grpo
[ -f out/model.safetensors ] && [ -d out/checkpoint-2 ] || fail "no final model or checkpoint-2"
/usr/bin/python3 - <<'PY' || fail "grpo metrics"
import json
def rows(d):
    return {j["step"]: j for j in map(json.loads, open(f"{d}/metrics.jsonl"))}
a, b, r = rows("out"), rows("again"), rows("resumed")
assert sorted(a) == [1, 2, 3, 4], sorted(a)
for step, j in a.items():
    for key in ["reward_mean", "reward_max", "reward_min", "accuracy", "response_length_mean", "response_clip_ratio",
                "entropy", "pg_loss", "pg_clipfrac", "ppo_kl", "advantages_mean", "advantages_max", "advantages_min",
                "timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor", "rollout_tokens_per_s"]:
        assert key in j, (step, key)
    assert j["reward_min"] <= j["reward_mean"] <= j["reward_max"], j
assert any(j["reward_max"] > j["reward_min"] for j in a.values()), "every group scored alike: nothing to learn"
keys = ["loss", "grad_norm", "reward_mean", "response_length_mean", "pg_clipfrac", "entropy"]
for step in a:
    for key in keys:
        assert a[step][key] == b[step][key], ("same seed, other result", step, key, a[step][key], b[step][key])
for step in (3, 4):
    for key in keys:
        assert a[step][key] == r[step][key], ("resume differs", step, key, a[step][key], r[step][key])
print("ok: reward_mean every step", [round(a[s]["reward_mean"], 3) for s in sorted(a)],
      "; same seed and resume reproduce loss, grad_norm and rewards exactly")
PY
cmp out/model.safetensors again/model.safetensors || fail "same seed, other final weights"
cmp out/model.safetensors resumed/model.safetensors || fail "final weights differ after resume"

# The KL term to the reference: the starting weights (full), the adapters off (LoRA).
for ft in full lora; do
  "$fabrica" train run.yaml output_dir=kl_$ft finetuning_type=$ft kl_loss_coef=0.1 kl_loss_type=k3 max_steps=2 \
    save_steps=0 >kl_$ft.log 2>&1 || { cat kl_$ft.log; fail "grpo $ft with kl"; }
  /usr/bin/python3 -c "
import json
rows = [json.loads(l) for l in open('kl_$ft/metrics.jsonl')]
assert all('kl' in j and 'timing_s/ref' in j for j in rows), rows
assert rows[-1]['kl'] > 0, rows  # the policy has left the reference after one update
print('ok: $ft with kl_loss_coef, kl', [round(j['kl'], 6) for j in rows])
" || fail "kl metrics ($ft)"
done
[ -f kl_lora/adapter_model.safetensors ] || fail "no LoRA adapter saved"

# Data parallel with ZeRO-2: each rank rolls out its own prompts; metrics are summed over the ranks.
"$fabrica" train run.yaml output_dir=dp nproc_per_node=2 zero_stage=2 max_steps=2 save_steps=0 >dp.log 2>&1 \
  || { cat dp.log; fail "grpo on 2 ranks"; }
/usr/bin/python3 -c "
import json
rows = [json.loads(l) for l in open('dp/metrics.jsonl')]
assert len(rows) == 2 and all('reward_mean' in j and j['world_size'] == 2 for j in rows), rows
print('ok: 2 data-parallel ranks, reward_mean', [round(j['reward_mean'], 3) for j in rows])
" || fail "dp metrics"

rc=0
"$fabrica" train run.yaml output_dir=tp nproc_per_node=2 tensor_parallel_size=2 >tp.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "stage grpo with tensor_parallel_size 2" tp.log || { cat tp.log; fail "tp not refused"; }
rc=0
"$fabrica" train run.yaml output_dir=bad reward=bleu >bad.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q 'unknown reward "bleu"' bad.log || { cat bad.log; fail "bad reward not refused"; }
echo "ok: tensor parallel and an unknown reward refused with exit 2"

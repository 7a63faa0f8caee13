#!/usr/bin/env bash
# stage ppo through `fabrica train` on a tiny model: {prompt, answer} JSONL prompts, a command
# reward summed with exact_match, the KL penalty in the reward, GAE with lam 0.95 and one
# critic-only warmup step; reward_mean and the critic's metrics in metrics.jsonl at every step;
# a second run with the same seed reproduces the first bit for bit; a run resumed from its step-2
# checkpoint (which holds the critic and its AdamW state) reproduces steps 3-4, the final actor and
# the final critic; a critic from critic_model_path keeps its value head; LoRA actor with a full
# critic; 2 data-parallel ranks; a checkpoint without its critic and tensor parallel refused.
# Usage: ppo_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
reference=$(realpath "$(dirname "$0")/../reference")  # safetensors_io.py
e2e_begin "$@"
e2e_workdir
tiny_model model
rl_task 8
cat > run.yaml <<YAML
model_name_or_path: model
stage: ppo
dataset: prompts.jsonl
template: qwen3_nothink
reward: exact_match,command:/usr/bin/python3 $work/score.py
per_device_train_batch_size: 4
ppo_mini_batch_size: 2
ppo_epochs: 2
gamma: 1.0
lam: 0.95
cliprange_value: 0.2
use_kl_in_reward: true
kl_penalty: low_var_kl
kl_coef: 0.05
critic_learning_rate: 5.0e-3
critic_warmup: 2
temperature: 1.0
top_p: 0.9
max_new_tokens: 8
learning_rate: 1.0e-2
lr_scheduler_type: constant
max_steps: 4
logging_steps: 1
save_steps: 2
seed: 5
output_dir: out
YAML

rl_three_runs ppo
[ -f out/model.safetensors ] && [ -f out/critic/value_head.safetensors ] || fail "no final actor or critic"
ls out/checkpoint-2/critic/optimizer-rank-0-of-1.safetensors >/dev/null || fail "checkpoint-2 has no critic optimizer"
/usr/bin/python3 - <<'PY' || fail "ppo metrics"
import json
def rows(d):
    return {j["step"]: j for j in map(json.loads, open(f"{d}/metrics.jsonl"))}
a, b, r = rows("out"), rows("again"), rows("resumed")
assert sorted(a) == [1, 2, 3, 4], sorted(a)
for step, j in a.items():
    for key in ["reward_mean", "accuracy", "advantages_mean", "critic/vf_loss", "critic/vf_clipfrac",
                "critic/vpred_mean", "critic/returns_mean", "critic/values_mean", "critic/grad_norm", "critic/lr",
                "actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff", "timing_s/gen", "timing_s/ref",
                "timing_s/values", "timing_s/update_critic"]:
        assert key in j, (step, key)
    assert abs(j["advantages_mean"]) < 1e-6, j  # whitened over the step's tokens
    assert ("pg_loss" in j) == (step >= 2), (step, "critic_warmup 2: the actor updates from step 2 on")
assert a[1]["critic/values_mean"] == 0.0, a[1]  # a zero value head before the first update
assert a[1]["actor/reward_kl_penalty"] == 0.0 and a[2]["actor/reward_kl_penalty"] == 0.0, "actor unchanged yet"
assert a[4]["actor/reward_kl_penalty"] > 0, a[4]
assert a[4]["critic/values_mean"] != 0.0, a[4]
keys = ["loss", "grad_norm", "reward_mean", "critic/vf_loss", "critic/vpred_mean", "critic/grad_norm",
        "critic/returns_mean", "advantages_max"]
for step in a:
    for key in keys:
        assert a[step][key] == b[step][key], ("same seed, other result", step, key, a[step][key], b[step][key])
for step in (3, 4):
    for key in keys:
        assert a[step][key] == r[step][key], ("resume differs", step, key, a[step][key], r[step][key])
print("ok: reward_mean", [round(a[s]["reward_mean"], 3) for s in sorted(a)], "vf_loss",
      [round(a[s]["critic/vf_loss"], 4) for s in sorted(a)],
      "; same seed and resume reproduce the actor's and the critic's figures exactly")
PY
for f in model.safetensors critic/model.safetensors critic/value_head.safetensors; do
  cmp out/$f again/$f || fail "same seed, other final $f"
  cmp out/$f resumed/$f || fail "final $f differs after resume"
done

# A critic from critic_model_path keeps its value head: the trained critic's folder (as a stage rm
# output is laid out), its head replaced by weight 0, bias 1: every value 1.
cp -r out/critic critic_start
/usr/bin/python3 - "$reference" <<'PY'
import sys
import torch
sys.path.insert(0, sys.argv[1])
from safetensors_io import save_file
save_file({"v_head.summary.weight": torch.zeros(1, 32), "v_head.summary.bias": torch.ones(1)},
          "critic_start/value_head.safetensors", metadata={"format": "pt"})
PY
"$fabrica" train run.yaml output_dir=from_rm critic_model_path=critic_start max_steps=1 save_steps=0 >from_rm.log 2>&1 \
  || { cat from_rm.log; fail "ppo with critic_model_path"; }
/usr/bin/python3 -c "
import json
j = json.loads(open('from_rm/metrics.jsonl').readline())
assert abs(j['critic/values_mean'] - 1.0) < 1e-6, j
print('ok: critic_model_path value head kept, values_mean', j['critic/values_mean'])
" || fail "critic_model_path"

# LoRA actor (the reference is the adapters off), full critic; 2 data-parallel ranks with ZeRO-1.
"$fabrica" train run.yaml output_dir=lora finetuning_type=lora max_steps=2 save_steps=0 critic_warmup=0 \
  >lora.log 2>&1 || { cat lora.log; fail "ppo with lora"; }
[ -f lora/adapter_model.safetensors ] && [ -f lora/critic/model.safetensors ] || fail "no LoRA adapter or critic"
"$fabrica" train run.yaml output_dir=dp nproc_per_node=2 zero_stage=1 max_steps=2 save_steps=0 >dp.log 2>&1 \
  || { cat dp.log; fail "ppo on 2 ranks"; }
/usr/bin/python3 -c "
import json
rows = [json.loads(l) for l in open('dp/metrics.jsonl')]
assert len(rows) == 2 and all('critic/vf_loss' in j and j['world_size'] == 2 for j in rows), rows
assert all(abs(j['advantages_mean']) < 1e-6 for j in rows), rows  # whitened over both ranks' tokens
print('ok: lora with a full critic; 2 data-parallel ranks, reward_mean', [round(j['reward_mean'], 3) for j in rows])
" || fail "dp metrics"

mkdir broken && cp -r out/checkpoint-2 broken/ && rm -r broken/checkpoint-2/critic
rc=0
"$fabrica" train run.yaml output_dir=broken resume_from_checkpoint=true >broken.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "holds its critic in critic/" broken.log || { cat broken.log; fail "no critic not refused"; }
rc=0
"$fabrica" train run.yaml output_dir=tp nproc_per_node=2 tensor_parallel_size=2 >tp.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "stage ppo with tensor_parallel_size 2" tp.log || { cat tp.log; fail "tp not refused"; }
echo "ok: a checkpoint without its critic and tensor parallel refused with exit 2"

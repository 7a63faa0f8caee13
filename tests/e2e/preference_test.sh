#!/usr/bin/env bash
# The preference stages through `fabrica train`: LLaMA-Factory's example YAMLs for dpo, kto and
# reward run with only their paths changed (LoRA as they say, and a few
# steps on a tiny model); DPO's first loss is ln 2 (policy = reference); TRL's metric names reach
# metrics.jsonl; the reward model is saved with value_head.safetensors and `fabrica score` reads
# it; 2 data-parallel ranks reproduce one process's losses for every stage; a ranking dataset
# without its rejected answer and a KTO dataset without its tag stop with exit 2 naming the file
# and the field.
# Usage: preference_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$@"
e2e_workdir
data="$shared/data/llamafactory"
tiny_model model

# example NAME: LLaMA-Factory's train_lora_qwen3_lora_NAME.yaml with the model, dataset_dir and
# output_dir paths changed.
example() {
  sed -e "s|^model_name_or_path:.*|model_name_or_path: model|" -e "s|^output_dir:.*|output_dir: out_$1|" \
    "$data/examples/train_lora_qwen3_lora_$1.yaml" > "$1.yaml"
  echo "dataset_dir: $data" >> "$1.yaml"
}
# (A key may be given once on the command line: the longer runs below start from every_run.)
every_run="gradient_accumulation_steps=1 logging_steps=1"
short_run="max_steps=3 max_samples=12 cutoff_len=96 per_device_train_batch_size=2 $every_run"

for name in dpo kto reward; do
  example $name
  # shellcheck disable=SC2086
  "$fabrica" train $name.yaml $short_run >$name.log 2>&1 || { cat $name.log; fail "example $name"; }
done
python3 - <<'PY' || fail "metrics of the examples"
import json, math
def rows(name):
    return [json.loads(l) for l in open(f"out_{name}/metrics.jsonl")]
dpo, kto, rm = rows("dpo"), rows("kto"), rows("reward")
for key in ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
            "logps/rejected", "reference_logps_bytes"]:
    assert key in dpo[0], key
assert abs(dpo[0]["loss"] - math.log(2)) < 1e-6, dpo[0]["loss"]
# The reference stays the base (adapters off) while the adapters train: the policy moves away.
assert abs(dpo[-1]["rewards/margins"]) > 1e-6 and abs(dpo[-1]["loss"] - math.log(2)) > 1e-6, dpo[-1]
for key in ["rewards/chosen", "rewards/rejected", "kl", "logps/chosen", "reference_logps_bytes"]:
    assert any(key in r for r in kto), key
assert abs(kto[0]["loss"] - 0.5) < 1e-6, kto[0]["loss"]  # 1 - sigmoid(0) at the reference, weights 1
for key in ["rewards/accuracy", "rewards/chosen", "rewards/rejected"]:
    assert key in rm[0], key
print(f"  dpo first loss {dpo[0]['loss']:.9f} (ln 2 = {math.log(2):.9f}), kto {kto[0]['loss']:.9f}")
PY
# LoRA: the reward model is the adapter with the value head beside it, as LLaMA-Factory saves it.
[ -f out_reward/value_head.safetensors ] && [ -f out_reward/adapter_model.safetensors ] || fail "LoRA reward model files"
# shellcheck disable=SC2086
"$fabrica" train reward.yaml $short_run finetuning_type=full output_dir=full_reward >full_reward.log 2>&1 \
  || { cat full_reward.log; fail "full reward model"; }
[ -f full_reward/value_head.safetensors ] && [ -f full_reward/model.safetensors ] || fail "full reward model files"
"$fabrica" score --model full_reward --dataset dpo_en_demo --dataset-dir "$data" --template qwen3_nothink \
  --max-samples 3 --cutoff-len 96 >score.out 2>&1 || { cat score.out; fail "fabrica score"; }
[ "$(grep -c '"chosen"' score.out)" = 3 ] && grep -q '"accuracy"' score.out || { cat score.out; fail "score output"; }
echo "ok: LLaMA-Factory's LoRA dpo, kto and reward examples; ln 2 at DPO's first step (the adapters-off reference); fabrica score"

for name in dpo kto reward; do
  common="$every_run bf16=false cutoff_len=64 learning_rate=1.0e-3 max_samples=16 max_steps=4"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 "$fabrica" train $name.yaml $common output_dir=one_$name per_device_train_batch_size=4 \
    >one_$name.log 2>&1 || { cat one_$name.log; fail "$name, one process"; }
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 "$fabrica" train $name.yaml $common output_dir=dp_$name per_device_train_batch_size=2 \
    nproc_per_node=2 >dp_$name.log 2>&1 || { cat dp_$name.log; fail "$name, 2 ranks"; }
  same_losses one_$name dp_$name
  # Context parallel: each row's tokens split over the 2 ranks, the rows' log-probabilities (rm: the
  # score at the last token, on the rank holding it) summed over them (the LoRA examples: the
  # adapters-off reference runs sharded too).
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 "$fabrica" train $name.yaml $common output_dir=cp_$name per_device_train_batch_size=4 \
    nproc_per_node=2 context_parallel_size=2 >cp_$name.log 2>&1 || { cat cp_$name.log; fail "$name, cp 2"; }
  same_losses one_$name cp_$name
done
# Full DPO under context parallel: the reference log-probabilities precomputed sharded too.
full="$every_run bf16=false cutoff_len=64 learning_rate=1.0e-4 max_samples=16 max_steps=3 finetuning_type=full"
for run in "one_full" "cp_full nproc_per_node=2 context_parallel_size=2"; do
  set -- $run
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 "$fabrica" train dpo.yaml $full output_dir=$1 per_device_train_batch_size=4 ${2:-} ${3:-} \
    >$1.log 2>&1 || { cat $1.log; fail "full dpo $1"; }
done
same_losses one_full cp_full
echo "ok: dpo, kto and rm on 2 data-parallel ranks and on 2 context-parallel ranks (dpo: LoRA and full) = one process"

# A reward model resumed from a checkpoint continues bit for bit (its value head is restored).
rm_common="$every_run per_device_train_batch_size=2 bf16=false cutoff_len=64 learning_rate=1.0e-3 max_samples=16 \
max_steps=4 save_steps=2"
# shellcheck disable=SC2086
"$fabrica" train reward.yaml $rm_common output_dir=rm_full >rm_full.log 2>&1 || { cat rm_full.log; fail "rm run"; }
cp -r rm_full rm_resumed
# shellcheck disable=SC2086
"$fabrica" train reward.yaml $rm_common output_dir=rm_resumed resume_from_checkpoint=rm_resumed/checkpoint-2 \
  >rm_resumed.log 2>&1 || { cat rm_resumed.log; fail "rm resume"; }
python3 - <<'PY' || fail "resumed reward model"
import json
full, resumed = ([json.loads(l)["loss"] for l in open(f"{d}/metrics.jsonl")] for d in ("rm_full", "rm_resumed"))
assert full == resumed and len(full) == 4, (full, resumed)
PY
echo "ok: a resumed reward model reproduces the uninterrupted run exactly"

# Bad data: one clear error naming the file and the field, exit code 2.
mkdir bad
cat > bad/dataset_info.json <<'JSON'
{"no_rejected": {"file_name": "no_rejected.json", "ranking": true,
                 "columns": {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected"}},
 "no_tag": {"file_name": "no_tag.json", "formatting": "sharegpt",
            "columns": {"messages": "messages", "kto_tag": "label"},
            "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}
JSON
echo '[{"instruction": "Hi", "chosen": "Hello"}]' > bad/no_rejected.json
echo '[{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], "label": true},
       {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Go"}]}]' > bad/no_tag.json
expect_error() {  # expect_error LOG WORD... : exit code 2 and every word in the error
  local log=$1 rc=0
  shift
  "$@" >"$log" 2>&1 || rc=$?
  [ "$rc" = 2 ] || { cat "$log"; fail "expected exit code 2, got $rc"; }
}
expect_error bad_dpo.log "$fabrica" train dpo.yaml dataset=no_rejected dataset_dir=bad output_dir=bad_dpo $short_run
grep -q "no_rejected.json: record 0: field 'rejected'" bad_dpo.log || { cat bad_dpo.log; fail "ranking error text"; }
expect_error bad_kto.log "$fabrica" train kto.yaml dataset=no_tag dataset_dir=bad output_dir=bad_kto $short_run
grep -q "no_tag.json: record 1: field 'label'" bad_kto.log || { cat bad_kto.log; fail "kto error text"; }
echo "ok: a ranking record without rejected and a KTO record without its tag name the file and field"

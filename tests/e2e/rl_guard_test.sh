#!/usr/bin/env bash
# Stages grpo and ppo on hostile input: each case ends in one clear message and exit 2 with nothing
# written (or a warning), or works as documented.
#  - a reward command that never exits (ignoring SIGTERM, with a child): killed with its process
#    group after reward_timeout, the run stops naming it; a stop signal ends it at once; a SIGKILL
#    of the run leaves no scorer behind
#  - max_new_tokens past the model's context (1e9, 2^31-1, or with the longest prompt): refused at
#    the start, as `fabrica generate` refuses it
#  - prompts longer than cutoff_len: refused, counted; truncation: left keeps their end (the
#    question and the assistant header), what the reward command sees
#  - reward: model: with another tokenizer (llama3's; a 320-token one): refused at the start naming
#    both folders
#  - a LoRA reward model (stage rm, finetuning_type lora): exported merged with its value head
#    (W + scaling B A, checked with torch), scored by `fabrica score` as an adapter and exported
#    alike, and usable as reward: model:
#  - rewards of ±1e308, greedy grpo, grpo with one generation: refused; critic_warmup past the
#    run: a warning
#  - a non-finite loss or gradient norm in grpo and ppo: the message names the step and the rank;
#    nan_policy skip skips and counts such steps, as in the other stages
# Usage: rl_guard_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
reference=$(realpath "$(dirname "$0")/../reference")  # safetensors_io.py
e2e_begin "$@"
e2e_workdir
data="$shared/data/llamafactory"
tiny_model model
rl_task 6
cat > run.yaml <<YAML
model_name_or_path: model
stage: grpo
dataset: prompts.jsonl
template: qwen3_nothink
reward: exact_match
num_generations: 2
per_device_train_batch_size: 2
temperature: 1.0
max_new_tokens: 4
learning_rate: 1.0e-3
max_steps: 1
save_steps: 0
seed: 3
output_dir: out
YAML

# refused NAME MESSAGE [key=value ...]: the run exits 2 within a minute printing MESSAGE, and
# output_dir NAME is not there afterwards.
refused() {
  local name=$1 message=$2 rc=0
  shift 2
  timeout -s KILL 60 "$fabrica" train run.yaml output_dir="$name" "$@" >"$name.log" 2>&1 || rc=$?
  [ "$rc" -eq 2 ] && grep -qF -- "$message" "$name.log" || { cat "$name.log"; fail "$name: exit $rc, expected 2 and: $message"; }
  [ ! -e "$name" ] || { ls -la "$name"; fail "$name: output_dir written"; }
  echo "ok: $name refused: $(grep -F -- "$message" "$name.log" | head -c 220)"
}

# no_process PATTERN: nothing runs whose command line matches PATTERN (within two seconds).
no_process() {
  for _ in $(seq 20); do pgrep -f "$1" >/dev/null || return 0; sleep 0.1; done
  pgrep -af "$1"
  fail "left running: $1"
}

# --- 2: a reward command that never exits ---------------------------------------------------------
cat > hang.sh <<'SH'
trap '' TERM
sleep 1000.1 &
sleep 1000.1
SH
rc=0
start=$(date +%s)
timeout -s KILL 60 "$fabrica" train run.yaml output_dir=hang "reward=command:sh $work/hang.sh" reward_timeout=2 \
  >hang.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -qF "reward command:sh $work/hang.sh: no answer within reward_timeout 2 s for 4 responses: its process group was killed" hang.log \
  || { cat hang.log; fail "a hanging reward command: exit $rc"; }
[ $(($(date +%s) - start)) -lt 30 ] || fail "reward_timeout 2 took $(($(date +%s) - start)) s"
no_process "[s]leep 1000.1"
[ ! -e hang/model.safetensors ] || fail "a model was saved after the reward command timed out"
echo "ok: reward_timeout: $(grep -F 'no answer' hang.log | head -c 160)"

# A stop signal while the command runs: its group is killed and the run stops at once, naming it.
"$fabrica" train run.yaml output_dir=stopped "reward=command:sh $work/hang.sh" >stopped.log 2>&1 &
pid=$!
for _ in $(seq 300); do pgrep -f "[s]leep 1000.1" >/dev/null && break; sleep 0.1; done
kill -TERM $pid
rc=0
wait $pid || rc=$?
[ "$rc" -eq 2 ] && grep -qF "reward command:sh $work/hang.sh: stop signal 15 arrived while it was scoring" stopped.log \
  || { cat stopped.log; fail "SIGTERM during a reward command: exit $rc"; }
no_process "[s]leep 1000.1"
echo "ok: SIGTERM while the reward command runs: its process group killed, exit 2"

# SIGKILL of the run: the guardian kills the command's group.
"$fabrica" train run.yaml output_dir=killed "reward=command:sh $work/hang.sh" >killed.log 2>&1 &
pid=$!
for _ in $(seq 300); do pgrep -f "[s]leep 1000.1" >/dev/null && break; sleep 0.1; done
pgrep -f "[s]leep 1000.1" >/dev/null || { cat killed.log; fail "the reward command never started"; }
kill -KILL $pid
{ wait $pid; } 2>/dev/null || true
no_process "[s]leep 1000.1"
echo "ok: SIGKILL of the run: no scorer left behind"

# --- 3: max_new_tokens past the context ---------------------------------------------------------
refused huge_new_tokens "max_new_tokens 1000000000: a prompt and up to max_new_tokens more do not fit the model's max_position_embeddings 256; expected max_new_tokens at most 255" max_new_tokens=1000000000
refused int_max_new_tokens "max_new_tokens 2147483647: a prompt and up to max_new_tokens more do not fit" max_new_tokens=2147483647
refused long_new_tokens "max_new_tokens 250: the longest prompt's 17 tokens and up to max_new_tokens more do not fit the model's max_position_embeddings 256; expected max_new_tokens at most 239" max_new_tokens=250
refused huge_new_tokens_ppo "max_new_tokens 1000000000: a prompt and up to max_new_tokens more do not fit" stage=ppo num_generations=1 max_new_tokens=1000000000

# --- 4: prompts longer than cutoff_len ----------------------------------------------------------
/usr/bin/python3 - <<'PY'
import json
with open("long.jsonl", "w") as f:
    f.write(json.dumps({"prompt": "What is 3+4?", "answer": "7"}) + "\n")
    f.write(json.dumps({"prompt": "Background: " + "blah " * 60 + "Question: what is 10+22?", "answer": "32"}) + "\n")
    f.write(json.dumps({"prompt": "Background: " + "blah " * 30 + "Question: what is 1+1?", "answer": "2"}) + "\n")
PY
cat > seen.py <<'PY'
import json, sys
with open(sys.argv[1], "a") as out:
    for line in sys.stdin:
        out.write(json.dumps(json.loads(line)["prompt"]) + "\n")
        print(0)
PY
refused long_prompts "stage grpo: 2 of 3 prompts are longer than cutoff_len 32 tokens (template included; the longest (long.jsonl: record 1) has 81)" dataset=long.jsonl cutoff_len=32
"$fabrica" train run.yaml output_dir=left dataset=long.jsonl cutoff_len=32 truncation=left max_steps=2 \
  per_device_train_batch_size=3 "reward=command:/usr/bin/python3 $work/seen.py $work/seen.txt" >left.log 2>&1 \
  || { cat left.log; fail "truncation: left"; }
grep -q "data: 3 train samples, 0 eval samples, [0-9]* tokens; 2 truncated" left.log || { cat left.log; fail "no count of cut prompts"; }
/usr/bin/python3 - <<'PY' || fail "the prompts the rewards saw"
import json
seen = {json.loads(l) for l in open("seen.txt")}
assert len(seen) == 3, seen
for p in seen:
    assert p.endswith("assistant\n"), repr(p)  # the assistant header survives the cut
assert any("Question: what is 10+22?" in p for p in seen), seen  # and the question's end with it
assert any(p.startswith("system") or p.startswith("user") for p in seen), seen  # the short one is whole
print("ok: truncation: left keeps each prompt's end:", sorted(seen, key=len)[-1][-60:].replace("\n", "|"))
PY

# --- 5 and 6: reward models -----------------------------------------------------------------------
# A base with weights (one sft step), a full and a LoRA reward model on it (LLaMA-Factory's reward example).
cat > sft.yaml <<YAML
$(sft_config)
cutoff_len: 64
max_samples: 8
max_steps: 1
output_dir: base
YAML
"$fabrica" train sft.yaml >sft.log 2>&1 || { cat sft.log; fail "sft base"; }
sed -e "s|^model_name_or_path:.*|model_name_or_path: base|" -e "s|^output_dir:.*|output_dir: rm_lora|" \
  "$data/examples/train_lora_qwen3_lora_reward.yaml" > reward.yaml
echo "dataset_dir: $data" >> reward.yaml
rm_run="max_steps=2 max_samples=8 cutoff_len=64 per_device_train_batch_size=2 gradient_accumulation_steps=1 bf16=false"
# shellcheck disable=SC2086
"$fabrica" train reward.yaml $rm_run >rm_lora.log 2>&1 || { cat rm_lora.log; fail "LoRA reward model"; }
# shellcheck disable=SC2086
"$fabrica" train reward.yaml $rm_run finetuning_type=full output_dir=rm_full >rm_full.log 2>&1 \
  || { cat rm_full.log; fail "full reward model"; }

# 5: another tokenizer (llama3's), and a reward model of a 320-token vocabulary with its own tokenizer.
cp -r rm_full rm_llama
cp "$shared/data/tokenizers/llama3/tokenizer.json" "$shared/data/tokenizers/llama3/tokenizer_config.json" rm_llama/
refused other_tokenizer "reward model:rm_llama: its tokenizer (rm_llama/tokenizer.json, 128256 tokens) is not the policy's (model_name_or_path base, 151669 tokens): token id" model_name_or_path=base reward=model:rm_llama
head -c 100000 "$data/alpaca_en_demo.json" > corpus.txt
"$fabrica" tokenizer train --input corpus.txt --vocab-size 320 --output small \
  --special-tokens "<|im_start|>,<|im_end|>,<|endoftext|>" >tok.log 2>&1 || { cat tok.log; fail "tokenizer train"; }
sed 's/"vocab_size": 151669/"vocab_size": 320/' model/config.json > small/config.json
# shellcheck disable=SC2086
"$fabrica" train reward.yaml $rm_run model_name_or_path=small finetuning_type=full output_dir=rm_small \
  >rm_small.log 2>&1 || { cat rm_small.log; fail "320-token reward model"; }
refused small_vocab "reward model:rm_small: its tokenizer (rm_small/tokenizer.json, 320 tokens) is not the policy's (model_name_or_path base, 151669 tokens)" model_name_or_path=base reward=model:rm_small

# 6: the LoRA reward model: its adapter holds the LoRA tensors only, the value head beside it.
[ -f rm_lora/value_head.safetensors ] || fail "no value_head.safetensors beside the LoRA adapter"
"$fabrica" export --checkpoint rm_lora --output rm_merged >export.log 2>&1 || { cat export.log; fail "export of a LoRA reward model"; }
[ -f rm_merged/value_head.safetensors ] && [ -f rm_merged/model.safetensors ] || fail "the export has no value head"
/usr/bin/python3 - "$reference" <<'PY' || fail "merged weights"
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
from safetensors_io import load_file
adapter = load_file("rm_lora/adapter_model.safetensors")[0]
assert not any("v_head" in k for k in adapter), sorted(adapter)
config = json.load(open("rm_lora/adapter_config.json"))
scaling = config["lora_alpha"] / config["r"]
base, merged = load_file("base/model.safetensors")[0], load_file("rm_merged/model.safetensors")[0]
assert sorted(base) == sorted(merged), (sorted(base), sorted(merged))
worst, lora = 0.0, 0
for name, w in base.items():
    a = "base_model.model." + name[: -len(".weight")] + ".lora_A.weight"
    expected = w
    if a in adapter:
        lora += 1
        expected = w + scaling * adapter[a.replace("lora_A", "lora_B")] @ adapter[a]
    worst = max(worst, float((merged[name] - expected).abs().max()))
assert lora == 14 and worst < 1e-6, (lora, worst)
head, exported = load_file("rm_lora/value_head.safetensors")[0], load_file("rm_merged/value_head.safetensors")[0]
assert all(torch.equal(head[k], exported[k]) for k in head) and len(head) == 2, sorted(exported)
print(f"ok: export merged {lora} LoRA projections as W + {scaling} B A (worst {worst:.1e}) and kept the value head")
PY
score="--dataset dpo_en_demo --dataset-dir $data --template qwen3_nothink --max-samples 4 --cutoff-len 64"
# shellcheck disable=SC2086
"$fabrica" score --model rm_lora $score >score_lora.txt 2>&1 || { cat score_lora.txt; fail "score of a LoRA reward model"; }
# shellcheck disable=SC2086
"$fabrica" score --model rm_merged $score >score_merged.txt 2>&1 || { cat score_merged.txt; fail "score of its export"; }
cmp score_lora.txt score_merged.txt || { paste score_lora.txt score_merged.txt; fail "the adapter and its export score differently"; }
grep -q '"pairs": 4' score_lora.txt || { cat score_lora.txt; fail "no scores"; }
echo "ok: fabrica score reads the LoRA reward model and its export alike: $(head -1 score_lora.txt)"
# An adapter whose base has no weights (config.json only) would score with random weights: refused.
cp -r rm_lora rm_scratch
sed -i 's|"base_model_name_or_path": "base"|"base_model_name_or_path": "model"|' rm_scratch/adapter_config.json
rc=0
# shellcheck disable=SC2086
"$fabrica" score --model rm_scratch $score >scratch.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -qF 'rm_scratch: a LoRA reward model on base_model_name_or_path "model", which has no weights' scratch.log \
  || { cat scratch.log; fail "a LoRA reward model without base weights: exit $rc"; }
for rm in rm_lora rm_merged; do
  "$fabrica" train run.yaml output_dir=with_$rm model_name_or_path=base reward=model:$rm >with_$rm.log 2>&1 \
    || { cat with_$rm.log; fail "reward: model:$rm"; }
done
/usr/bin/python3 -c "
import json
a, b = (json.loads(open(f'with_{d}/metrics.jsonl').readline()) for d in ('rm_lora', 'rm_merged'))
assert a['reward_mean'] == b['reward_mean'] and a['reward_max'] != a['reward_min'], (a, b)
print('ok: reward: model: a LoRA reward model and its export give the same rewards, reward_mean', a['reward_mean'])
" || fail "reward model metrics"

# --- 7: settings and rewards that leave nothing to learn ------------------------------------------
echo 'import sys
for i, _ in enumerate(sys.stdin): print(-1e308 if i % 2 else 1e308)' > huge.py
rc=0
"$fabrica" train run.yaml output_dir=huge "reward=command:/usr/bin/python3 $work/huge.py" >huge.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -qF "stage grpo: step 1: reward command:/usr/bin/python3 $work/huge.py: response 1 of 4 scored 1e+308; expected a finite number within +-1e+15" huge.log \
  || { cat huge.log; fail "rewards of 1e308: exit $rc"; }
echo "ok: rewards of +-1e308 stop the run at step 1"
refused greedy "stage grpo with temperature 0 and num_generations 2: greedy decoding gives every response of a group the same text" temperature=0
refused one_generation "stage grpo with num_generations 1: each prompt's group holds one response" num_generations=1
"$fabrica" train run.yaml output_dir=warmup stage=ppo num_generations=1 critic_warmup=5 max_steps=2 >warmup.log 2>&1 \
  || { cat warmup.log; fail "ppo with critic_warmup past the run"; }
grep -q "warning: critic_warmup 5 is past the run's 2 steps: the actor never updates, only the critic trains" warmup.log \
  || { cat warmup.log; fail "no warning for critic_warmup past the run"; }
echo "ok: critic_warmup past max_steps: a warning"

# --- 8: non-finite losses and gradient norms name the step and the rank ---------------------------
# Four passes (the old default), so that step 1's later updates meet the first one's blown-up weights.
# learning_rate 1e15: weights of ~1e15 overflow the forward to a NaN loss (at 1e6 the forward stays
# finite, as PyTorch's does, since the attention kernel no longer overflows on huge scores; 1e30
# overflows the backward first: the gradient-norm case).
blow_up=("reward=command:/usr/bin/python3 $work/score.py" max_steps=2 ppo_epochs=4)
for stage in grpo ppo; do
  rc=0
  # shellcheck disable=SC2046
  "$fabrica" train run.yaml output_dir=nan_$stage stage=$stage num_generations=2 "${blow_up[@]}" learning_rate=1e15 \
    $([ $stage = ppo ] && echo critic_learning_rate=1e-3) >nan_$stage.log 2>&1 || rc=$?
  [ "$rc" -eq 2 ] && grep -qF "stage $stage: step 1: the loss is not finite on rank 0: stopping, saving nothing new (nan_policy: stop); no checkpoint was saved before it" nan_$stage.log \
    || { cat nan_$stage.log; fail "$stage: non-finite loss: exit $rc"; }
  rc=0
  # shellcheck disable=SC2046
  "$fabrica" train run.yaml output_dir=inf_$stage stage=$stage num_generations=2 "${blow_up[@]}" learning_rate=1e30 \
    $([ $stage = ppo ] && echo critic_learning_rate=1e-3) >inf_$stage.log 2>&1 || rc=$?
  [ "$rc" -eq 2 ] && grep -qF "stage $stage: step 1: the gradient norm (of the gradients summed over every rank) is NaN: stopping" inf_$stage.log \
    || { cat inf_$stage.log; fail "$stage: non-finite gradient norm: exit $rc"; }
done
rc=0
# The critic blown up: its forward stays finite (RMSNorm turns the overflowing stream into 0, as
# PyTorch's does), so its gradient norm is what turns non-finite; the message names the critic.
"$fabrica" train run.yaml output_dir=nan_critic stage=ppo num_generations=2 "${blow_up[@]}" learning_rate=1e-3 \
  critic_learning_rate=1e15 >nan_critic.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -qF "stage ppo: step 1: the critic's gradient norm (of the gradients summed over every rank) is infinite: stopping" nan_critic.log \
  || { cat nan_critic.log; fail "ppo: non-finite critic gradient norm: exit $rc"; }
rc=0
"$fabrica" train run.yaml output_dir=nan_dp nproc_per_node=2 "${blow_up[@]}" learning_rate=1e15 >nan_dp.log 2>&1 || rc=$?
grep -qF "stage grpo: step 1: the loss is not finite on rank 0, 1: stopping" nan_dp.log || { cat nan_dp.log; fail "2 ranks: exit $rc"; }
echo "ok: non-finite loss and gradient norm in grpo and ppo name the step and the ranks"
# nan_policy skip holds for the rollout stages too: the non-finite updates of step 1 are skipped
# and the step counted; the second skipped step is more than max_skipped_steps 1 and stops the run.
for stage in grpo ppo; do
  rc=0
  # shellcheck disable=SC2046
  "$fabrica" train run.yaml output_dir=skip_$stage stage=$stage num_generations=2 "${blow_up[@]}" \
    learning_rate=1e15 nan_policy=skip max_skipped_steps=1 logging_steps=1 \
    $([ $stage = ppo ] && echo critic_learning_rate=1e-3) >skip_$stage.log 2>&1 || rc=$?
  [ "$rc" -eq 2 ] && grep -qF "stage $stage: step 1: the loss is not finite on rank 0: optimizer step skipped (nan_policy: skip, 1 of at most 1)" skip_$stage.log \
    && grep -qF "stage $stage: step 2: the loss is not finite on rank 0: 2 optimizer steps skipped, more than max_skipped_steps 1: stopping" skip_$stage.log \
    || { cat skip_$stage.log; fail "$stage: nan_policy skip: exit $rc"; }
  python3 - skip_$stage/metrics.jsonl <<'PY' || fail "$stage: nan_policy skip: metrics.jsonl"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == [1], rows
assert rows[0]["skipped_steps"] == 1 and rows[0]["loss"] is None, rows[0]
PY
done
echo "ok: nan_policy skip in grpo and ppo: step 1 skipped and counted, stopped at step 2"

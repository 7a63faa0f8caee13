# Sourced by the end-to-end scripts (after `set -euo pipefail`): their shared setup.

# e2e_begin FABRICA_BINARY SHARED_DIR: sets $fabrica and $shared (absolute paths); without the
# shared tokenizers the whole script is skipped, saying why, with exit code 77 (CTest's
# SKIP_RETURN_CODE: the summary counts it as skipped, not passed).
e2e_begin() {
  fabrica=$(realpath "$1")
  shared=$(realpath "$2" 2>/dev/null || echo "$2")
  if [ ! -f "$shared/data/tokenizers/qwen3/tokenizer.json" ]; then
    echo "SKIP: $shared/data not found"
    exit 77
  fi
}

fail() { echo "FAIL: $*"; exit 1; }

# How long a script waits for something that must happen (a step logged, a checkpoint written, a
# process gone): a wait ends as soon as it happens, so a generous limit costs a fast machine
# nothing and keeps a loaded one (the suite beside other jobs on 2 cores) from failing.
e2e_patience=${FAB_E2E_PATIENCE:-600}

# wait_until COMMAND [ARGS...]: runs COMMAND every 20 ms until it succeeds; false (1) once
# $e2e_patience seconds have passed without.
wait_until() {
  local deadline=$((SECONDS + e2e_patience))
  until "$@"; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.02
  done
}

# logged FILE PATTERN: FILE has a line matching the grep pattern (false while it does not exist).
logged() { grep -q -- "$2" "$1" 2>/dev/null; }

# hang_timeout SECONDS: the ddp_timeout for a run in which the script freezes a rank on purpose,
# from SECONDS, the measured wall time of a whole run of the same job on this machine. The script
# waits for it to expire, so it should be short; but every wait of a healthy rank at a collective
# (the start, a checkpoint's fsync, a step on a loaded machine) must stay under it. Twice a whole
# run, at least 10 s: no single wait inside a run is longer than the whole run.
hang_timeout() {
  local t=$((2 * $1))
  echo $((t < 10 ? 10 : t))
}

# e2e_workdir: a fresh temporary folder becomes the working directory ($work), with the prepared-data
# cache inside it; on exit, any process still running from it is killed and the folder removed.
e2e_workdir() {
  work=$(mktemp -d)
  trap 'pkill -KILL -f "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
  cd "$work"
  export FABRICA_CACHE="$work/cache"
}

# same_losses REF_DIR DIR: the per-step losses of two runs' metrics.jsonl agree within 1e-5 relative.
same_losses() {
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'PY' || fail "losses of $2 differ from $1"
import json, sys
ref, got = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
assert len(ref) == len(got), (len(ref), len(got))
worst = max(abs(a - b) / abs(a) for a, b in zip(ref, got))
print(f"  {sys.argv[2]}: {len(got)} steps, worst relative difference {worst:.1e}")
assert worst < 1e-5
PY
}

# tiny_model DIR: a config-only model folder (a tiny Qwen3 trained from scratch) with the real
# Qwen3 tokenizer.
tiny_model() {
  mkdir -p "$1"
  cp "$shared/data/tokenizers/qwen3/tokenizer.json" "$shared/data/tokenizers/qwen3/tokenizer_config.json" "$1/"
  cat > "$1/config.json" <<'JSON'
{"model_type": "qwen3", "vocab_size": 151669, "hidden_size": 32, "intermediate_size": 64,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
 "max_position_embeddings": 256, "tie_word_embeddings": true, "rope_theta": 1000000}
JSON
}

# tiny_vlm_model DIR: the tiny qwen2_vl of tests/reference/vlm/qwen2_vl_scratch (config.json only,
# trained from scratch) with the real Qwen tokenizer, whose vision tokens are Qwen2-VL's, and
# Qwen2-VL's preprocessor_config.json.
tiny_vlm_model() {
  local repo
  repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  mkdir -p "$1"
  cp "$shared/data/tokenizers/qwen3/tokenizer.json" "$shared/data/tokenizers/qwen3/tokenizer_config.json" "$1/"
  cp "$repo/tests/reference/image/preprocessor_config.json" "$repo/tests/reference/vlm/qwen2_vl_scratch/config.json" "$1/"
}

# sft_config: the keys every script's run.yaml shares (sft of the tiny model on LLaMA-Factory's
# identity and alpaca_en_demo samples); each script appends its own.
sft_config() {
  cat <<YAML
model_name_or_path: model
stage: sft
dataset: identity,alpaca_en_demo
dataset_dir: $shared/data/llamafactory
template: qwen3_nothink
per_device_train_batch_size: 4
gradient_accumulation_steps: 2
learning_rate: 5.0e-3
lr_scheduler_type: cosine
logging_steps: 1
YAML
}

# mllm_config: the keys the image scripts' run.yaml share (sft of the folder model/ on
# LLaMA-Factory's mllm_demo under the qwen2_vl template, into out); each script appends its own.
mllm_config() {
  cat <<YAML
model_name_or_path: model
stage: sft
dataset: mllm_demo
dataset_dir: $shared/data/llamafactory
template: qwen2_vl
cutoff_len: 2048
output_dir: out
YAML
}

# grpo_config: the keys of a short GRPO run on the tiny model and rl_task's prompts and reward
# (2 steps of 2 prompts x 4 samples of at most 8 tokens); each script appends its own.
grpo_config() {
  cat <<YAML
model_name_or_path: model
stage: grpo
dataset: prompts.jsonl
template: qwen3_nothink
reward: command:/usr/bin/python3 $work/score.py
num_generations: 4
per_device_train_batch_size: 2
temperature: 1.0
max_new_tokens: 8
learning_rate: 1.0e-2
max_steps: 2
logging_steps: 1
save_steps: 0
YAML
}

# rl_task N: prompts.jsonl, the first N of a fixed list of "What is a+b?" prompts with their
# answers, and score.py, a command reward (JSON lines in, one score per line out): a response's
# length modulo 3, so the scores within a group differ.
rl_task() {
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
pairs = [(3, 4), (10, 22), (7, 8), (41, 1), (5, 5), (60, 9), (2, 2), (13, 8)]
with open("prompts.jsonl", "w") as f:
    for a, b in pairs[:int(sys.argv[1])]:
        f.write(json.dumps({"prompt": f"What is {a}+{b}?", "answer": str(a + b)}) + "\n")
PY
  cat > score.py <<'PY'
import json, sys
for line in sys.stdin:
    print(len(json.loads(line)["response"]) % 3)
PY
}

# rl_three_runs STAGE: run.yaml trained into out, again into again (the same seed), and resumed
# into resumed from out's checkpoint-2; each run's log in NAME.log.
rl_three_runs() {
  "$fabrica" train run.yaml >train.log 2>&1 || { cat train.log; fail "$1 run"; }
  "$fabrica" train run.yaml output_dir=again >again.log 2>&1 || { cat again.log; fail "second $1 run"; }
  mkdir resumed && cp -r out/checkpoint-2 resumed/
  "$fabrica" train run.yaml output_dir=resumed resume_from_checkpoint=true >resume.log 2>&1 \
    || { cat resume.log; fail "resumed $1 run"; }
}

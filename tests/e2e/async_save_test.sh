#!/usr/bin/env bash
# async_save: checkpoints written by a background thread while training goes on.
# 1. One process, a checkpoint every 5 steps: the async run's losses and checkpoint files equal a
#    synchronous run's byte for byte, and no checkpoint-N.tmp is left behind.
# 2. The write made slow (FAB_TEST_SLOW_SAVE_MS, a test-only pause inside the writer) and the
#    process killed with SIGKILL while checkpoint-10 is being written: checkpoint-5 is intact (the
#    same bytes as the synchronous run's), checkpoint-10 does not exist (only its .tmp), and
#    resume_from_checkpoint: true takes checkpoint-5 and ends with the uninterrupted run's losses.
# 3. Two processes (ZeRO-1: each rank writes its own optimizer shard): async equals sync, files
#    and losses, and a resume from the async run's checkpoint-10 continues exactly.
# Usage: async_save_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$@"
e2e_workdir

tiny_model model
{ sft_config; cat <<YAML; } > run.yaml
cutoff_len: 64
max_samples: 48
max_steps: 24
save_steps: 5
threads: 1
YAML
"$fabrica" data prepare run.yaml >/dev/null

losses() { python3 -c 'import json,sys; [print(j["step"], j["loss"]) for j in map(json.loads, open(sys.argv[1])) if j["step"] > int(sys.argv[2])]' "$1" "${2:-0}"; }

# same_checkpoint A B: every file of checkpoint folder A has B's bytes, and no file is missing.
same_checkpoint() {
  diff <(cd "$1" && find . -type f | sort) <(cd "$2" && find . -type f | sort) || fail "$1 and $2 hold other files"
  for f in $(cd "$1" && find . -type f); do
    [[ "$f" == ./train_config.yaml ]] && continue  # names its own output_dir
    cmp -s "$1/$f" "$2/$f" || fail "$1/$f differs from $2/$f"
  done
}

train() { local out=$1; shift; "$fabrica" train run.yaml output_dir="$out" "$@" >"$out.log" 2>&1 || { tail -20 "$out.log"; fail "$out"; }; }

train sync
train async async_save=true
diff <(losses sync/metrics.jsonl) <(losses async/metrics.jsonl) || fail "async_save: losses differ from the synchronous run"
for step in 5 10 15 20; do same_checkpoint sync/checkpoint-$step async/checkpoint-$step; done
! ls -d async/*.tmp 2>/dev/null || fail "async_save left a temporary folder"
echo "ok: async_save: losses and checkpoints 5-20 equal the synchronous run's byte for byte"

# Killed while checkpoint-10 is being written (after checkpoint-5 is complete).
FAB_TEST_SLOW_SAVE_MS=3000 "$fabrica" train run.yaml output_dir=killed async_save=true >killed.log 2>&1 &
pid=$!
mid_write() { [ -d killed/checkpoint-5 ] && [ -d killed/checkpoint-10.tmp ]; }
wait_until mid_write || true
[ -d killed/checkpoint-10.tmp ] || { cat killed.log; fail "checkpoint-10 never started"; }
kill -KILL $pid
wait $pid || true
[ ! -e killed/checkpoint-10 ] || fail "a checkpoint-10 exists after a kill mid-write"
same_checkpoint sync/checkpoint-5 killed/checkpoint-5
echo "ok: SIGKILL mid-write: checkpoint-5 intact, checkpoint-10 only a .tmp folder"
train killed async_save=true resume_from_checkpoint=true
grep -q "resumed from killed/checkpoint-5 at step 5" killed.log || { cat killed.log; fail "did not resume from checkpoint-5"; }
diff <(losses sync/metrics.jsonl) <(losses killed/metrics.jsonl) || fail "after the kill: losses differ from the uninterrupted run"
! ls -d killed/*.tmp 2>/dev/null || fail "the resumed run left a temporary folder"
echo "ok: resume ignored the partial checkpoint-10 and matched the uninterrupted run bit for bit"

# Two processes, each writing its own optimizer shard.
train dp_sync nproc_per_node=2 zero_stage=1 per_device_train_batch_size=2
train dp_async nproc_per_node=2 zero_stage=1 per_device_train_batch_size=2 async_save=true
diff <(losses dp_sync/metrics.jsonl) <(losses dp_async/metrics.jsonl) || fail "2 processes: async losses differ from sync"
for step in 5 10 15 20; do same_checkpoint dp_sync/checkpoint-$step dp_async/checkpoint-$step; done
train dp_resumed nproc_per_node=2 zero_stage=1 per_device_train_batch_size=2 async_save=true \
  resume_from_checkpoint=dp_async/checkpoint-10
diff <(losses dp_sync/metrics.jsonl 10) <(losses dp_resumed/metrics.jsonl) || fail "2 processes: the resume differs"
echo "ok: 2 processes: async checkpoints equal sync ones, and resume from one continues exactly"
echo "async_save: all checks passed"

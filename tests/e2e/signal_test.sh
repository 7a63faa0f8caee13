#!/usr/bin/env bash
# Stop signals at random moments of a step, many times: SIGINT and SIGTERM to one process, and
# SIGINT to the launcher of 2 workers (which forwards SIGUSR1 through mpirun). After the first
# signal the same one keeps coming every few ms until the process exits, so signals land all
# over the rest of the step and the save. Every run must finish its step, save a checkpoint,
# say "stopped by signal" and exit 0: no crash, no heap corruption, no hang.
# The runs cap oneDNN at AVX2 (what an AVX2-only host runs anyway): a signal handler running on
# a thread inside oneDNN 2.6's AVX2 f32 GEMM corrupted the heap, which this test caught (a
# segfault or glibc's "corrupted size vs. prev_size") before the stop signals moved to a watcher
# thread (src/core/stop_signals.h).
# Usage: signal_test.sh FABRICA_BINARY SHARED_DIR [RUNS_PER_SIGNAL]
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$@"
runs=${3:-10}
e2e_workdir
export ONEDNN_MAX_CPU_ISA=AVX2

tiny_model model
{ sft_config; cat <<YAML; } > run.yaml
cutoff_len: 96
max_samples: 64
max_steps: 100000
save_steps: 0
YAML
"$fabrica" data prepare run.yaml >/dev/null  # the runs below start from the token cache

# stop_once SIGNAL LABEL [EXTRA KEYS...]: starts a run, waits for its first step, then sends
# SIGNAL after a random 0-400 ms (anywhere in a step: forward, backward, optimizer, logging) and
# again every 5 ms until the run exits.
stop_once() {
  local signal=$1 label=$2; shift 2
  local out=$work/$label
  "$fabrica" train run.yaml output_dir="$out" "$@" >"$out.log" 2>&1 &
  local pid=$!
  # (a signal before the first step would find no trainer to stop: wait for it, however slow)
  wait_until logged "$out.log" "^step 1/" || { tail -20 "$out.log"; fail "$label: no first step"; }
  sleep "0.$(printf '%03d' $((RANDOM % 400)))"
  local deadline=$((SECONDS + e2e_patience))
  while kill -"$signal" $pid 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || fail "$label: still running $e2e_patience s after SIG$signal"
    sleep 0.005
  done
  local rc=0
  wait $pid || rc=$?
  [ "$rc" -eq 0 ] || { tail -20 "$out.log"; fail "$label: SIG$signal: exit $rc"; }
  grep -q "stopped by signal" "$out.log" || { tail -20 "$out.log"; fail "$label: no stop message"; }
  local checkpoint
  checkpoint=$(ls -d "$out"/checkpoint-* 2>/dev/null | head -1)
  [ -n "$checkpoint" ] && [ -f "$checkpoint/trainer_state.json" ] || fail "$label: no checkpoint"
  rm -rf "$out"
}

for i in $(seq 1 "$runs"); do stop_once INT "int-$i"; done
echo "ok: $runs runs stopped by SIGINT at random moments"
for i in $(seq 1 "$runs"); do stop_once TERM "term-$i"; done
echo "ok: $runs runs stopped by SIGTERM at random moments"
for i in $(seq 1 $(((runs + 1) / 2))); do
  OMP_NUM_THREADS=1 stop_once INT "launcher-$i" nproc_per_node=2 per_device_train_batch_size=2
done
echo "ok: $(((runs + 1) / 2)) runs of 2 workers stopped through the launcher (SIGUSR1 to each) at random moments"
echo "signals: all checks passed"

#!/usr/bin/env bash
# Distributed training through the `fabrica` command: nproc_per_node starts the workers through
# mpirun; ZeRO-2 at 2 ranks and ZeRO-3 at 4 reproduce one process's losses over 20 fp32 steps;
# every rank logs to output_dir/logs; Ctrl-C saves a checkpoint that resumes on another world size;
# a hung rank (1 or 0) stops the job within ddp_timeout naming it on the console, and a killed
# rank stops it too; killing the launcher (SIGKILL) ends the workers, SIGHUP stops them cleanly;
# far more workers than cores are refused at once. The hung runs' ddp_timeout comes from the
# measured 2-rank run (hang_timeout), so a loaded machine does not time healthy ranks out.
# Usage: distributed_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$@"
e2e_workdir
export OMP_NUM_THREADS=1

tiny_model model
{ sft_config; cat <<YAML; } > run.yaml
cutoff_len: 64
max_samples: 40
warmup_steps: 2
max_steps: 20
save_steps: 0
ddp_bucket_size: 1
YAML

# Far more workers than cores (nproc_per_node 1000 on 2 cores started 1000 and hung): refused at
# once, with the numbers, before anything is written.
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # (nproc obeys OMP_NUM_THREADS=1 above)
crowd=$((cores * 8 + 1))
rc=0; timeout 120 "$fabrica" train run.yaml output_dir=crowd nproc_per_node=$crowd >crowd.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { cat crowd.log; fail "nproc_per_node $crowd: exit $rc, expected 2"; }
grep -q "nproc_per_node $crowd is more than 8 workers per core of this machine ($cores cores: at most $((crowd - 1)))" \
  crowd.log || { cat crowd.log; fail "nproc_per_node $crowd: the message lacks the numbers"; }
[ ! -e crowd ] || fail "nproc_per_node $crowd: output_dir written"
echo "ok: nproc_per_node $crowd -> $(head -c 120 crowd.log)"

"$fabrica" train run.yaml output_dir=one >one.log 2>&1 || { cat one.log; fail "single process"; }
started=$SECONDS
"$fabrica" train run.yaml output_dir=z2 nproc_per_node=2 per_device_train_batch_size=2 zero_stage=2 >z2.log 2>&1 \
  || { cat z2.log; fail "2 ranks, ZeRO-2"; }
z2_seconds=$((SECONDS - started))
grep -q "launching 2 workers" z2.log || fail "no launcher line"
[ -f z2/logs/rank-0.log ] && [ -f z2/logs/rank-1.log ] || fail "no per-rank logs"
grep -q "step 20/20" z2/logs/rank-0.log || fail "rank 0's log lacks the steps"
same_losses one z2
echo "ok: 2 ranks, ZeRO-2 = one process"
"$fabrica" train run.yaml output_dir=z3 nproc_per_node=4 per_device_train_batch_size=1 zero_stage=3 >z3.log 2>&1 \
  || { cat z3.log; fail "4 ranks, ZeRO-3"; }
same_losses one z3
python3 - z3/metrics.jsonl <<'PY' || fail "ZeRO-3 memory report"
import json, sys
last = [json.loads(l) for l in open(sys.argv[1])][-1]
assert last["world_size"] == 4 and len(last["memory_parameters_bytes"]) == 4, last
PY
echo "ok: 4 ranks, ZeRO-3 = one process"

steps_logged() { [ -s $1/metrics.jsonl ] && [ "$(wc -l <$1/metrics.jsonl)" -ge $2 ]; }  # steps_logged OUTPUT_DIR N

# Ctrl-C reaches the launcher; every worker saves the same step (its ZeRO-1 shard), then it
# resumes on 1 process.
"$fabrica" train run.yaml output_dir=stop nproc_per_node=2 per_device_train_batch_size=2 max_steps=100000 zero_stage=1 \
  lr_scheduler_type=constant >stop.log 2>&1 &
launcher=$!
wait_until steps_logged stop 3 || { cat stop.log; fail "the run did not log 3 steps"; }
kill -INT $launcher
wait $launcher || { cat stop.log; fail "stopped run exited $?"; }
grep -q "stopped by signal" stop.log || { cat stop.log; fail "no stop message"; }
checkpoint=$(ls -d stop/checkpoint-* | head -1)
[ -f "$checkpoint/optimizer-rank-1-of-2.safetensors" ] || fail "no rank-1 optimizer shard in $checkpoint"
step=${checkpoint##*-}
"$fabrica" train run.yaml output_dir=stop max_steps=$((step + 2)) lr_scheduler_type=constant \
  resume_from_checkpoint=true >resume.log 2>&1 || { cat resume.log; fail "resume on 1 process"; }
grep -q "resumed from $checkpoint at step $step" resume.log || fail "did not resume at step $step"
echo "ok: Ctrl-C saved step $step on 2 ranks; resumed on 1 process"

worker_pid() {  # worker_pid OUTPUT_DIR RANK
  for pid in $(pgrep -f "fabrica train run.yaml output_dir=$1 "); do
    tr '\0' '\n' </proc/$pid/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo $pid; return; }
  done
}
# The collective timeout of the runs in which a rank is hung on purpose: from the measured time of
# the 2-rank run above (a fixed 3 s timed out healthy ranks on a loaded machine).
hang_s=$(hang_timeout $z2_seconds)
echo "the 2-rank run took $z2_seconds s: ddp_timeout $hang_s for the hung ranks"
start_long_run() {  # start_long_run OUTPUT_DIR: 2 ranks, that collective timeout, until 3 steps are logged
  "$fabrica" train run.yaml output_dir=$1 nproc_per_node=2 per_device_train_batch_size=2 max_steps=100000 \
    ddp_timeout=$hang_s >$1.log 2>&1 &
  wait_until steps_logged $1 3 || { cat $1.log; fail "$1: the run did not log 3 steps"; }
}

start_long_run hang
pid=$(worker_pid hang 1)
[ -n "$pid" ] || fail "no rank 1 process"
kill -STOP "$pid"
started=$SECONDS
rc=0; wait %% || rc=$?
[ "$rc" -ne 0 ] || fail "a hung rank did not stop the job"
[ $((SECONDS - started)) -le $((hang_s + 60)) ] || fail "the job took $((SECONDS - started)) s to stop (ddp_timeout $hang_s)"
# The stop lands at any moment: before rank 1 joined the collective, or while it was sending.
grep -Eq "rank 1 (never started it|sent no data)" hang.log || { cat hang.log; fail "the message does not name rank 1"; }
echo "ok: hung rank -> $(grep -o "collective '.*" hang.log | head -1)"

# Rank 0 hung: rank 1 notices, and the launcher prints its diagnosis from logs/rank-1.log.
start_long_run hang0
pid=$(worker_pid hang0 0)
[ -n "$pid" ] || fail "no rank 0 process"
kill -STOP "$pid"
rc=0; wait %% || rc=$?
[ "$rc" -ne 0 ] || fail "a hung rank 0 did not stop the job"
grep -Eq "rank 0 (never started it|sent no data).*\(from .*rank-1.log\)" hang0.log \
  || { cat hang0.log; fail "the console does not name rank 0"; }
echo "ok: hung rank 0 -> $(grep -o "collective '.*" hang0.log | head -1)"

# The launcher killed by SIGKILL takes mpirun and the workers with it.
job_pids() {  # job_pids LAUNCHER_PID: its mpirun and mpirun's workers
  local mpirun_pid
  mpirun_pid=$(pgrep -P "$1")
  echo $mpirun_pid $(pgrep -P "$mpirun_pid")
}
still_running() {  # still_running PID...: those that exist and are not zombies
  for p in "$@"; do
    if [ -d /proc/$p ] && ! grep -q '^State:.*Z' /proc/$p/status 2>/dev/null; then echo $p; fi
  done
}
start_long_run orphan
launcher=$!
job=$(job_pids $launcher)
[ "$(echo $job | wc -w)" -eq 3 ] || fail "expected mpirun and 2 workers under the launcher, got: $job"
kill -KILL $launcher
none_running() { [ -z "$(still_running "$@")" ]; }
wait_until none_running $job || true
alive=$(still_running $job)
[ -z "$alive" ] || { kill -KILL $alive || true; fail "after kill -9 of the launcher, still running: $alive"; }
echo "ok: kill -9 of the launcher ends mpirun and the workers"

# SIGHUP (the terminal closed) stops the run as SIGTERM does: every worker saves, exit 0.
start_long_run hup
launcher=$!
job=$(job_pids $launcher)
kill -HUP $launcher
rc=0; wait $launcher || rc=$?
[ "$rc" -eq 0 ] || { kill -KILL $(still_running $job) 2>/dev/null || true; cat hup.log; fail "SIGHUP: the launcher exited $rc"; }
grep -q "stopped by signal" hup.log || { cat hup.log; fail "SIGHUP: no stop message"; }
ls -d hup/checkpoint-* >/dev/null || fail "SIGHUP: no checkpoint saved"
echo "ok: SIGHUP saved a checkpoint and stopped"

start_long_run dead
pid=$(worker_pid dead 1)
[ -n "$pid" ] || fail "no rank 1 process"
kill -KILL "$pid"
rc=0; wait %% || rc=$?
[ "$rc" -ne 0 ] || fail "a killed rank did not stop the job"
grep -Eq "rank 1 .*(signal 9|Killed)|rank 1 never started it" dead.log || { cat dead.log; fail "the message does not name rank 1"; }
echo "ok: killed rank -> $(grep -Eo "process rank 1 .*" dead.log | head -1)"
echo "distributed: all checks passed"

#!/usr/bin/env bash
# Automatic restart (max_restarts): two workers, a checkpoint every 5 steps; rank 1 is killed
# with SIGKILL at step 12, then (another run) frozen with SIGSTOP until the collective timeout
# (ddp_timeout) aborts the job. Each time the launcher restarts both workers from checkpoint-10
# by itself, the job ends at max_steps with exit code 0, and its per-step losses equal those of
# an uninterrupted run bit for bit; events.jsonl records the failure (the rank, the cause) and
# the restart. With max_restarts 0 the same kill stops the job, as before. With one process
# (nproc_per_node 1), max_restarts runs it under the launcher, whose output_dir lock it inherits,
# and a kill of it restarts it the same way.
# The frozen run's ddp_timeout comes from the uninterrupted run's measured time (hang_timeout):
# the restarted workers must not time out on a loaded machine.
# Usage: restart_test.sh FABRICA_BINARY SHARED_DIR
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
nproc_per_node: 2
threads: 1
restart_backoff_s: 0.5
YAML
"$fabrica" data prepare run.yaml >/dev/null

losses() { python3 -c 'import json,sys; [print(j["step"], j["loss"]) for j in map(json.loads, open(sys.argv[1]))]' "$1"; }

# rank_pid RUN_DIR RANK: the worker process of that rank (its environment says which).
rank_pid() {
  for p in $(pgrep -f "output_dir=$1( |$)" || true); do
    if tr '\0' '\n' </proc/"$p"/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then echo "$p"; return; fi
  done
}

step_12_or_ended() { logged "$1" "step 12/" || ! kill -0 "$2" 2>/dev/null; }

# fault RUN_DIR RANK SIGNAL [ARGS...]: starts the run, sends SIGNAL to RANK once rank 0 logged
# step 12, waits; the launcher's exit code is left in $rc.
fault() {
  local out=$1 rank=$2 signal=$3; shift 3
  "$fabrica" train run.yaml output_dir="$out" "$@" >"$out.log" 2>&1 &
  local launcher=$!
  # (one worker under mpirun writes to a terminal: its step lines follow a progress bar)
  wait_until step_12_or_ended "$out.log" $launcher || { cat "$out.log"; fail "$out: step 12 never came"; }
  logged "$out.log" "step 12/" || { cat "$out.log"; fail "$out: the run ended before step 12"; }
  local pid
  pid=$(rank_pid "$out" "$rank")
  [ -n "$pid" ] || { cat "$out.log"; fail "$out: rank $rank not found at step 12"; }
  kill -"$signal" "$pid"
  rc=0
  wait $launcher || rc=$?
}

started=$SECONDS
"$fabrica" train run.yaml output_dir=plain >plain.log 2>&1 || { tail -20 plain.log; fail "uninterrupted run"; }
plain_seconds=$((SECONDS - started))
[ "$(losses plain/metrics.jsonl | wc -l)" -eq 24 ] || fail "uninterrupted run: not 24 logged steps"

# check_restarted RUN_DIR EXIT_CODE CAUSE RANK [REFERENCE_DIR]
check_restarted() {
  local out=$1 rc=$2 cause=$3 rank=$4 reference=${5:-plain}
  [ "$rc" -eq 0 ] || { tail -30 "$out.log"; fail "$out: exit $rc after a restart"; }
  grep -q "restart 1 of 1" "$out.log" || { tail -30 "$out.log"; fail "$out: no restart message"; }
  diff <(losses "$reference/metrics.jsonl") <(losses "$out/metrics.jsonl") \
    || fail "$out: losses differ from the uninterrupted run"
  python3 - "$out/events.jsonl" "$cause" "$rank" <<'PY' || fail "$out: events.jsonl"
import json, sys
events = [json.loads(line) for line in open(sys.argv[1])]
kinds = [e["event"] for e in events]
assert kinds == ["failure", "restart"], kinds
assert events[0].get("rank") == int(sys.argv[3]) and sys.argv[2] in events[0]["cause"], events[0]
assert events[1]["resumed_from_step"] == 10 and events[1]["checkpoint"].endswith("checkpoint-10"), events[1]
assert all(e["time"].endswith("Z") for e in events)
PY
  [ ! -e "$out/.fabrica.lock" ] || fail "$out: the lock file outlived the run"
  echo "ok: $out: restarted from checkpoint-10 after '$cause', losses equal the uninterrupted run's"
}

fault killed 1 KILL max_restarts=1
check_restarted killed "$rc" "exited on signal 9" 1

timeout=$(hang_timeout $plain_seconds)
echo "the uninterrupted run took $plain_seconds s: ddp_timeout $timeout for the frozen rank"
fault frozen 1 STOP max_restarts=1 ddp_timeout=$timeout
check_restarted frozen "$rc" "did not finish within $timeout s" 1

# One process under the launcher: it inherits the launcher's output_dir lock (it used to stop at
# once, "output_dir is in use by another fabrica run", naming its own launcher).
"$fabrica" train run.yaml output_dir=plain1 nproc_per_node=1 >plain1.log 2>&1 || { tail -20 plain1.log; fail "one process"; }
fault one 0 KILL nproc_per_node=1 max_restarts=1
check_restarted one "$rc" "exited on signal 9" 0 plain1
grep -q "launching 1 workers" one.log || fail "one: not run under the launcher"

fault no_restart 1 KILL --max-restarts 0
[ "$rc" -ne 0 ] || fail "max_restarts 0: the job went on after a kill"
! grep -q "restart 1" no_restart.log || fail "max_restarts 0: restarted"
echo "ok: max_restarts 0: the kill stops the job (exit $rc)"

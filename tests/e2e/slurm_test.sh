#!/usr/bin/env bash
# A real Slurm on this machine: the test starts its own munged, slurmctld and slurmd (a one-node
# cluster from a slurm.conf it writes into a temporary folder, on ports of its own) and stops
# them at the end. Then:
# 1. `sbatch` of a 2-task job (`srun --mpi=pmix fabrica train ...`: the workers read SLURM_PROCID
#    and SLURM_STEP_NUM_TASKS, MPI connects through PMIx) trains;
# 2. `scancel` of the job (SIGTERM to every task) makes both workers save the same step and exit;
#    (lr_scheduler_type constant: the first job does not know when it will be stopped)
# 3. the job sent again (a second sbatch with resume_from_checkpoint: true, as a requeue does)
#    resumes from that checkpoint, and its per-step losses equal an uninterrupted 2-process run's
#    bit for bit.
# Skipped (exit 77), saying why, where it cannot run: not root, Slurm or munge not installed,
# or the daemons do not come up.
# Usage: slurm_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$@"
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "the test runs its own slurmd [needs: root]"
for tool in munged slurmctld slurmd sbatch srun scancel scontrol sinfo squeue; do
  command -v $tool >/dev/null || skip "$tool not installed (apt-get install slurm-wlm munge)"
done
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  sleep 0.5
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  pkill -KILL -f "$work" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
cd "$work"
mkdir -p munge state spool logs
export FABRICA_CACHE="$work/cache" OMP_NUM_THREADS=1 SLURM_CONF="$work/slurm.conf"

# munge: a key and a socket of our own.
dd if=/dev/urandom of=munge/munge.key bs=1024 count=1 2>/dev/null
chmod 711 munge && chmod 400 munge/munge.key
munged --foreground --force --key-file=munge/munge.key --socket="$work/munge/socket" --pid-file="$work/munge/pid" \
  --log-file="$work/munge/log" --seed-file="$work/munge/seed" >logs/munged.out 2>&1 &
pids+=($!)

# Ports of our own (other checkouts may run this test at the same time).
port=$((20000 + ($$ % 20000)))
node=fab$$
cpus=$(nproc --all)
[ "$cpus" -ge 2 ] || cpus=2  # two tasks (config_overrides: the count is not checked against the hardware)
cat > slurm.conf <<CONF
ClusterName=fabtest$$
SlurmctldHost=$(hostname)(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SrunPortRange=$((port + 2))-$((port + 40))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$work/munge/socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool/%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/logs/slurmctld.log
SlurmdLogFile=$work/logs/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=60
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
NodeName=$node NodeAddr=127.0.0.1 NodeHostname=$(hostname) CPUs=$cpus State=UNKNOWN
PartitionName=fab Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
for _ in $(seq 1 600); do [ -S munge/socket ] && break; sleep 0.1; done
[ -S munge/socket ] || skip "munged did not start: $(tail -3 munge/log 2>/dev/null)"
slurmctld -D -i -f slurm.conf >logs/slurmctld.out 2>&1 &
pids+=($!)
slurmd -D -N $node -f slurm.conf >logs/slurmd.out 2>&1 &
pids+=($!)
up=""
for _ in $(seq 1 600); do
  state=$(sinfo -h -n $node -o %T 2>/dev/null || true)
  case $state in idle*|mix*|alloc*) up=1; break ;; esac
  sleep 0.2
done
[ -n "$up" ] || skip "slurmctld/slurmd did not come up (node state '${state:-none}'): $(tail -3 logs/slurmctld.log logs/slurmd.log 2>/dev/null | tr '\n' ' ')"
echo "ok: Slurm is up (node $node, $cpus CPUs, port $port)"

tiny_model model
{ sft_config; cat <<YAML; } > run.yaml
cutoff_len: 64
max_samples: 48
max_steps: 100000
save_steps: 0
threads: 1
YAML
"$fabrica" data prepare run.yaml >/dev/null

losses() { python3 -c 'import json,sys; [print(j["step"], j["loss"]) for j in map(json.loads, open(sys.argv[1]))]' "$1"; }

# The batch script, as a cluster's would be (see the README): every task is a worker.
cat > job.sh <<SH
#!/bin/sh
#SBATCH --ntasks=2
#SBATCH --output=$work/job-%j.out
cd $work
exec srun --mpi=pmix "$fabrica" train run.yaml output_dir=slurm lr_scheduler_type=constant "\$@"
SH

# submit ARGS...: the job id.
submit() { sbatch --parsable job.sh "$@"; }
# wait_job ID: until it has left the queue.
wait_job() {
  for _ in $(seq 1 1500); do
    [ -z "$(squeue -h -j "$1" -o %i 2>/dev/null)" ] && return 0
    sleep 0.2
  done
  fail "job $1 still in the queue after 300 s: $(squeue -j "$1"; tail -5 job-"$1".out)"
}

job=$(submit)
wait_until logged job-$job.out "^step 8/" || true
grep -q "^step 8/" job-$job.out || { cat job-$job.out; tail -20 logs/slurmd.log; fail "the job never reached step 8"; }
grep -q "world_size.: 2\|\"world_size\":2" slurm/metrics.jsonl || { cat job-$job.out; fail "the job did not run 2 ranks"; }
echo "ok: sbatch: a 2-task job trains"
scancel "$job"
wait_job "$job"
grep -q "stopped by signal 15 after step" job-$job.out || { cat job-$job.out; fail "scancel: no save message"; }
checkpoint=$(ls -d slurm/checkpoint-* | head -1)
saved=${checkpoint##*-}
[ -f "$checkpoint/trainer_state.json" ] || fail "scancel: no checkpoint"
[ "$(ls slurm/checkpoint-*/optimizer-rank-* | wc -l)" -ge 1 ] || fail "no optimizer shard"
echo "ok: scancel: both workers stopped after step $saved and saved $checkpoint"

end=$((saved + 6))
job2=$(submit resume_from_checkpoint=true max_steps=$end)
wait_job "$job2"
grep -q "resumed from slurm/checkpoint-$saved at step $saved" job-$job2.out || { cat job-$job2.out; fail "the second job did not resume"; }
"$fabrica" train run.yaml output_dir=plain nproc_per_node=2 max_steps=$end lr_scheduler_type=constant >plain.log 2>&1 || { tail -20 plain.log; fail "uninterrupted run"; }
diff <(losses plain/metrics.jsonl) <(losses slurm/metrics.jsonl) || fail "the resumed Slurm job's losses differ from an uninterrupted run's"
echo "ok: the job sent again resumed from step $saved and its $end steps equal an uninterrupted run's bit for bit"
echo "slurm: all checks passed"

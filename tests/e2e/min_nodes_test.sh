#!/usr/bin/env bash
# min_nodes: a cluster file names this machine (localhost, 2 slots) and a host that never
# answers (unreachable.invalid: the cluster's rsh agent fails for it, as ssh to a dead machine
# does). A job that ran on 4 ranks and saved checkpoint-10 is resumed with that cluster file:
# with min_nodes 1 the launcher leaves the dead host out, says so, records it in events.jsonl
# (hosts_left_out, 2 ranks of 4), and the job resumes from checkpoint-10 on 2 ranks (the 4 ranks'
# optimizer shards resharded) to the end. With min_nodes 2 it stops before starting, naming
# the host.
# Usage: min_nodes_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$@"
e2e_workdir
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

cat > agent.sh <<'SH'
#!/bin/sh
host=$1; shift
case $host in localhost) exec sh -c "$*" ;; *) echo "ssh: $host: Name or service not known" >&2; exit 255 ;; esac
SH
chmod +x agent.sh
cat > cluster.yaml <<YAML
hosts:
  - {name: localhost, slots: 2}
  - {name: unreachable.invalid, slots: 2}
rsh_agent: $work/agent.sh
YAML

tiny_model model
{ sft_config; cat <<YAML; } > run.yaml
cutoff_len: 64
max_samples: 48
save_steps: 5
zero_stage: 1
threads: 1
YAML
"$fabrica" data prepare run.yaml >/dev/null

"$fabrica" train run.yaml output_dir=job per_device_train_batch_size=1 nproc_per_node=4 max_steps=12 >four.log 2>&1 || { tail -20 four.log; fail "4 ranks"; }
[ -d job/checkpoint-10 ] || fail "no checkpoint-10"

rc=0
"$fabrica" train run.yaml output_dir=job per_device_train_batch_size=1 cluster=cluster.yaml min_nodes=2 max_steps=16 resume_from_checkpoint=true \
  >too-few.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { cat too-few.log; fail "min_nodes 2 with one host answering: exit $rc, expected 2"; }
grep -q "only 1 of 2 hosts of the cluster answered (min_nodes 2); unreachable after 3 tries: unreachable.invalid" \
  too-few.log || { cat too-few.log; fail "min_nodes 2: no message naming the host"; }
echo "ok: min_nodes 2 with one host answering stops before starting, naming the host"

"$fabrica" train run.yaml output_dir=job per_device_train_batch_size=1 cluster=cluster.yaml min_nodes=1 max_steps=16 resume_from_checkpoint=true \
  >fewer.log 2>&1 || { cat fewer.log; fail "min_nodes 1: the job did not run on the host left"; }
grep -q "unreachable.invalid did not answer (3 tries): left out; 2 workers on 1 of 2 hosts (min_nodes 1)" fewer.log \
  || { cat fewer.log; fail "no left-out message"; }
grep -q "resumed from job/checkpoint-10 at step 10" fewer.log || { cat fewer.log; fail "did not resume from checkpoint-10"; }
python3 - job/events.jsonl job/metrics.jsonl <<'PY' || fail "events.jsonl / metrics.jsonl"
import json, sys
events = [json.loads(line) for line in open(sys.argv[1])]
left = [e for e in events if e["event"] == "hosts_left_out"]
assert len(left) == 1, events
assert left[0]["hosts"] == ["unreachable.invalid"] and left[0]["ranks"] == 2 and left[0]["ranks_in_cluster_file"] == 4, left
steps = [json.loads(line) for line in open(sys.argv[2])]
assert [s["step"] for s in steps] == list(range(1, 17)), [s["step"] for s in steps]
assert steps[9]["world_size"] == 4 and steps[-1]["world_size"] == 2, (steps[9], steps[-1])
print(f"ok: left out {left[0]['hosts']}; steps 11-16 on {steps[-1]['world_size']} ranks after 10 on 4")
PY
echo "min_nodes: all checks passed"

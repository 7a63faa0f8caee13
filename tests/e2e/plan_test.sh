#!/usr/bin/env bash
# `fabrica plan` as scripts call it: this machine at the YAML's nproc_per_node, a hypothetical
# cluster (--devices/--device), --json with the interface's keys, a cluster file from --calibrate
# (2 processes under mpirun) read back with --cluster, and bad input as exit code 2.
# Usage: plan_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$@"
e2e_workdir
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

tiny_model model
{ sft_config; echo "nproc_per_node: 2"; echo "output_dir: out"; } > run.yaml

"$fabrica" plan run.yaml --top 3 > table.txt || { cat table.txt; fail "plan for this machine"; }
grep -q "cluster: 1 node(s) x 2 this machine" table.txt || { cat table.txt; fail "not planned for 2 local ranks"; }
grep -q "memory of #1 per device: parameters" table.txt || fail "no memory breakdown"
echo "ok: this machine at nproc_per_node 2"

"$fabrica" plan run.yaml --devices 16 --devices-per-node 8 --device a100-80g --json --top 4 > plan.json
python3 - plan.json <<'PY' || fail "--json layouts"
import json, sys
j = json.load(open(sys.argv[1]))
keys = ["tensor_parallel_size", "pipeline_parallel_size", "virtual_pipeline_parallel_size", "data_parallel_size",
        "zero_stage", "recompute", "micro_batch_size", "gradient_accumulation_steps", "memory_bytes", "step_seconds"]
assert 1 <= len(j["layouts"]) <= 4, len(j["layouts"])
for l in j["layouts"]:
    assert all(k in l for k in keys), l
    assert l["tensor_parallel_size"] * l["pipeline_parallel_size"] * l["data_parallel_size"] == 16, l
    assert l["micro_batch_size"] * l["gradient_accumulation_steps"] * l["data_parallel_size"] == 16, l
steps = [l["step_seconds"] for l in j["layouts"]]
assert steps == sorted(steps), steps
reasons = {p["family"]: p["reason"] for p in j["pruned"]}
assert "exceeds 8 devices per node" in reasons["tp=16"], reasons
assert "num_attention_heads 4" in reasons["tp=8"], reasons
PY
echo "ok: --devices 16 --device a100-80g --json"

"$fabrica" plan --calibrate --nproc 2 --output cluster.yaml > calibrate.txt || { cat calibrate.txt; fail "--calibrate"; }
grep -q "^  latency: " cluster.yaml && grep -q "^  host: true" cluster.yaml || { cat cluster.yaml; fail "cluster file"; }
"$fabrica" plan run.yaml --cluster cluster.yaml --json --top 1 > calibrated.json || fail "plan --cluster"
python3 -c "import json,sys; assert len(json.load(open('calibrated.json'))['layouts']) == 1"
echo "ok: --calibrate writes a cluster file that --cluster reads"

expect_exit2() {  # expect_exit2 WHAT CMD...
  local what=$1; shift
  local rc=0
  "$@" >/dev/null 2>err.txt || rc=$?
  [ "$rc" -eq 2 ] || fail "$what: exit $rc, expected 2"
  echo "ok: $what -> $(head -c 160 err.txt)"
}
expect_exit2 "unknown device" "$fabrica" plan run.yaml --devices 8 --device h800
expect_exit2 "devices not a multiple of devices per node" "$fabrica" plan run.yaml --devices 12 --device h100-80g
expect_exit2 "--cluster and --devices together" "$fabrica" plan run.yaml --cluster cluster.yaml --devices 8 --device h100-80g
expect_exit2 "missing cluster file" "$fabrica" plan run.yaml --cluster nowhere.yaml
expect_exit2 "no YAML" "$fabrica" plan
echo "all plan checks passed"

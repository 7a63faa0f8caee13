#!/usr/bin/env bash
# `fabrica plan` as scripts call it: this machine at the YAML's nproc_per_node, a hypothetical
# cluster (--devices/--device), --json with the interface's keys, a cluster file from --calibrate
# (2 processes under mpirun) read back with --cluster, `parallel: auto` training at 2 processes
# (free, with tensor_parallel_size and zero_stage set by hand, resumed), its metrics.jsonl, and
# bad input as exit code 2.
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

# parallel: auto at 2 processes: the plan is printed, run, and set against the measurement in
# metrics.jsonl, with the YAML's global batch (4 x 2 x its dp 2: 16 sequences).
check_auto_metrics() {  # check_auto_metrics OUTPUT_DIR [TP ZERO]: the sizes the YAML fixed
  python3 - "$1/metrics.jsonl" "${2:--1}" "${3:--1}" <<'PY' || fail "parallel: auto metrics in $1"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if "loss" in r]
assert len(steps) == 3, len(steps)
end = rows[-1]
for k in ["predicted_memory_bytes", "predicted_step_seconds", "peak_memory_bytes", "step_seconds"]:
    assert end[k] > 0, (k, end)
assert len(end["peak_memory_bytes_per_rank"]) == 2 and max(end["peak_memory_bytes_per_rank"]) == end["peak_memory_bytes"], end
l = end["parallel_layout"]
assert l["tensor_parallel_size"] * l["pipeline_parallel_size"] * l["data_parallel_size"] == 2, l
assert l["micro_batch_size"] * l["gradient_accumulation_steps"] * l["data_parallel_size"] == 16, l
for key, fixed in (("tensor_parallel_size", int(sys.argv[2])), ("zero_stage", int(sys.argv[3]))):
    assert fixed < 0 or l[key] == fixed, (key, l)
error = end["predicted_memory_bytes"] / end["peak_memory_bytes"] - 1
print(f"  layout tp {l['tensor_parallel_size']} pp {l['pipeline_parallel_size']} dp {l['data_parallel_size']} "
      f"zero {l['zero_stage']} mbs {l['micro_batch_size']}: memory predicted {end['predicted_memory_bytes']/1e6:.1f} MB, "
      f"measured {end['peak_memory_bytes']/1e6:.1f} MB ({100*error:+.1f}%)")
assert abs(error) < 0.15, error  # bench/RESULTS.md: within 3% on the bench model
PY
}
{ sft_config; printf 'nproc_per_node: 2\nparallel: auto\nmax_steps: 3\nsave_steps: 0\ncutoff_len: 64\n'; } > auto.yaml
"$fabrica" train auto.yaml output_dir=auto > auto.log 2>&1 || { cat auto.log; fail "parallel: auto run"; }
grep -q "parallel: auto chose tp" auto.log && grep -q "parallel: auto: peak memory per rank predicted" auto.log ||
  { cat auto.log; fail "parallel: auto printed no plan or no comparison"; }
check_auto_metrics auto
grep -q "^parallel: auto$" auto/train_config.yaml || fail "train_config.yaml lost parallel: auto"
echo "ok: parallel: auto at 2 processes"

fix=(tensor_parallel_size=1 zero_stage=1)
"$fabrica" plan auto.yaml "${fix[@]}" > constrained.txt || { cat constrained.txt; fail "plan, constrained"; }
grep -q "searching only layouts with tensor_parallel_size=1, zero_stage=1" constrained.txt ||
  { cat constrained.txt; fail "constraint not shown"; }
"$fabrica" train auto.yaml output_dir=auto_fixed "${fix[@]}" > auto_fixed.log 2>&1 || { cat auto_fixed.log; fail "parallel: auto, fixed"; }
grep -q "kept as set: tensor_parallel_size=1, zero_stage=1" auto_fixed.log || { cat auto_fixed.log; fail "keys not kept"; }
check_auto_metrics auto_fixed 1 1
echo "ok: parallel: auto keeps tensor_parallel_size and zero_stage set by hand"

# A resumed parallel: auto run keeps the layout its checkpoint was saved with.
"$fabrica" train auto.yaml output_dir=auto_resume "${fix[@]}" save_steps=2 > resume1.log 2>&1 || { cat resume1.log; fail "run to resume"; }
"$fabrica" train auto.yaml output_dir=auto_resume resume_from_checkpoint=true > resume2.log 2>&1 || { cat resume2.log; fail "resume"; }
grep -q "kept as set: the layout of .*checkpoint-2" resume2.log || { cat resume2.log; fail "resume replanned"; }
check_auto_metrics auto_resume 1 1
echo "ok: a resumed parallel: auto run keeps its checkpoint's layout"

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
expect_exit2 "parallel: manual" "$fabrica" train auto.yaml parallel=manual output_dir=bad
expect_exit2 "a fixed layout that cannot run" "$fabrica" train auto.yaml nproc_per_node=1 sequence_parallel=true \
  output_dir=bad
grep -q "parallel: auto: no layout of 1 devices" err.txt || { cat err.txt; fail "no reason given"; }
echo "all plan checks passed"

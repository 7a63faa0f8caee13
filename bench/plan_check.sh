#!/usr/bin/env bash
# The planner against measured runs on this machine (run by hand and by `make bench`; recorded in
# bench/RESULTS.md, "Planner against measured"). A small Qwen3 (4 layers, hidden 128, 4 heads : 2
# kv heads, intermediate 352, tied, the Qwen3 tokenizer's 151,669-token vocabulary), pt on
# c4_demo, cutoff_len 64, fp32, global batch 8, 3 steps; at 2 and 4 processes each of: data
# parallel at ZeRO 0-3, with recompute, at micro-batch 1; tensor parallel 2 (and 4) with and
# without sequence parallel; pipeline parallel 2 with 1F1B and interleaved, 4 stages; and their
# products with dp (tp x pp when Fabrica runs it). For each: the planner's predicted per-rank
# peak memory and step time for exactly that layout (`fabrica plan --json parallel=auto`, which
# keeps every layout key of the YAML, with the cluster file `fabrica plan --calibrate` writes)
# against the measured peak RSS of the largest rank (getrusage of each worker) and the median
# step time (steps 2-3, from metrics.jsonl's tokens_per_s); then whether the predicted fastest is
# the measured fastest.
#
#   bench/plan_check.sh [build/fabrica]    PLAN_STEPS=n (3)   FAB_SHARED_DIR (../shared)
#   PLAN_RANKS="2 4" (the process counts)   PLAN_MATCH=regex (only the layouts whose name matches,
#   e.g. 'tp2-pp1' or 'pp2-v2')
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
fabrica="$(realpath "${1:-build/fabrica}")"
shared="$(realpath "${FAB_SHARED_DIR:-../shared}")"
steps="${PLAN_STEPS:-3}"
[ -f "$shared/data/tokenizers/qwen3/tokenizer.json" ] || { echo "plan_check: $shared/data not found, skipped"; exit 0; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 FABRICA_CACHE="$work/cache"

mkdir model
cp "$shared/data/tokenizers/qwen3/tokenizer.json" "$shared/data/tokenizers/qwen3/tokenizer_config.json" model/
cat > model/config.json <<'JSON'
{"model_type": "qwen3", "vocab_size": 151669, "hidden_size": 128, "intermediate_size": 352,
 "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
 "max_position_embeddings": 512, "tie_word_embeddings": true, "rope_theta": 1000000}
JSON
cat > peak_rss.py <<'PY'
import os, resource, subprocess, sys
rc = subprocess.call(sys.argv[1:])
rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
with open(f"rss-{rank}.txt", "w") as f:
    f.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024))
sys.exit(rc)
PY

base_yaml() {  # base_yaml RANKS MICRO_BATCH
  cat <<YAML
model_name_or_path: model
stage: pt
dataset: c4_demo
dataset_dir: $shared/data/llamafactory
cutoff_len: 64
per_device_train_batch_size: $2
gradient_accumulation_steps: $((8 / $1 / $2))
nproc_per_node: $1
max_steps: $steps
logging_steps: 1
save_steps: 0
learning_rate: 1.0e-4
report_to: none
YAML
}
"$fabrica" data prepare <(base_yaml 2 1) >/dev/null  # tokenize once, every run reads the cache

# Layouts: tp pp vpp sequence_parallel zero recompute micro-batch (global batch 8 throughout).
layouts_2="1 1 1 false 0 false 2|1 1 1 false 1 false 2|1 1 1 false 2 false 2|1 1 1 false 3 false 2|\
1 1 1 false 0 true 2|1 1 1 false 0 false 1|2 1 1 false 0 false 2|2 1 1 true 0 false 2|2 1 1 true 0 true 2|\
1 2 1 false 0 false 1|1 2 2 false 0 false 1"
layouts_4="1 1 1 false 0 false 2|1 1 1 false 1 false 2|1 1 1 false 2 false 2|1 1 1 false 3 false 2|\
1 1 1 false 0 true 2|1 1 1 false 0 false 1|2 1 1 false 0 false 2|2 1 1 true 1 false 2|4 1 1 true 0 false 2|\
1 2 1 false 1 false 1|1 2 2 false 0 false 1|1 4 1 false 0 false 1|2 2 1 true 0 false 1"

echo "ranks,tp,pp,vpp,sp,zero,recompute,mbs,predicted_bytes,measured_bytes,predicted_s,measured_s" > results.csv
for ranks in ${PLAN_RANKS:-2 4}; do
  "$fabrica" plan --calibrate --nproc "$ranks" --output "cluster-$ranks.yaml" >"calibrate-$ranks.log"
  layouts="layouts_$ranks"
  IFS='|' read -ra specs <<<"${!layouts}"
  for spec in "${specs[@]}"; do
    read -r tp pp vpp sp zero recompute mbs <<<"$spec"
    dp=$((ranks / tp / pp))
    name="r${ranks}-tp${tp}-pp${pp}-v${vpp}-sp${sp}-z${zero}-rc${recompute}-b${mbs}"
    [[ "$name" =~ ${PLAN_MATCH:-.} ]] || continue
    base_yaml "$ranks" "$mbs" | sed "s/^gradient_accumulation_steps: .*/gradient_accumulation_steps: $((8 / dp / mbs))/" > "$name.yaml"
    schedule=1f1b; [ "$vpp" -gt 1 ] && schedule=interleaved_1f1b
    printf 'tensor_parallel_size: %s\npipeline_parallel_size: %s\nvirtual_pipeline_parallel_size: %s\npipeline_schedule: %s\nsequence_parallel: %s\nzero_stage: %s\nrecompute_layers: %s\noutput_dir: %s\n' \
      "$tp" "$pp" "$vpp" "$schedule" "$sp" "$zero" "$recompute" "$name" >> "$name.yaml"
    "$fabrica" plan "$name.yaml" parallel=auto --cluster "cluster-$ranks.yaml" --json --top 100000 > "$name.plan.json" || true
    runs=$(python3 - "$name.plan.json" "$mbs" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
mine = [l for l in plan["layouts"] if l["micro_batch_size"] == int(sys.argv[2])]
print("yes" if mine and mine[0]["implemented"] else "no")
PY
)
    [ "$runs" = yes ] || { echo "$name: not run (Fabrica does not run this layout yet, or it does not fit)"; continue; }
    rm -f rss-*.txt
    mpirun --oversubscribe --bind-to none -np "$ranks" -x OMP_NUM_THREADS -x FABRICA_CACHE \
      python3 peak_rss.py "$fabrica" train "$name.yaml" > "$name.log" 2>&1 || { tail -20 "$name.log"; exit 1; }
    python3 - "$name" "$ranks" "$tp" "$pp" "$vpp" "$sp" "$zero" "$recompute" "$mbs" >> results.csv <<'PY'
import glob, json, statistics, sys
name, ranks, tp, pp, vpp, sp, zero, recompute, mbs = sys.argv[1:]
plan = json.load(open(f"{name}.plan.json"))["layouts"]
mine = [l for l in plan if l["micro_batch_size"] == int(mbs)][0]
measured = max(int(open(f).read()) for f in glob.glob("rss-*.txt"))
rows = [json.loads(l) for l in open(f"{name}/metrics.jsonl")]
tokens = 8 * 64
seconds = statistics.median(tokens / r["tokens_per_s"] for r in rows[1:])
print(f"{ranks},{tp},{pp},{vpp},{sp},{zero},{recompute},{mbs},{mine['memory_bytes']},{measured},{mine['step_seconds']:.3f},{seconds:.3f}")
PY
    tail -1 results.csv
  done
done

python3 - results.csv <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
def layout(r):
    text = f"tp{r['tp']} pp{r['pp']}" + (f" vpp{r['vpp']}" if r["vpp"] != "1" else "") + \
           (" sp" if r["sp"] == "true" else "") + f" dp{int(r['ranks']) // int(r['tp']) // int(r['pp'])}"
    return text + f" z{r['zero']}" + (" rc" if r["recompute"] == "true" else "") + f" b{r['mbs']}"
print("| ranks | layout | predicted MB | measured MB | error | predicted s | measured s |")
print("|---|---|---|---|---|---|---|")
within = 0
for r in rows:
    p, m = int(r["predicted_bytes"]), int(r["measured_bytes"])
    err = (p - m) / m
    within += abs(err) <= 0.10
    print(f"| {r['ranks']} | {layout(r)} | {p / 1e6:.0f} | {m / 1e6:.0f} | {100 * err:+.1f}% "
          f"| {float(r['predicted_s']):.2f} | {float(r['measured_s']):.2f} |")
print(f"\nmemory within 10%: {within} of {len(rows)}")
for ranks in sorted({r["ranks"] for r in rows}):
    mine = [r for r in rows if r["ranks"] == ranks]
    fastest_pred = min(mine, key=lambda r: float(r["predicted_s"]))
    fastest_meas = min(mine, key=lambda r: float(r["measured_s"]))
    gap = float(fastest_pred["measured_s"]) / float(fastest_meas["measured_s"]) - 1
    print(f"{ranks} ranks: predicted fastest {layout(fastest_pred)}, measured fastest {layout(fastest_meas)}: the "
          f"predicted one measured {100 * gap:.1f}% slower than the measured fastest "
          f"({'within' if gap <= 0.05 else 'outside'} 5%)")
PY

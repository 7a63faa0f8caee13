#!/usr/bin/env bash
# Memory that does not grow with the number of distinct batch shapes: variable-length SFT (no
# packing: every batch is padded to its own longest sample) on data whose longest samples come
# first, so the activation peak is reached in the first steps. Peak RSS after 200 steps must be
# within 15% of the peak after 20 (it was 10x before the allocator's size classes).
# Usage: memory_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$@"
e2e_workdir

tiny_model model
mkdir data
/usr/bin/python3 - "$shared/data/llamafactory/alpaca_en_demo.json" <<'PY'
import json, random, sys
records = json.load(open(sys.argv[1]))
size = lambda r: len(r["instruction"]) + len(r.get("input", "")) + len(r["output"])
records.sort(key=size, reverse=True)
rest = records[4:]
random.Random(1).shuffle(rest)
json.dump(records[:4] + rest, open("data/sft.json", "w"))
json.dump({"sft": {"file_name": "sft.json"}}, open("data/dataset_info.json", "w"))
PY
cat > run.yaml <<YAML
model_name_or_path: model
stage: sft
dataset: sft
dataset_dir: data
template: qwen3_nothink
cutoff_len: 256
per_device_train_batch_size: 4
disable_shuffling: true
learning_rate: 1.0e-3
logging_steps: 50
save_steps: 0
YAML
peak_rss_mb() {  # peak_rss_mb STEPS: the peak RSS of a run of STEPS steps
  /usr/bin/python3 - "$fabrica" "$1" <<'PY'
import resource, subprocess, sys
subprocess.run([sys.argv[1], "train", "run.yaml", f"output_dir=out-{sys.argv[2]}", f"max_steps={sys.argv[2]}"],
               stdout=subprocess.DEVNULL, check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
PY
}
"$fabrica" data prepare run.yaml >/dev/null
short=$(peak_rss_mb 20) long=$(peak_rss_mb 200)
/usr/bin/python3 -c "import sys; s, l = float('$short'), float('$long'); sys.exit(0 if l <= 1.15 * s else 1)" \
  || fail "peak RSS $long MB after 200 steps, $short MB after 20: more than 15% growth"
echo "ok: peak RSS $short MB after 20 steps, $long MB after 200 (variable-length SFT)"
echo "memory end-to-end: all checks passed"

#!/usr/bin/env bash
# GRPO on a vision-language model through the `fabrica` command: prompts with images (an alpaca
# dataset with an images column) on the tiny qwen2_vl folder. The rollout engine runs the tower
# once per prompt; every training forward of a rollout row carries its prompt's images, so with
# the rollout kernels (fp32) the training log-probabilities are the rollout's exactly
# (rollout_logp_diff_max 0, which a row given another prompt's image, or none, would break), and
# the run is reproducible. ppo too: its critic reads the rows' images.
# Usage: vlm_grpo_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$@"
e2e_workdir

mkdir data
tiny_vlm_model model
cp "$shared"/data/llamafactory/mllm_demo_data/1.jpg "$shared"/data/llamafactory/mllm_demo_data/2.jpg data/
cat > data/vqa.jsonl <<'JSON'
{"prompt": "<image>Who is in the picture?", "answer": "players", "images": ["1.jpg"]}
{"prompt": "<image>What colour is the shirt?", "answer": "red", "images": ["2.jpg"]}
{"prompt": "<image><image>Which picture is brighter?", "answer": "the first", "images": ["2.jpg", "1.jpg"]}
JSON
cat > data/dataset_info.json <<'JSON'
{"vqa": {"file_name": "vqa.jsonl", "columns": {"prompt": "prompt", "response": "answer", "images": "images"}}}
JSON
cat > score.py <<'PY'
import json, sys
for line in sys.stdin:
    print(len(json.loads(line)["response"]) % 3)
PY
{ grpo_config | sed -e 's/^dataset: .*/dataset: vqa/' -e 's/^template: .*/template: qwen2_vl/' \
    -e 's/^per_device_train_batch_size: .*/per_device_train_batch_size: 3/'
  printf 'dataset_dir: data\ncutoff_len: 1024\noutput_dir: out\n'; } > run.yaml

"$fabrica" train run.yaml >train.log 2>&1 || { cat train.log; fail "grpo with images"; }
grep -q "4 images" train.log || { cat train.log; fail "image counts"; }
"$fabrica" train run.yaml output_dir=again >again.log 2>&1 || { cat again.log; fail "second grpo run"; }
python3 - out/metrics.jsonl again/metrics.jsonl <<'PY' || fail "grpo metrics"
import json, math, sys
runs = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
for line in runs[0]:
    print("  step %d: loss %.6f rollout_logp_diff_max %g" %
          (line["step"], line["loss"], line["rollout_logp_diff_max"]))
    assert math.isfinite(line["loss"]), line
    assert line["rollout_logp_diff_max"] == 0, line
assert [l["loss"] for l in runs[0]] == [l["loss"] for l in runs[1]], "not reproducible"
PY
echo "ok: grpo with image prompts: the training log-probabilities are the rollout's (diff 0), reproducible"

# ppo: the critic (the same folder with a value head) reads the rows' images too.
"$fabrica" train run.yaml stage=ppo output_dir=ppo >ppo.log 2>&1 || { cat ppo.log; fail "ppo with images"; }
python3 - ppo/metrics.jsonl <<'PY' || fail "ppo metrics"
import json, math, sys
for line in map(json.loads, open(sys.argv[1])):
    print("  step %d: loss %.6f critic/vf_loss %.6f rollout_logp_diff_max %g" %
          (line["step"], line["loss"], line["critic/vf_loss"], line["rollout_logp_diff_max"]))
    assert math.isfinite(line["loss"]) and math.isfinite(line["critic/vf_loss"]), line
    assert line["rollout_logp_diff_max"] == 0, line
PY
[ -f ppo/critic/value_head.safetensors ] || { ls -R ppo; fail "ppo wrote no critic"; }
echo "ok: ppo with image prompts: actor and critic read them"

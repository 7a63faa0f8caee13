#!/usr/bin/env bash
# `fabrica train` end to end on the GPU, part of scripts/gpu_check.sh (run there, on a lent GPU
# machine): the demo's addition task (made here by `make gpu-pack`: build-gpu/train/{model,data})
# trained on CUDA against the same run on the CPU (fp32 and bf16, losses within 2e-3 and 2e-2
# relative), then exact resume on the GPU (a run resumed from its step-10 checkpoint against the
# uninterrupted one), ZeRO-2 (and ZeRO-3 at 2 GPUs) against plain data parallel, and stage grpo's
# rollouts on the device. The binary and its libraries travel in build-gpu/fabrica-bin.tar.xz.
# Usage: bash scripts/gpu_train_check.sh PACK OUT   (exit code: 0 when every check passed)
#   GPU_DEVICE=cpu runs the "cuda" side on the CPU: a check of this script on a machine without a GPU.
set -uo pipefail
gpu=${GPU_DEVICE:-cuda}
pack=$1
out=$2
work=$(mktemp -d)
mkdir -p "$work/bin"
tar -xJf "$pack/fabrica-bin.tar.xz" -C "$work/bin" || { echo "gpu_train_check: cannot unpack the binary"; exit 1; }
export LD_LIBRARY_PATH="$work/bin/lib:${LD_LIBRARY_PATH:-}"
fabrica="$work/bin/fabrica"
"$fabrica" --version || { ldd "$fabrica" | grep "not found"; exit 1; }
cat > "$work/run.yaml" <<YAML
model_name_or_path: $pack/train/model
stage: sft
dataset: $pack/train/data/train.json
template: chatml
cutoff_len: 32
per_device_train_batch_size: 32
learning_rate: 3.0e-3
lr_scheduler_type: cosine
warmup_ratio: 0.05
weight_decay: 0.01
max_steps: 30
logging_steps: 1
save_steps: 10
seed: 7
cache_dir: $work/cache
YAML
failed=0
# train NAME KEY=VALUE...: one run, its log in $out/train-NAME.log
train() {
  local name=$1
  shift
  timeout 120 "$fabrica" train "$work/run.yaml" output_dir="$work/$name" "$@" >"$out/train-$name.log" 2>&1
  local rc=$?
  echo "   $name: exit $rc, $(grep -c '"loss"' "$work/$name/metrics.jsonl" 2>/dev/null || echo 0) logged steps"
  [ "$rc" = 0 ] || { tail -5 "$out/train-$name.log"; failed=1; }
}
# compare A B TOLERANCE [FIRST_STEP]: the worst relative loss difference, per step of metrics.jsonl
compare() {
  python3 - "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" "$3" "${4:-1}" <<'PY' || failed=1
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        j = json.loads(line)
        if "loss" in j and "step" in j: out[j["step"]] = j["loss"]
    return out
a, b, tol, first = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
steps = [s for s in sorted(a) if s >= first and s in b]
worst = max(abs(a[s] - b[s]) / max(abs(a[s]), 1e-12) for s in steps) if steps else float("inf")
print(f"   {sys.argv[1].split('/')[-2]} vs {sys.argv[2].split('/')[-2]}: {len(steps)} steps, first loss "
      f"{a.get(first)} / {b.get(first)}, last {a.get(steps[-1]) if steps else None} / "
      f"{b.get(steps[-1]) if steps else None}, worst relative difference {worst:.3g} (tolerance {tol})")
sys.exit(0 if worst <= tol else 1)
PY
}
echo "== fabrica train: CUDA against the CPU"
for precision in fp32 bf16; do
  bf16=false
  [ "$precision" = bf16 ] && bf16=true
  train "cpu-$precision" device=cpu bf16=$bf16
  train "cuda-$precision" device=$gpu bf16=$bf16
  tolerance=2e-3
  [ "$precision" = bf16 ] && tolerance=2e-2
  compare "cpu-$precision" "cuda-$precision" "$tolerance"
done
echo "== the flat buffers without CUDA virtual memory (FAB_CUDA_VMM=0): the same run bit for bit"
FAB_CUDA_VMM=0 train cuda-fp32-novmm device=$gpu
compare cuda-fp32 cuda-fp32-novmm 0
echo "== exact resume on the GPU (from checkpoint-10 of cuda-fp32)"
mkdir -p "$work/resumed" && cp -r "$work/cuda-fp32/checkpoint-10" "$work/resumed/"
train resumed device=$gpu resume_from_checkpoint=true
compare cuda-fp32 resumed 0 11
echo "== stage grpo on the GPU: rollouts (the KV caches and the decode on the device), 3 steps"
train cuda-grpo device=$gpu stage=grpo reward=exact_match num_generations=4 per_device_train_batch_size=4 \
  max_new_tokens=8 temperature=1.0 max_steps=3 save_steps=0
grep -q '"reward_mean"' "$work/cuda-grpo/metrics.jsonl" 2>/dev/null || { echo "   cuda-grpo: no reward_mean"; failed=1; }
echo "== ZeRO-2 on one GPU: the gradient granules unmapped after each bucket, mapped again for backward"
train cuda-zero2 device=$gpu zero_stage=2
compare cuda-fp32 cuda-zero2 2e-3
echo "== 2 processes on CUDA (if the machine has 2 GPUs): data parallel with ZeRO-1 and ZeRO-3, tensor parallel"
if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
  train cuda-dp2 device=$gpu nproc_per_node=2 per_device_train_batch_size=16
  compare cuda-fp32 cuda-dp2 2e-3
  train cuda-dp2-zero3 device=$gpu nproc_per_node=2 per_device_train_batch_size=16 zero_stage=3
  compare cuda-fp32 cuda-dp2-zero3 2e-3
  train cuda-tp2 device=$gpu nproc_per_node=2 tensor_parallel_size=2 sequence_parallel=true
  compare cuda-fp32 cuda-tp2 2e-3
else
  echo "   one GPU: skipped"
fi
if [ "${BENCH:-0}" = 1 ]; then
  echo "== fabrica train on CUDA: the ~1B Llama of bench/GPU_BENCH.md, bf16, packed rows of 2048 (tokens/s)"
  mkdir -p "$work/llama-1b" && cp "$pack/train/model/tokenizer"* "$work/llama-1b/"
  cat > "$work/llama-1b/config.json" <<'JSON'
{"model_type": "llama", "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
 "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
 "max_position_embeddings": 2048, "rope_theta": 10000}
JSON
  timeout 150 "$fabrica" train "$work/run.yaml" model_name_or_path="$work/llama-1b" output_dir="$work/bench-1b" \
    device=$gpu bf16=true packing=true cutoff_len=2048 per_device_train_batch_size=4 max_steps=6 save_steps=0 \
    >"$out/train-bench-1b.log" 2>&1
  echo "   exit $?"; grep -E "^step|peak" "$out/train-bench-1b.log" | tail -7
fi
rm -rf "$work"
exit $failed

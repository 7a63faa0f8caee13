#!/usr/bin/env bash
# The same SFT with LLaMA-Factory (`llamafactory-cli train`, CPU) and with `fabrica train`: one tiny
# Qwen3 folder (seeded random init saved by transformers, fp32, the real Qwen3 tokenizer), one
# LLaMA-Factory YAML (identity + alpaca_en_demo, qwen3_nothink, cutoff_len 256, fp32, dataset order
# kept, linear lr with warmup, 25 steps). Prints both sides' step losses, the worst relative
# difference and each side's peak RSS; exits non-zero if the difference exceeds LF_TOLERANCE.
#
# It installs nothing: it uses the venv LLAMAFACTORY_VENV (one with `pip install llamafactory`),
# and says so and exits 0 when that is not set or not there.
#
# Environment:
#   LLAMAFACTORY_VENV  venv with llamafactory installed (required; skipped without it)
#   FABRICA            Fabrica binary       (default build/fabrica)
#   LF_DATA            LLaMA-Factory data   (default ../shared/data/llamafactory)
#   QWEN3_TOKENIZER    tokenizer folder     (default ../shared/data/tokenizers/qwen3)
#   LF_STEPS           optimizer steps      (default 25)
#   LF_THREADS         threads per side     (default 2)
#   LF_TOLERANCE       worst relative loss difference allowed (default 1e-4)
#   LF_WORK            work folder, kept    (default: a temporary folder, removed)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

venv="${LLAMAFACTORY_VENV:-}"
if [ -z "$venv" ] || [ ! -x "$venv/bin/llamafactory-cli" ]; then
  echo "llamafactory_side_by_side: skipped (set LLAMAFACTORY_VENV to a venv with llamafactory installed)"
  exit 0
fi
fabrica="${FABRICA:-build/fabrica}"
[ -x "$fabrica" ] || { echo "llamafactory_side_by_side: $fabrica not found (build it first)" >&2; exit 1; }
fabrica="$(cd "$(dirname "$fabrica")" && pwd)/$(basename "$fabrica")"
data="$(cd "${LF_DATA:-$root/../shared/data/llamafactory}" && pwd)"
export QWEN3_TOKENIZER="$(cd "${QWEN3_TOKENIZER:-$root/../shared/data/tokenizers/qwen3}" && pwd)"
steps="${LF_STEPS:-25}"
threads="${LF_THREADS:-2}"
tolerance="${LF_TOLERANCE:-1e-4}"
if [ -n "${LF_WORK:-}" ]; then
  work="$LF_WORK"; rm -rf "$work"; mkdir -p "$work"
else
  work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
fi
py="$venv/bin/python"
helper="$root/bench/llamafactory_side_by_side.py"

"$py" "$helper" make-model "$work/model"

write_yaml() {  # $1: output_dir
  cat <<YAML
### the same file for both; only output_dir differs
model_name_or_path: $work/model
trust_remote_code: true
stage: sft
do_train: true
finetuning_type: full
dataset: identity,alpaca_en_demo
dataset_dir: $data
template: qwen3_nothink
cutoff_len: 256
overwrite_cache: true
preprocessing_num_workers: 1
dataloader_num_workers: 0
output_dir: $1
logging_steps: 1
save_steps: 100000
plot_loss: false
overwrite_output_dir: true
save_only_model: false
report_to: none
per_device_train_batch_size: 4
gradient_accumulation_steps: 1
learning_rate: 1.0e-3
max_steps: $steps
lr_scheduler_type: linear
warmup_steps: 5
max_grad_norm: 1.0
bf16: false
disable_shuffling: true
disable_gradient_checkpointing: true
use_cpu: true
seed: 42
YAML
}
write_yaml "$work/lf" > "$work/lf.yaml"
write_yaml "$work/fab" > "$work/fab.yaml"

peak() { sed -n 's/.*Maximum resident set size (kbytes): //p' "$1" | awk '{printf "%.2f GB", $1 / 1048576}'; }

echo "== LLaMA-Factory ($("$py" -c 'import importlib.metadata as m; print("llamafactory", m.version("llamafactory"), "transformers", m.version("transformers"), "torch", m.version("torch"))'))"
lf_start=$(date +%s)
OMP_NUM_THREADS="$threads" CUDA_VISIBLE_DEVICES="" DISABLE_VERSION_CHECK=1 HF_HUB_OFFLINE=1 \
  /usr/bin/time -v -o "$work/lf.time" "$venv/bin/llamafactory-cli" train "$work/lf.yaml" > "$work/lf.log" 2>&1 \
  || { tail -40 "$work/lf.log"; echo "llamafactory_side_by_side: LLaMA-Factory failed ($work/lf.log)" >&2; exit 1; }
lf_seconds=$(( $(date +%s) - lf_start ))

echo "== Fabrica ($("$fabrica" --version 2>/dev/null | head -1 || echo "$fabrica"))"
fab_start=$(date +%s)
FABRICA_CACHE="$work/cache" /usr/bin/time -v -o "$work/fab.time" "$fabrica" train "$work/fab.yaml" threads="$threads" \
  > "$work/fab.log" 2>&1 \
  || { tail -40 "$work/fab.log"; echo "llamafactory_side_by_side: Fabrica failed ($work/fab.log)" >&2; exit 1; }
fab_seconds=$(( $(date +%s) - fab_start ))

status=0
"$py" "$helper" compare "$work/lf" "$work/fab" "$tolerance" || status=$?
echo "peak RSS: LLaMA-Factory $(peak "$work/lf.time") (${lf_seconds} s), Fabrica $(peak "$work/fab.time") (${fab_seconds} s), $threads threads each"
[ "$status" -eq 0 ] || echo "llamafactory_side_by_side: losses differ by more than $tolerance relative" >&2
exit "$status"

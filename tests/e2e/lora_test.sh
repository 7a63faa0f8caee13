#!/usr/bin/env bash
# LLaMA-Factory's LoRA examples (train_lora_qwen3_lora_sft.yaml, train_lora_qwen3_lora_pretrain.yaml)
# run with only their paths changed (a tiny Qwen3, the shared dataset folder, a fresh output_dir)
# for a few steps; the output is a PEFT adapter that `fabrica export` merges into a full HF folder
# and `fabrica generate --adapter` uses.
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$1" "$2"
e2e_workdir
tiny_model seed
# A base with weights (one full sft step from the seeded initialisation), so adapters have a base to merge into.
{ sft_config | sed 's|^model_name_or_path: model|model_name_or_path: seed|'; echo "output_dir: model"; echo "max_steps: 1"; \
  echo "max_samples: 8"; } > base.yaml
"$fabrica" train base.yaml > base.log 2>&1 || { cat base.log; fail "base run"; }
examples="$shared/data/llamafactory/examples"
for name in sft pretrain; do
  sed -e "s|^model_name_or_path: .*|model_name_or_path: model\ndataset_dir: $shared/data/llamafactory|" \
      -e "s|^output_dir: .*|output_dir: out-$name|" "$examples/train_lora_qwen3_lora_$name.yaml" > $name.yaml
  "$fabrica" train $name.yaml max_steps=2 save_steps=1 max_samples=40 > $name.log 2>&1 || { cat $name.log; fail "$name run"; }
  for f in adapter_config.json adapter_model.safetensors checkpoint-1/adapter_model.safetensors; do
    [ -f out-$name/$f ] || fail "$name: no $f"
  done
  [ ! -f out-$name/model.safetensors ] || fail "$name: the base model was written again"
  grep -q '"memory_frozen_parameters_bytes"' out-$name/metrics.jsonl || fail "$name: no frozen bytes in metrics.jsonl"
done
# Resume the sft run from its checkpoint: the same final adapter, bit for bit.
cp -r out-sft resumed && rm -f resumed/adapter_model.safetensors resumed/adapter_config.json
"$fabrica" train sft.yaml max_steps=2 save_steps=1 max_samples=40 output_dir=resumed resume_from_checkpoint=true \
  > resume.log 2>&1 || { cat resume.log; fail "resume"; }
cmp out-sft/adapter_model.safetensors resumed/adapter_model.safetensors || fail "resumed adapter differs"
"$fabrica" export --checkpoint out-sft --output merged > export.log 2>&1 || { cat export.log; fail "export"; }
[ -f merged/model.safetensors ] && [ -f merged/tokenizer.json ] || fail "export wrote no full model folder"
printf 'model_name_or_path: model\nadapter_name_or_path: out-sft\nexport_dir: merged-yaml\n' > export.yaml
"$fabrica" export export.yaml > export2.log 2>&1 || { cat export2.log; fail "export yaml"; }
cmp merged/model.safetensors merged-yaml/model.safetensors || fail "the two exports differ"
a=$("$fabrica" generate --model model --adapter out-sft --prompt hi --max-new-tokens 5)
b=$("$fabrica" generate --model merged --prompt hi --max-new-tokens 5)
[ "$a" = "$b" ] || fail "generate --adapter ($a) differs from the merged model ($b)"
# Data parallel: 2 workers under ZeRO-2 take the 1-process steps (the same global batch) to 1e-5.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
dp="max_steps=3 save_steps=0 max_samples=40 shuffle=false gradient_accumulation_steps=2"
"$fabrica" train sft.yaml $dp output_dir=dp1 per_device_train_batch_size=2 > dp1.log 2>&1 || { cat dp1.log; fail "dp1"; }
"$fabrica" train sft.yaml $dp output_dir=dp2 per_device_train_batch_size=1 nproc_per_node=2 zero_stage=2 \
  > dp2.log 2>&1 || { cat dp2.log; fail "dp2"; }
paste <(grep -o '"loss":[0-9.e-]*' dp1/metrics.jsonl | cut -d: -f2) <(grep -o '"loss":[0-9.e-]*' dp2/metrics.jsonl | cut -d: -f2) |
  awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) { print "step " NR ": " $1 " vs " $2; bad = 1 } } END { exit bad }' ||
  fail "LoRA dp2 ZeRO-2 losses differ from one process"
echo "PASS: LoRA examples, resume, export, generate --adapter, dp2 ZeRO-2"

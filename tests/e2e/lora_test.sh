#!/usr/bin/env bash
# LLaMA-Factory's LoRA examples (train_lora_qwen3_lora_sft.yaml, train_lora_qwen3_lora_pretrain.yaml)
# run with only their paths changed (a tiny Qwen3, the shared dataset folder, a fresh output_dir)
# for a few steps; the output is a PEFT adapter that `fabrica export` merges into a full HF folder
# and `fabrica generate --adapter` uses.
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$1" "$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
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
echo "PASS: LoRA examples, resume, export, generate --adapter"

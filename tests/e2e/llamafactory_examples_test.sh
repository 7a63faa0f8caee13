#!/usr/bin/env bash
# LLaMA-Factory's own example YAMLs (../shared/data/llamafactory/examples: full SFT with a DeepSpeed
# ZeRO-3 config, LoRA SFT, DPO, KTO, reward model and pre-training) through `fabrica train` as a new
# user runs them: only model_name_or_path (a tiny Qwen3 with the real Qwen3 tokenizer),
# dataset_dir and output_dir changed, and the deepspeed path pointed at the shared
# ds_z3_config.json (the YAML's examples/deepspeed/... is a path inside LLaMA-Factory's checkout);
# every other key as LLaMA-Factory ships it (bf16, cutoff_len 2048, max_samples 1000, its batch,
# accumulation, schedule, ...), with max_steps=2 on the command line. Each run must finish and
# write its model: model.safetensors for the full fine-tuning (trained at ZeRO-3 as the DeepSpeed
# config asks), the PEFT adapter for LoRA, and the value head beside it for the reward model.
# About 3 minutes on 2 cores (DPO and KTO pass 8 pairs of up to 2048 tokens a step).
# Usage: llamafactory_examples_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$@"
e2e_workdir
examples="$shared/data/llamafactory/examples"
[ -f "$examples/ds_z3_config.json" ] || { echo "SKIP: $examples not found"; exit 77; }

# The smallest Qwen3 the examples' cutoff_len fits: its cost is the 151,669-token head.
mkdir model
cp "$shared/data/tokenizers/qwen3/tokenizer.json" "$shared/data/tokenizers/qwen3/tokenizer_config.json" model/
cat > model/config.json <<'JSON'
{"model_type": "qwen3", "vocab_size": 151669, "hidden_size": 16, "intermediate_size": 32,
 "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
 "max_position_embeddings": 2048, "tie_word_embeddings": true, "rope_theta": 1000000}
JSON

count=0
for yaml in "$examples"/train_*.yaml; do
  name=$(basename "$yaml" .yaml)
  sed -e "s|^model_name_or_path:.*|model_name_or_path: model|" \
      -e "s|^output_dir:.*|output_dir: out_$name|" \
      -e "s|^deepspeed:[^#]*|deepspeed: $examples/ds_z3_config.json  |" "$yaml" > "$name.yaml"
  echo "dataset_dir: $shared/data/llamafactory" >> "$name.yaml"
  # Nothing else differs from LLaMA-Factory's file.
  diff <(grep -v -e '^model_name_or_path:' -e '^output_dir:' -e '^deepspeed:' "$yaml") \
       <(grep -v -e '^model_name_or_path:' -e '^output_dir:' -e '^deepspeed:' -e '^dataset_dir:' "$name.yaml") ||
    fail "$name: more than the paths changed"
  "$fabrica" train "$name.yaml" max_steps=2 > "$name.log" 2>&1 || { tail -20 "$name.log"; fail "$name did not finish"; }
  grep -q "^step 2/2 " "$name.log" || { tail -20 "$name.log"; fail "$name: no second step"; }
  case "$name" in
    *full*)
      expected="model.safetensors config.json"
      grep -q "zero_stage 3" "$name.log" || { grep "^model:" "$name.log"; fail "$name: not at ZeRO-3 as ds_z3_config.json says"; } ;;
    *reward*) expected="adapter_model.safetensors adapter_config.json value_head.safetensors" ;;
    *) expected="adapter_model.safetensors adapter_config.json" ;;
  esac
  for f in $expected tokenizer.json; do [ -s "out_$name/$f" ] || fail "$name: no $f in out_$name"; done
  echo "ok: $name ($(grep -c '"loss"' "out_$name/metrics.jsonl" || true) steps logged, wrote $expected)"
  count=$((count + 1))
done
[ "$count" -eq 6 ] || fail "expected LLaMA-Factory's 6 example YAMLs, found $count"
echo "PASS: LLaMA-Factory's 6 examples with only the paths changed"

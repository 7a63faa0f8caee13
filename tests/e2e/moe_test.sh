#!/usr/bin/env bash
# A tiny qwen3_moe trained from scratch through `fabrica train` with LLaMA-Factory's
# moe_aux_loss_coef: metrics.jsonl reports aux_loss and moe_load_max_over_mean apart from the loss,
# the output folder holds per-expert tensors (transformers 5's save_pretrained layout) and
# `generate` runs on it; LoRA writes a PEFT adapter; bf16 follows fp32; a resumed run ends on the
# same weights; 2 data-parallel workers under ZeRO-2 and ZeRO-3, 2 expert-parallel (each holding 2 of the 4 experts;
# the output gathers them), 2 context-parallel
# and 2 tensor-parallel workers take the one-process steps to 1e-5; dpo, kto and
# rm from LLaMA-Factory's examples, grpo with exact rollout log-probabilities; what MoE does not run
# with yet is refused. Megatron's router options (seq_aux_loss, z-loss, capacity) give the same
# steps on one process and on 2 workers.
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$1" "$2"
e2e_workdir
mkdir -p model
cp "$shared/data/tokenizers/qwen3/tokenizer.json" "$shared/data/tokenizers/qwen3/tokenizer_config.json" model/
cat > model/config.json <<'JSON'
{"model_type": "qwen3_moe", "vocab_size": 151669, "hidden_size": 32, "intermediate_size": 64,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
 "max_position_embeddings": 256, "tie_word_embeddings": true, "rope_theta": 1000000,
 "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "norm_topk_prob": true,
 "mlp_only_layers": [1]}
JSON
# header_has FILE TEXT: TEXT within a safetensors file's header (no pipe into grep -q: under
# pipefail, head killed by SIGPIPE after an early match would fail the test).
header_has() { head -c 20000 "$1" > header.bin && grep -aq "$2" header.bin; }
sft_config > run.yaml
echo "moe_aux_loss_coef: 0.01" >> run.yaml
"$fabrica" train run.yaml output_dir=out max_steps=2 save_steps=1 max_samples=16 > train.log 2>&1 ||
  { cat train.log; fail "train"; }
grep -q '"aux_loss"' out/metrics.jsonl || fail "no aux_loss in metrics.jsonl"
grep -q '"moe_load_max_over_mean"' out/metrics.jsonl || fail "no moe_load_max_over_mean in metrics.jsonl"
header_has out/model.safetensors 'model.layers.0.mlp.experts.3.down_proj.weight' ||
  fail "the output has no per-expert tensors"
# Resumed from its first checkpoint, the run ends on the same weights, bit for bit.
cp -r out resumed && rm -rf resumed/checkpoint-2 resumed/model.safetensors && head -1 out/metrics.jsonl > resumed/metrics.jsonl
"$fabrica" train run.yaml output_dir=resumed max_steps=2 save_steps=1 max_samples=16 resume_from_checkpoint=true \
  > resume.log 2>&1 || { cat resume.log; fail "resume"; }
cmp out/model.safetensors resumed/model.safetensors || fail "the resumed run's weights differ"
out=$("$fabrica" generate --model out --prompt hi --max-new-tokens 4) || fail "generate on the MoE output"
[ -n "$out" ] || fail "generate wrote nothing"
# LoRA (lora_target all: attention, and the dense layer's MLP) in bf16: a PEFT adapter, no experts in it.
"$fabrica" train run.yaml output_dir=lora max_steps=2 save_steps=0 max_samples=16 finetuning_type=lora \
  lora_target=all bf16=true > lora.log 2>&1 || { cat lora.log; fail "lora"; }
header_has lora/adapter_model.safetensors 'layers.1.mlp.down_proj.lora_B' || fail "no dense-layer adapter"
header_has lora/adapter_model.safetensors 'layers.0.self_attn.q_proj.lora_A' || fail "no attention adapter"
if header_has lora/adapter_model.safetensors 'experts'; then fail "an adapter on the experts"; fi
# bf16 (LLaMA-Factory's bf16: true): the same two steps, each loss within 1% of fp32's.
"$fabrica" train run.yaml output_dir=bf16 max_steps=2 save_steps=0 max_samples=16 bf16=true > bf16.log 2>&1 ||
  { cat bf16.log; fail "bf16"; }
paste <(grep -o '"loss":[0-9.e-]*' out/metrics.jsonl | cut -d: -f2) <(grep -o '"loss":[0-9.e-]*' bf16/metrics.jsonl | cut -d: -f2) |
  awk '{ n++; d = $1 - $2; if (d < 0) d = -d; if (d > 1e-2 * $1) { print "step " NR ": " $1 " vs " $2; bad = 1 } }
       END { exit bad || n != 2 }' || fail "bf16 losses are not within 1% of fp32's"
# Data parallel: micro-batches of one sample each (the aux loss is per micro-batch, as in transformers).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
dp="max_steps=3 save_steps=0 max_samples=12 shuffle=false per_device_train_batch_size=1"
"$fabrica" train run.yaml $dp output_dir=dp1 gradient_accumulation_steps=4 > dp1.log 2>&1 || { cat dp1.log; fail "dp1"; }
# The same with expert parallel: Megatron's expert_model_parallel_size=2 over the 2 workers; with
# context parallel (each sample's tokens split over the 2 workers, the router statistics summed
# over them, so the aux loss is the whole sequences'), also with the two shares exchanging their rows
# over expert parallel 2; and with tensor parallel (attention sliced,
# the experts whole on both workers).
for run in "z2 zero_stage=2 gradient_accumulation_steps=2" "z3 zero_stage=3 gradient_accumulation_steps=2" \
           "ep2 zero_stage=1 expert_model_parallel_size=2 gradient_accumulation_steps=2" \
           "cp2 context_parallel_size=2 gradient_accumulation_steps=4" \
           "cp2ep2 context_parallel_size=2 expert_parallel_size=2 gradient_accumulation_steps=4" \
           "tp2 tensor_parallel_size=2 gradient_accumulation_steps=4"; do
  set -- $run
  name=dp2$1; shift
  "$fabrica" train run.yaml $dp output_dir=$name nproc_per_node=2 "$@" \
    > $name.log 2>&1 || { cat $name.log; fail "$name"; }
  for key in loss aux_loss; do
    paste <(grep -o "\"$key\":[0-9.e-]*" dp1/metrics.jsonl | cut -d: -f2) \
          <(grep -o "\"$key\":[0-9.e-]*" $name/metrics.jsonl | cut -d: -f2) |
      awk '{ n++; d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) { print "step " NR ": " $1 " vs " $2; bad = 1 } }
           END { exit bad || n < 3 }' || fail "MoE $name $key differs from one process"
  done
done
grep -q '"comm_ep_bytes_sent_per_step":[1-9]' dp2ep2/metrics.jsonl || fail "ep2 reports no all-to-all bytes"
# Each ep2 worker holds 2 of the 4 experts; the saved folder has all of them, gathered.
for e in 0 1 2 3; do
  header_has dp2ep2/model.safetensors "model.layers.0.mlp.experts.$e.down_proj.weight" ||
    fail "the ep2 output has no expert $e"
done
# Megatron's router options (per-sequence aux loss, z-loss, capacity 1 dropping the least probable
# picks), per micro-batch: one process and 2 data-parallel workers take the same steps.
meg="moe_router_load_balancing_type=seq_aux_loss moe_z_loss_coeff=0.001 moe_expert_capacity_factor=1.0"
"$fabrica" train run.yaml $dp output_dir=meg1 gradient_accumulation_steps=4 $meg > meg1.log 2>&1 || { cat meg1.log; fail "meg1"; }
"$fabrica" train run.yaml $dp output_dir=meg2 gradient_accumulation_steps=2 nproc_per_node=2 $meg > meg2.log 2>&1 ||
  { cat meg2.log; fail "meg2"; }
for key in loss aux_loss z_loss; do
  paste <(grep -o "\"$key\":[0-9.e-]*" meg1/metrics.jsonl | cut -d: -f2) <(grep -o "\"$key\":[0-9.e-]*" meg2/metrics.jsonl | cut -d: -f2) |
    awk '{ n++; d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) { print "step " NR ": " $1 " vs " $2; bad = 1 } }
         END { exit bad || n < 3 }' || fail "Megatron router options: dp2 $key differs from one process"
done
# Refused by name.
refused() {  # refused LOGNAME "expected text" overrides...
  local log=$1 text=$2; shift 2
  if "$fabrica" train run.yaml output_dir=refused max_steps=1 "$@" > $log.log 2>&1; then fail "$log ran"; fi
  grep -q "$text" $log.log || { cat $log.log; fail "$log: no \"$text\""; }
}
refused ep "expert_parallel_size 2 does not divide the 1 data-parallel ranks" expert_model_parallel_size=2
refused ep_grpo "expert_parallel_size 2 with stage grpo is not implemented" stage=grpo reward=exact_match \
  gradient_accumulation_steps=1 max_new_tokens=8 nproc_per_node=2 expert_parallel_size=2
refused gal "global_aux_loss is not implemented" moe_router_load_balancing_type=global_aux_loss
refused bias "moe_router_enable_expert_bias" moe_router_enable_expert_bias=true
refused tpsp "sequence_parallel with tensor_parallel_size 2 and a mixture-of-experts model is not implemented" nproc_per_node=2 \
  tensor_parallel_size=2 sequence_parallel=true
# GRPO: the rollout engine runs the MoE layers with the training forward's kernels, so the
# training forward's log-probabilities are the rollout's exactly (fp32 and bf16), and every token
# is routed to the same experts in both; with logp_kernels training they differ.
rl_task 6
grpo_config > grpo.yaml
for run in "grpo" "grpo_bf16 bf16=true" "grpo_training logp_kernels=training" \
           "ppo stage=ppo critic_warmup=2 max_steps=3"; do
  set -- $run
  name=$1; shift
  "$fabrica" train grpo.yaml output_dir=$name "$@" > $name.log 2>&1 || { cat $name.log; fail "$name on MoE"; }
done
python3 - <<'PY' || fail "GRPO's rollout log-probabilities on MoE"
import json
rows = lambda name: [json.loads(l) for l in open(f"{name}/metrics.jsonl")]
for name in ["grpo", "grpo_bf16"]:
    assert all(r["rollout_logp_diff_max"] == 0 for r in rows(name)), rows(name)
assert any(r["rollout_logp_diff_max"] > 0 for r in rows("grpo_training")), rows("grpo_training")
ppo = rows("ppo")  # the MoE critic (its value head on the same folder) learns, then the actor
assert all(r["rollout_logp_diff_max"] == 0 for r in ppo), ppo
assert "pg_loss" not in ppo[0] and "pg_loss" in ppo[-1] and ppo[-1]["critic/values_mean"] != 0, ppo
PY
[ -f ppo/critic/value_head.safetensors ] || fail "ppo on MoE wrote no critic"
header_has ppo/critic/model.safetensors 'model.layers.0.mlp.experts.3.down_proj.weight' || fail "the MoE critic has no experts"
# The preference stages: LLaMA-Factory's example YAMLs (LoRA) with only their paths changed. DPO's
# first loss is ln 2 and KTO's 0.5 (policy = reference): no load-balancing term in them, as in
# LLaMA-Factory's trainers.
for name in dpo kto reward; do
  sed -e "s|^model_name_or_path:.*|model_name_or_path: model|" -e "s|^output_dir:.*|output_dir: out_$name|" \
    "$shared/data/llamafactory/examples/train_lora_qwen3_lora_$name.yaml" > $name.yaml
  echo "dataset_dir: $shared/data/llamafactory" >> $name.yaml
  "$fabrica" train $name.yaml max_steps=2 max_samples=8 cutoff_len=96 per_device_train_batch_size=2 \
    gradient_accumulation_steps=1 logging_steps=1 > $name.log 2>&1 || { cat $name.log; fail "$name on MoE"; }
done
# DPO under expert parallel (2 workers of 1 pair each, each holding 2 of the 4 frozen experts; the
# reference log-probabilities through the same exchange): the one-process steps.
"$fabrica" train dpo.yaml output_dir=out_dpo_ep2 max_steps=2 max_samples=8 cutoff_len=96 per_device_train_batch_size=1 \
  gradient_accumulation_steps=1 logging_steps=1 nproc_per_node=2 expert_parallel_size=2 > dpo_ep2.log 2>&1 ||
  { cat dpo_ep2.log; fail "dpo at ep2 on MoE"; }
python3 - <<'PY' || fail "the preference stages' losses on MoE"
import json, math
rows = lambda name: [json.loads(l) for l in open(f"out_{name}/metrics.jsonl")]
dpo, kto, rm = rows("dpo"), rows("kto"), rows("reward")
assert abs(dpo[0]["loss"] - math.log(2)) < 1e-6, dpo[0]
ep2 = rows("dpo_ep2")
assert len(ep2) == len(dpo) == 2 and all(abs(a["loss"] - b["loss"]) < 1e-5 * b["loss"] for a, b in zip(ep2, dpo)), (ep2, dpo)
assert abs(kto[0]["loss"] - 0.5) < 1e-6, kto[0]
assert "rewards/accuracy" in rm[0] and math.isfinite(rm[0]["loss"]), rm[0]
PY
echo "PASS: MoE sft with aux loss, per-expert export, generate, LoRA, bf16, exact resume, dp2 ZeRO-2/3 and ep2 = one process, dpo/kto/rm, grpo and ppo with exact rollout logps, Megatron's router options, refusals"

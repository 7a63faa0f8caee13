#!/usr/bin/env bash
# Pipeline parallel through the `fabrica` command: pp2 (1F1B, and interleaved with packing and
# recomputation), tp2 x pp2 + sp at 4 processes and dp2 x tp2 x pp2 at 8 reproduce one process's
# losses over 20 fp32 steps within 1e-5 relative, log each stage's bubble and bytes sent, and
# leave a normal HF folder that `generate` reads; bf16 at pp2 trains; a layout the world size
# cannot hold exits 2 naming the sizes.
# Usage: pipeline_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$@"
e2e_workdir
export OMP_NUM_THREADS=1

tiny_model model
sed -i 's/"num_hidden_layers": 2/"num_hidden_layers": 4/' model/config.json  # 2 stages x 2 chunks
{ sft_config; cat <<YAML; } > run.yaml
cutoff_len: 64
max_samples: 40
warmup_steps: 2
max_steps: 20
save_steps: 0
YAML

sed -i "s/^gradient_accumulation_steps: 2$/gradient_accumulation_steps: 4/" run.yaml
"$fabrica" train run.yaml output_dir=one >one.log 2>&1 || { cat one.log; fail "single process"; }
"$fabrica" train run.yaml output_dir=pp nproc_per_node=2 pipeline_parallel_size=2 >pp.log 2>&1 \
  || { cat pp.log; fail "pp2"; }
same_losses one pp
python3 - pp/metrics.jsonl <<'PY' || fail "pipeline metrics"
import json, sys
last = [json.loads(l) for l in open(sys.argv[1])][-1]
assert last["pipeline_parallel_size"] == 2, last
assert len(last["pipeline_bubble_fraction"]) == 2 and len(last["pipeline_bytes_sent_per_step"]) == 2, last
assert all(0 <= f < 1 for f in last["pipeline_bubble_fraction"]), last
assert all(b > 0 for b in last["pipeline_bytes_sent_per_step"]), last
PY
echo "ok: pp2 (1F1B) = one process"
"$fabrica" generate --model pp --prompt "Who are you?" --template qwen3_nothink --max-new-tokens 4 >gen.txt \
  || fail "generate on the pp2 output folder"
echo "ok: generate reads the pp2 output folder"

"$fabrica" train run.yaml output_dir=one-packed neat_packing=true recompute_layers=true >one-packed.log 2>&1 \
  || { cat one-packed.log; fail "single process, packed"; }
"$fabrica" train run.yaml output_dir=vpp nproc_per_node=2 pipeline_model_parallel_size=2 \
  virtual_pipeline_model_parallel_size=2 pipeline_schedule=interleaved_1f1b neat_packing=true recompute_layers=true \
  >vpp.log 2>&1 || { cat vpp.log; fail "pp2 interleaved, packed"; }
same_losses one-packed vpp
echo "ok: pp2 interleaved with neat_packing and recompute_layers = one process"
"$fabrica" train run.yaml output_dir=tpxpp nproc_per_node=4 tensor_parallel_size=2 pipeline_parallel_size=2 \
  sequence_parallel=true neat_packing=true recompute_layers=true >tpxpp.log 2>&1 || { cat tpxpp.log; fail "tp2 x pp2"; }
same_losses one-packed tpxpp
"$fabrica" generate --model tpxpp --prompt "Who are you?" --template qwen3_nothink --max-new-tokens 4 >gen.txt \
  || fail "generate on the tp2 x pp2 output folder"
echo "ok: tp2 x pp2 + sp with neat_packing and recompute_layers = one process; generate reads its folder"
"$fabrica" train run.yaml output_dir=dptpxpp nproc_per_node=8 tensor_parallel_size=2 pipeline_parallel_size=2 \
  zero_stage=1 per_device_train_batch_size=2 >dptpxpp.log 2>&1 || { cat dptpxpp.log; fail "dp2 x tp2 x pp2"; }
same_losses one dptpxpp  # 2 data-parallel ranks x 2 samples: one's batch of 4
echo "ok: dp2 x tp2 x pp2 with ZeRO-1 (8 processes) = one process with the same global batch"

"$fabrica" train run.yaml output_dir=bf16 nproc_per_node=2 pipeline_parallel_size=2 bf16=true max_steps=4 \
  >bf16.log 2>&1 || { cat bf16.log; fail "pp2 bf16"; }
echo "ok: pp2 bf16 trains"

rc=0
"$fabrica" train run.yaml output_dir=bad nproc_per_node=2 pipeline_parallel_size=3 >bad.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { cat bad.log; fail "pp3 on 2 ranks: exit $rc, expected 2"; }
grep -q "pipeline_parallel_size 3" bad.log || { cat bad.log; fail "pp3 on 2 ranks: the message does not name the size"; }
echo "ok: pp3 on 2 ranks -> $(grep -m1 pipeline_parallel_size bad.log | head -c 160)"

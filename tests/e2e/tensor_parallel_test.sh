#!/usr/bin/env bash
# Tensor parallel through the `fabrica` command: tensor_parallel_size 2 (and with
# sequence_parallel) at 2 workers, and dp 2 x tp 2 with ZeRO-1 at 4 (the Megatron spelling
# tensor_model_parallel_size), reproduce one process's losses over 20 fp32 steps; the output
# folder holds whole HF tensors (the padded vocabulary row is gone), `generate` reads it, and a
# one-process run continues from it.
# Usage: tensor_parallel_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$@"
e2e_workdir
export OMP_NUM_THREADS=1

tiny_model model  # vocab_size 151669: tp 2 pads it to 151670
{ sft_config; cat <<YAML; } > run.yaml
cutoff_len: 64
max_samples: 40
warmup_steps: 2
max_steps: 20
save_steps: 0
ddp_bucket_size: 1
YAML

"$fabrica" train run.yaml output_dir=one >one.log 2>&1 || { cat one.log; fail "single process"; }
"$fabrica" train run.yaml output_dir=tp2 nproc_per_node=2 tensor_parallel_size=2 >tp2.log 2>&1 \
  || { cat tp2.log; fail "tp 2"; }
same_losses one tp2
echo "ok: tp 2 = one process"
"$fabrica" train run.yaml output_dir=sp nproc_per_node=2 tensor_parallel_size=2 sequence_parallel=true >sp.log 2>&1 \
  || { cat sp.log; fail "tp 2 + sp"; }
same_losses one sp
echo "ok: tp 2 + sequence parallel = one process"
"$fabrica" train run.yaml output_dir=dptp nproc_per_node=4 tensor_model_parallel_size=2 per_device_train_batch_size=2 \
  zero_stage=1 >dptp.log 2>&1 || { cat dptp.log; fail "dp 2 x tp 2"; }
same_losses one dptp
echo "ok: dp 2 x tp 2, ZeRO-1 = one process"

python3 - tp2/model.safetensors one/model.safetensors <<'PY' || fail "the tp output folder's tensors"
import json, struct, sys
def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return {k: v["shape"] for k, v in json.loads(f.read(n)).items() if k != "__metadata__"}
tp, one = header(sys.argv[1]), header(sys.argv[2])
assert tp == one, "tensor shapes differ"
assert tp["model.embed_tokens.weight"] == [151669, 32], tp["model.embed_tokens.weight"]
PY
"$fabrica" generate --model tp2 --prompt "Who are you?" --template qwen3_nothink --max-new-tokens 8 >gen.txt \
  || fail "generate on the tp output"
"$fabrica" train run.yaml model_name_or_path=tp2 output_dir=again max_steps=2 >again.log 2>&1 \
  || { cat again.log; fail "one process from the tp output"; }
echo "ok: the tp output folder is whole; generate and a one-process run read it"

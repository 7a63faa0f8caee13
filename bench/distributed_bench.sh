#!/usr/bin/env bash
# Part of `make bench`: data parallel at 2 processes (1 thread each, the batch of 8 split in two)
# for Fabrica (mpirun, DataParallel) and PyTorch DDP over gloo (torchrun) on the standard bench
# model, in the same run; then the all-reduce bandwidth of Fabrica's communicator against a bare
# MPI_Allreduce of the same buffer; then pipeline parallel at 2 stages (1F1B and interleaved with 2
# chunks per stage, 8 micro-batches, the bench model with 8 layers): each stage's idle fraction
# against (p-1)/(v*m+p-1) and the bytes it sent against 2*B*T*H per micro-batch per boundary; then
# dp 2, tp 2, tp 2 + sp and pp 2 side by side on the 4-layer bench model.
# Environment: FABRICA_BENCH (default build/fabrica_bench), BENCH_WARMUP (2), BENCH_STEPS (8),
# ALLREDUCE_MB (64).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
fabrica="${FABRICA_BENCH:-build/fabrica_bench}"
warmup="${BENCH_WARMUP:-2}"
steps="${BENCH_STEPS:-8}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpirun_2=(mpirun --oversubscribe --bind-to none -np 2)

ours=$("${mpirun_2[@]}" "$fabrica" --data-parallel --threads 1 --warmup "$warmup" --steps "$steps" | tail -1)
theirs=$(bench/.venv/bin/torchrun --standalone --nproc-per-node 2 bench/torch_peer.py --ddp --threads 1 \
  --warmup "$warmup" --steps "$steps" 2>/dev/null | tail -1)
bandwidth=$("${mpirun_2[@]}" "$fabrica" --allreduce-mb "${ALLREDUCE_MB:-64}" --warmup 2 --steps 10 | tail -1)
python3 - "$ours" "$theirs" "$bandwidth" <<'PY'
import json, sys
ours, theirs, bw = (json.loads(a) for a in sys.argv[1:4])
print(f"data parallel, 2 processes x 1 thread, fp32: Fabrica {ours['tokens_per_s']:.0f} tokens/s, "
      f"PyTorch {theirs['torch']} DDP (gloo) {theirs['tokens_per_s']:.0f} tokens/s: "
      f"ratio {ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}x")
print(f"all-reduce of {bw['allreduce_mb']:.0f} MB on {bw['ranks']} ranks: Fabrica ring {bw['fabrica_ms']:.1f} ms "
      f"({bw['fabrica_bus_gb_s']:.2f} GB/s bus), MPI_Allreduce {bw['mpi_ms']:.1f} ms ({bw['mpi_bus_gb_s']:.2f} GB/s): "
      f"ratio {bw['mpi_ms'] / bw['fabrica_ms']:.2f}x")
PY
for chunks in 1 2; do
  "${mpirun_2[@]}" "$fabrica" --pipeline $chunks --layers 8 --threads 1 --warmup "$warmup" --steps "$steps" | tail -1
done
# Side by side at 2 processes on the standard 4-layer bench model (the batch of 8 x 256 tokens per
# step in every layout): dp 2 (4 samples each), tp 2 and tp 2 + sp (all 8 on both ranks, each layer
# split), pp 2 (1F1B over 8 micro-batches of 1 sample); tokens/s, per-rank model-state bytes and
# the bytes each rank sent per step.
for layout in "--data-parallel" "--tensor-parallel" "--tensor-parallel --sequence-parallel" "--pipeline 1"; do
  # shellcheck disable=SC2086
  "${mpirun_2[@]}" "$fabrica" $layout --threads 1 --warmup "$warmup" --steps "$steps" | tail -1
done

#!/usr/bin/env bash
# The device check of the CUDA backend, prepared for a session that is lent a GPU machine (H200).
# Here, first:    make gpu-pack          (builds build-gpu/: the test and bench binaries, libgomp,
#                                          googletest sources for the fallback build; ~10 MiB)
# build-gpu/ must sit in the checkout the session runs the device tool from (it is git-ignored).
# Then, with the device tool's run:
#   command:   BENCH=1 bash scripts/gpu_check.sh      (or without BENCH=1: tests only, ~2 min)
#   carry:     ["build-gpu"]
#   timeout_s: 480
# It prints the machine, finds cuBLASLt and NCCL there (CUDA toolkit or PyTorch's nvidia-* wheels),
# runs fabrica_gpu_tests (every CUDA kernel against the CPU kernel, then a short training run on
# the device against the same run on the CPU, allocator, NCCL in a group of one), then with
# BENCH=1 the ~1B Llama benchmark (Fabrica, then PyTorch eager and torch.compile), then the
# kernel tests under compute-sanitizer memcheck if there is time. If the carried binaries cannot
# start there, it builds fabrica_gpu_tests from the working tree (-DFAB_GPU_TESTS_ONLY=ON).
# Then `fabrica train` end to end on CUDA (scripts/gpu_train_check.sh: losses against the CPU run,
# exact resume on the GPU). Logs and JSON go to $OUT (they come back with the tool's reply). Each
# step has its own timeout: tests 150, train check 200, Fabrica bench 110, PyTorch 150, memcheck 60
# (BENCH=1 and the train check together pass 480 s: run BENCH=1 as a second call).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/fabrica-gpu-out}
mkdir -p "$out"
pack=build-gpu
say() { echo "== $*"; }

say "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || say "nvidia-smi failed"
export PATH=/usr/local/cuda/bin:$PATH
nvcc --version 2>/dev/null | tail -1
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null

# The folder holding `name` under the CUDA toolkit or Python's site-packages, or nothing.
find_lib() {
  local roots=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu)
  roots+=($(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null))
  for r in "${roots[@]}"; do
    [ -d "$r" ] || continue
    local hit
    hit=$(find -L "$r" -maxdepth 5 -name "$1" 2>/dev/null | head -1)
    [ -n "$hit" ] && { dirname "$hit"; return; }
  done
}
cublas_dir=$(find_lib 'libcublasLt.so.13')
nccl_dir=$(find_lib 'libnccl.so.2')
say "cuBLASLt in ${cublas_dir:-(not found)}; NCCL in ${nccl_dir:-(not found)}"
export LD_LIBRARY_PATH="${cublas_dir:+$cublas_dir:}${nccl_dir:+$nccl_dir:}${LD_LIBRARY_PATH:-}"

tests=$pack/fabrica_gpu_tests
bench=$pack/fabrica_gpu_bench
if ! ldd "$tests" 2>&1 | grep -q "not found" && "$tests" --gtest_list_tests >/dev/null 2>&1; then
  say "carried binaries start here"
else
  say "carried fabrica_gpu_tests does not start here:"
  ldd "$tests" 2>&1 | grep "not found"
  say "building fabrica_gpu_tests from source (FAB_GPU_TESTS_ONLY)"
  nccl_lib=$(ls "$nccl_dir"/libnccl.so* 2>/dev/null | head -1)
  nccl_inc=$(find -L "$(dirname "${nccl_dir:-/nonexistent}")" -maxdepth 3 -name nccl.h 2>/dev/null | head -1)
  timeout 300 bash -c "cmake -S . -B /tmp/fab-gpu-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFAB_GPU_TESTS_ONLY=ON \
      -DFAB_GTEST_SOURCE_DIR=$PWD/$pack/googletest ${nccl_lib:+-DNCCL_LIBRARY=$nccl_lib} \
      ${nccl_inc:+-DNCCL_INCLUDE_DIR=$(dirname "$nccl_inc")} >'$out/fallback_build.log' 2>&1 &&
    cmake --build /tmp/fab-gpu-build --target fabrica_gpu_tests fabrica_gpu_bench -j 16 >>'$out/fallback_build.log' 2>&1" ||
    { tail -40 "$out/fallback_build.log"; exit 1; }
  cp /usr/lib/x86_64-linux-gnu/libgomp.so.1 /tmp/fab-gpu-build/ 2>/dev/null
  tests=/tmp/fab-gpu-build/fabrica_gpu_tests
  bench=/tmp/fab-gpu-build/fabrica_gpu_bench
fi

say "fabrica_gpu_tests"
FAB_REQUIRE_GPU=1 timeout 150 "$tests" --gtest_output=xml:"$out/gpu_tests.xml" 2>&1 | tee "$out/gpu_tests.log"
rc=${PIPESTATUS[0]}
say "fabrica_gpu_tests exit code $rc"
[ "$rc" = 0 ] || exit "$rc"

say "fabrica train on CUDA (losses against the CPU run, exact resume; scripts/gpu_train_check.sh)"
if [ -f "$pack/fabrica-bin.tar.xz" ]; then
  timeout 200 bash scripts/gpu_train_check.sh "$pack" "$out" 2>&1 | tee "$out/train_check.log"
  say "gpu_train_check exit code ${PIPESTATUS[0]}"
else
  say "no $pack/fabrica-bin.tar.xz (make gpu-pack makes it): skipped"
fi

if [ "${BENCH:-0}" = 1 ]; then
  say "benchmark: ~1B Llama, batch 4 x seq 2048, bf16 (Fabrica, then PyTorch eager and torch.compile)"
  timeout 110 "$bench" --layers 16 --batch 4 --seq 2048 --steps 5 --max-seconds 60 2>"$out/bench_fabrica.log" |
    tee "$out/bench.jsonl"
  tail -6 "$out/bench_fabrica.log"
  PYTHONUNBUFFERED=1 timeout 150 python3 bench/gpu_bench.py --layers 16 --batch 4 --seq 2048 --steps 6 \
    2>&1 | tee "$out/bench_torch.log" | grep '^{' | tee -a "$out/bench.jsonl"
fi

if command -v compute-sanitizer >/dev/null; then
  say "compute-sanitizer memcheck on the kernel tests (out-of-bounds and misaligned accesses)"
  FAB_REQUIRE_GPU=1 timeout 60 compute-sanitizer --tool memcheck --print-limit 20 "$tests" \
    --gtest_filter='CudaKernels.*:-CudaKernels.SumSquaresLargeAndEmpty' >"$out/memcheck.log" 2>&1
  say "memcheck exit code $? (124: ran out of time)"; tail -5 "$out/memcheck.log"
fi
exit 0

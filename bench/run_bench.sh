#!/usr/bin/env bash
# `make bench`: trains the standard bench model with Fabrica (build/fabrica_bench)
# and with its PyTorch peer (bench/torch_peer.py), each in its own process, one
# after the other, for every precision, and prints tokens/s, MFU, peak RSS and the
# Fabrica/PyTorch ratios. Exits non-zero if either side fails. Then, against Hugging Face
# `tokenizers`: single-thread encode throughput, and preprocessing throughput on every core
# (bench/prep_bench.sh: `fabrica data prepare` vs the same work driven from Python).
#
# Environment (all optional):
#   FABRICA_BENCH  Fabrica binary            (default build/fabrica_bench)
#   PRECISIONS     precisions to run         (default "fp32 bf16 bf16+lora"; +lora: LoRA r 8 on every
#                  projection, frozen base, against PyTorch + PEFT)
#   BENCH_WARMUP   untimed steps             (default 2)
#   BENCH_STEPS    timed steps               (default 8)
#   BENCH_THREADS  compute threads per side  (default 2)
#   BENCH_ROUNDS   rounds of (Fabrica, PyTorch) runs, alternating; the table shows each side's
#                  median round and every round's ratio (default 3: this machine is noisy)
#   PEAK_GFLOPS    peak FLOP/s for MFU, in GFLOP/s (default: measured here and now by
#                  `fabrica_bench --fma-peak`, the fp32 FMA peak of BENCH_THREADS threads in
#                  the vectors the kernels use, AVX-512 or AVX2; used for bf16 too)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

fabrica="${FABRICA_BENCH:-build/fabrica_bench}"
precisions="${PRECISIONS:-fp32 bf16 bf16+lora}"
warmup="${BENCH_WARMUP:-2}"
steps="${BENCH_STEPS:-8}"
threads="${BENCH_THREADS:-2}"
rounds="${BENCH_ROUNDS:-3}"
peak_gflops="${PEAK_GFLOPS:-}"

if [ ! -x "$fabrica" ]; then
  echo "run_bench: $fabrica not found or not executable (build it first: make bench)" >&2
  exit 1
fi

bench/setup_peer.sh
peak_source="given as PEAK_GFLOPS"
if [ -z "$peak_gflops" ]; then
  peak_json="$("$fabrica" --fma-peak --threads "$threads")"
  peak_gflops="$(printf '%s' "$peak_json" | sed -n 's/.*"fma_peak_gflops":\([0-9.]*\).*/\1/p')"
  peak_source="measured: $threads threads x a register-only $(printf '%s' "$peak_json" | sed -n 's/.*"isa":"\([a-z0-9]*\)".*/\1/p') FMA loop"
  echo "run_bench: fp32 FMA peak $peak_gflops GFLOP/s ($peak_source)"
fi
peer_py="bench/.venv/bin/python"
fmt_py="$(command -v python3 || echo "$peer_py")"

results="$(mktemp)"
trap 'rm -f "$results"' EXIT

# run_one LABEL CMD...: runs CMD (stderr passes through), keeps the last JSON line of its stdout.
run_one() {
  local label="$1"; shift
  echo "run_bench: $label: $*"
  local out rc=0
  out="$("$@")" || rc=$?
  if [ "$rc" -ne 0 ]; then
    [ -n "$out" ] && printf '%s\n' "$out" >&2
    echo "run_bench: $label failed (exit $rc)" >&2
    exit 1
  fi
  local line
  line="$(printf '%s\n' "$out" | grep '^[[:space:]]*{' | tail -n 1 || true)"
  if [ -z "$line" ]; then
    printf '%s\n' "$out" >&2
    echo "run_bench: $label printed no JSON line" >&2
    exit 1
  fi
  printf '%s\n' "$line" >>"$results"
}

args=(--warmup "$warmup" --steps "$steps" --threads "$threads")
# FAB_CPU_ISA=avx2 (with ONEDNN_MAX_CPU_ISA=AVX2) shows on an AVX-512 host what an AVX2 host runs;
# the peer is capped the same way: ATen's kernels, MKL's (its fp32 GEMMs: without the cap they ran
# AVX-512 and read 4468 tokens/s against the 3386 of a capped Fabrica) and its oneDNN, which reads
# ONEDNN_MAX_CPU_ISA itself.
peer_env=()
[ "${FAB_CPU_ISA:-}" = avx2 ] && peer_env=(env ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2)
for round in $(seq 1 "$rounds"); do
  for p in $precisions; do
    mode=(--precision "${p%+lora}")
    [ "$p" != "${p%+lora}" ] && mode+=(--lora)
    run_one "round $round: fabrica $p" "$fabrica" "${mode[@]}" "${args[@]}"
    run_one "round $round: pytorch $p" "${peer_env[@]}" "$peer_py" bench/torch_peer.py "${mode[@]}" "${args[@]}"
  done
done

cpu="$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)"
isa="$(grep -m1 -o -w -E 'avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null | sort -u | tr '\n' ' ' || true)"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo 'no commit yet')"
if [ -n "$(git status --porcelain 2>/dev/null | head -n 1)" ]; then commit="$commit, dirty tree"; fi

BENCH_CPU="${cpu:-unknown}" BENCH_NPROC="$(nproc)" BENCH_ISA="${isa% }" \
BENCH_DATE="$(date -u '+%Y-%m-%d %H:%M:%S UTC')" BENCH_COMMIT="$commit" \
BENCH_PRECISIONS="$precisions" BENCH_WARMUP="$warmup" BENCH_STEPS="$steps" \
BENCH_THREADS="$threads" BENCH_ROUNDS="$rounds" PEAK_GFLOPS="$peak_gflops" PEAK_SOURCE="$peak_source" \
"$fmt_py" - "$results" <<'PY'
import json, os, sys

# Standard bench model (must match bench/torch_peer.py and fabrica_bench).
V, C, L, H, KV, I, T, B = 8192, 256, 4, 4, 4, 704, 256, 8
D = C // H
N = L * (C * H * D + 2 * C * KV * D + H * D * C + 3 * C * I) + V * C  # matmul parameters
ATTN = 6 * L * T * C  # causal, as the trainer counts it (src/train/trainer.h)
FLOPS_PER_TOKEN = 6 * N + ATTN
peak = float(os.environ["PEAK_GFLOPS"]) * 1e9
threads = int(os.environ["BENCH_THREADS"])
precisions = os.environ["BENCH_PRECISIONS"].split()
keys = ["impl", "precision", "threads", "tokens_per_s", "step_ms", "peak_rss_mb", "final_loss"]

runs, bad = {}, []
with open(sys.argv[1]) as f:
    for line in f:
        try:
            r = json.loads(line)
        except ValueError as e:
            bad.append(f"unparsable JSON line ({e}): {line.strip()}")
            continue
        missing = [k for k in keys if k not in r]
        if missing:
            bad.append(f"{r.get('impl', '?')} {r.get('precision', '?')}: missing {', '.join(missing)}")
            continue
        if r["threads"] != threads:
            bad.append(f"{r['impl']} {r['precision']}: ran with {r['threads']} threads, asked for {threads}")
        runs.setdefault((r["precision"], r["impl"]), []).append(r)
rounds = int(os.environ["BENCH_ROUNDS"])
for p in precisions:
    for impl in ("fabrica", "pytorch"):
        if len(runs.get((p, impl), [])) != rounds:
            bad.append(f"{len(runs.get((p, impl), []))} results for {impl} {p}, expected {rounds}")
if bad:
    for b in bad:
        print("run_bench:", b, file=sys.stderr)
    sys.exit(1)

# Each side's median round by throughput (its own step time, RSS and loss); runs alternate
# Fabrica, PyTorch within a round, so a round's ratio compares runs made seconds apart.
rows = {key: sorted(rs, key=lambda r: r["tokens_per_s"])[len(rs) // 2] for key, rs in runs.items()}
torch_versions = sorted({r.get("torch", "?") for (p, i), r in rows.items() if i == "pytorch"})
e = os.environ
print()
print("=" * 78)
print(f"Fabrica vs PyTorch: Llama-style decoder training step (forward, backward, clip, AdamW)")
print(f"  model    hidden {C}, {L} layers, {H} heads x {D}, {KV} kv heads, intermediate {I}, "
      f"vocab {V}, untied")
print(f"  batch    {B} x {T} tokens; --warmup {e['BENCH_WARMUP']} --steps {e['BENCH_STEPS']} "
      f"--threads {threads}; each side in its own process;")
print(f"           {rounds} rounds alternating Fabrica and PyTorch; each side's median round shown")
print(f"  machine  {e['BENCH_CPU']}, nproc {e['BENCH_NPROC']}"
      + (f" ({e['BENCH_ISA']})" if e.get("BENCH_ISA") else ""))
print(f"  date     {e['BENCH_DATE']}")
print(f"  fabrica  {e['BENCH_COMMIT']}")
print(f"  pytorch  torch {', '.join(torch_versions)} (bench/.venv), eager mode")
print("=" * 78)
hdr = f"{'precision':<9}  {'impl':<8}  {'tokens/s':>9}  {'step ms':>8}  {'MFU':>6}  {'peak RSS MB':>11}  {'final loss':>10}"
print(hdr)
print("-" * len(hdr))
for p in precisions:
    fa, pt = rows[(p, "fabrica")], rows[(p, "pytorch")]
    for r in (fa, pt):
        mfu = r["tokens_per_s"] * FLOPS_PER_TOKEN / peak
        print(f"{p:<9}  {r['impl']:<8}  {r['tokens_per_s']:>9.1f}  {r['step_ms']:>8.1f}  "
              f"{100 * mfu:>5.1f}%  {r['peak_rss_mb']:>11.1f}  {r['final_loss']:>10.4f}")
    tp = fa["tokens_per_s"] / pt["tokens_per_s"] if pt["tokens_per_s"] else float("nan")
    mem = fa["peak_rss_mb"] / pt["peak_rss_mb"] if pt["peak_rss_mb"] else float("nan")
    per_round = [f.get("tokens_per_s") / t.get("tokens_per_s")
                 for f, t in zip(runs[(p, "fabrica")], runs[(p, "pytorch")])]
    print(f"{'':<9}  Fabrica/PyTorch: tokens/s x{tp:.2f}, peak RSS x{mem:.2f}")
    print(f"{'':<9}  tokens/s ratio in each round: " + ", ".join(f"x{r:.2f}" for r in per_round))
    print("-" * len(hdr))

if "fp32" in precisions and "bf16" in precisions:
    print(f"Fabrica bf16/fp32 tokens/s: x{rows[('bf16', 'fabrica')]['tokens_per_s'] / rows[('fp32', 'fabrica')]['tokens_per_s']:.2f}"
          f" (kernels: {rows[('bf16', 'fabrica')].get('kernels', '?')})")
imp = sorted({r["import_rss_mb"] for (p, i), r in rows.items() if i == "pytorch" and "import_rss_mb" in r})
print(f"MFU = tokens/s x FLOPs/token / peak FLOP/s")
print(f"  FLOPs/token = 6*N + 6*L*T*C = 6*{N:,} + 6*{L}*{T}*{C} = {FLOPS_PER_TOKEN:,} "
      f"({FLOPS_PER_TOKEN / 1e6:.1f} MFLOP)")
print(f"  N = L*(4*C*C + 3*C*I) + V*C = {L}*(4*{C}*{C} + 3*{C}*{I}) + {V}*{C} = {N:,}:")
print(f"      every parameter that takes part in a matmul (q, k, v, o with kv heads = heads;")
print(f"      gate, up, down; the untied lm_head). The embedding lookup is not a matmul and")
print(f"      RMSNorm weights are not counted.")
print(f"  6*L*T*C = forward+backward FLOPs of QK^T and P*V per token, causal (the keys at or")
print(f"      before each query: half of PaLM's 12*L*T*C), as the trainer counts it.")
print(f"  peak = {peak / 1e9:g} GFLOP/s, the fp32 FMA peak ({e['PEAK_SOURCE']});")
print(f"      MFU is each precision's fraction of it; the same fp32 peak is used for bf16 rows.")
print(f"      +lora rows count the same 6*N FLOPs, though a frozen base skips its weight gradients.")
print(f"peak RSS = getrusage ru_maxrss of each process (whole process, incl. libraries).")
if imp:
    print(f"  The PyTorch process is already at {max(imp):.0f} MB right after `import torch`")
    print(f"      (the default PyPI wheel is the CUDA build and maps its CUDA libraries).")
PY

# Tokenizer encode throughput, one thread each side, on the LLaMA-Factory sample documents with
# the real Qwen3 and Llama-3 tokenizer.json files (skipped without ../shared).
tests_bin="$(dirname "$fabrica")/fabrica_tests"
if [ -x "$tests_bin" ] && [ -f ../shared/data/tokenizers/qwen3/tokenizer.json ]; then
  echo "=============================================================================="
  echo "Tokenizer encode throughput (one thread): Hugging Face tokenizers vs Fabrica"
  tok_out="$(mktemp)"
  TOKENIZERS_PARALLELISM=false python3 tests/tokenizer/tokenizer_bench.py | grep "encode (one call" | tee -a "$tok_out"
  "$tests_bin" --gtest_also_run_disabled_tests --gtest_filter='*Throughput*' | grep "^fabrica" | tee -a "$tok_out"
  awk '/^HF tokenizers/ {hf[$3] = $(NF-4)} /^fabrica/ {fab[$2] = $(NF-8)}
       END {for (t in fab) if (t in hf) printf "  %s: Fabrica/HF ids/s x%.1f\n", t, fab[t] / hf[t]}' "$tok_out"
  rm -f "$tok_out"
fi

# Preprocessing throughput (templating + tokenisation into samples, every core): `fabrica data
# prepare` vs Hugging Face tokenizers driven from Python (skipped without ../shared).
bash bench/prep_bench.sh "$(dirname "$fabrica")/fabrica"

# Data parallel at 2 processes against PyTorch DDP (gloo), and the communicator's all-reduce
# bandwidth against a bare MPI_Allreduce.
echo "=============================================================================="
echo "Data parallel: Fabrica (mpirun) vs PyTorch DDP (torchrun, gloo)"
FABRICA_BENCH="$fabrica" bash bench/distributed_bench.sh

# The planner's predicted per-rank peak memory and step time against measured runs at 2 and 4
# processes (ZeRO 0-3, recompute, micro-batch), and whether its fastest is the measured fastest.
echo "=============================================================================="
echo "Planner: predicted vs measured"
bash bench/plan_check.sh "$(dirname "$fabrica")/fabrica"

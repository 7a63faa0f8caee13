#!/usr/bin/env bash
# Rollout (generation) throughput, part of `make bench`: build/fabrica_rollout_bench against
# Hugging Face transformers' batched `generate` (bench/hf_generate_peer.py, bench/.venv) on the
# same model folder and prompts, the same sampling settings (temperature 1, top-p 1, no top-k,
# every response exactly NEW_TOKENS long), the same threads, one process after the other, in
# ROUNDS alternating rounds. Prints each side's median tokens/s and the ratio per configuration.
#
# Environment (all optional):
#   FABRICA_ROLLOUT_BENCH  Fabrica binary (default build/fabrica_rollout_bench)
#   PRECISIONS             default "fp32 bf16"
#   BATCHES                default "16 32"
#   PROMPTS                default 64
#   NEW_TOKENS             default 64
#   BENCH_THREADS          default 2
#   BENCH_ROUNDS           default 3
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
fabrica="${FABRICA_ROLLOUT_BENCH:-build/fabrica_rollout_bench}"
precisions="${PRECISIONS:-fp32 bf16}"
batches="${BATCHES:-16 32}"
prompts="${PROMPTS:-64}"
new_tokens="${NEW_TOKENS:-64}"
threads="${BENCH_THREADS:-2}"
rounds="${BENCH_ROUNDS:-3}"
peer_py="bench/.venv/bin/python"

if [ ! -x "$fabrica" ]; then
  echo "rollout_bench: $fabrica not found or not executable (build it first: make bench)" >&2
  exit 1
fi
bench/setup_peer.sh
if ! "$peer_py" -W ignore -c 'import transformers' >/dev/null 2>&1; then
  echo "rollout_bench: installing transformers into bench/.venv (PyPI)"
  "$peer_py" -m pip install --quiet transformers
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$fabrica" --write "$work/model"
results="$work/results.jsonl"

run_one() {  # LABEL CMD...: keeps the last JSON line of CMD's stdout
  local label="$1"; shift
  echo "rollout_bench: $label"
  local out
  if ! out="$("$@")"; then
    printf '%s\n' "$out" >&2
    echo "rollout_bench: $label failed" >&2
    exit 1
  fi
  printf '%s\n' "$out" | grep '^{' | tail -n 1 >>"$results"
}

common=(--model "$work/model" --prompts "$prompts" --new-tokens "$new_tokens" --threads "$threads")
for round in $(seq 1 "$rounds"); do
  for p in $precisions; do
    for b in $batches; do
      run_one "round $round: fabrica $p batch $b" "$fabrica" "${common[@]}" --precision "$p" --batch "$b"
      run_one "round $round: transformers $p batch $b" "$peer_py" bench/hf_generate_peer.py "${common[@]}" \
        --precision "$p" --batch "$b"
    done
  done
done

cpu="$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)"
BENCH_CPU="${cpu:-unknown}" BENCH_NPROC="$(nproc)" BENCH_LOAD="$(cut -d' ' -f1-3 /proc/loadavg)" \
BENCH_DATE="$(date -u '+%Y-%m-%d %H:%M:%S UTC')" BENCH_COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
python3 - "$results" "$prompts" "$new_tokens" "$threads" <<'PY'
import json, os, statistics, sys

runs = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs.setdefault((r["precision"], r["batch"], r["impl"]), []).append(r)
e = os.environ
print()
print("=" * 78)
print("Rollout: Fabrica's engine vs transformers generate (batched), standard bench model")
print(f"  work     {sys.argv[2]} prompts of 16-48 tokens x {sys.argv[3]} new tokens, temperature 1, top-p 1, "
      f"{sys.argv[4]} threads")
print(f"  machine  {e['BENCH_CPU']}, nproc {e['BENCH_NPROC']}, load average {e['BENCH_LOAD']} (at the end)")
print(f"  date     {e['BENCH_DATE']}, commit {e['BENCH_COMMIT']}")
hf = next(r for (p, b, i), rs in runs.items() if i == "transformers" for r in rs)
print(f"  peer     transformers {hf['transformers']}, torch {hf['torch']}")
print("=" * 78)
print(f"{'precision':<9}  {'batch':>5}  {'fabrica tok/s':>13}  {'hf tok/s':>9}  {'ratio':>6}  {'ratio/CPU-s':>11}  per round")
med = lambda rs, k: statistics.median(r[k] for r in rs)
for (p, b) in sorted({(p, b) for (p, b, i) in runs}, key=lambda k: (k[0] != "fp32", k[1])):
    fa, hf = runs[(p, b, "fabrica")], runs[(p, b, "transformers")]
    per_round = ", ".join(f"x{f['tokens_per_s'] / h['tokens_per_s']:.1f}" for f, h in zip(fa, hf))
    ratio = med(fa, "tokens_per_s") / med(hf, "tokens_per_s")
    cpu_ratio = med(fa, "tokens_per_cpu_s") / med(hf, "tokens_per_cpu_s")
    print(f"{p:<9}  {b:>5}  {med(fa, 'tokens_per_s'):>13.1f}  {med(hf, 'tokens_per_s'):>9.1f}  x{ratio:>5.1f}  "
          f"x{cpu_ratio:>10.1f}  {per_round}")
print("ratio: of each side's median tokens/s; ratio/CPU-s: of tokens per CPU-second (user + system of the")
print("process), which a shared machine's load disturbs less")
PY

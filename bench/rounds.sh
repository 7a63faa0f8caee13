# What the benches of alternating rounds (moe_bench.sh, vlm_bench.sh) share; sourced from the
# repository root.

# bench_setup NAME WARMUP STEPS: sets fabrica (FABRICA_BENCH, default build/fabrica_bench), threads
# (BENCH_THREADS, 2), args (--warmup, --steps from BENCH_WARMUP / BENCH_STEPS, these defaults,
# --threads), rounds (BENCH_ROUNDS, 3) and peer_py; checks the binary and prepares bench/.venv.
bench_setup() {
  bench_name=$1
  fabrica="${FABRICA_BENCH:-build/fabrica_bench}"
  threads="${BENCH_THREADS:-2}"
  args=(--warmup "${BENCH_WARMUP:-$2}" --steps "${BENCH_STEPS:-$3}" --threads "$threads")
  rounds="${BENCH_ROUNDS:-3}"
  peer_py="bench/.venv/bin/python"
  [ -x "$fabrica" ] || { echo "$bench_name: $fabrica not found (build it first: make bench)" >&2; exit 1; }
  bash bench/setup_peer.sh
}

# run_one LABEL CMD...: appends the last JSON line of CMD's stdout to $results, tagged with LABEL
# (round $round); CMD's stderr is shown only when it fails.
run_one() {
  local label="$1"; shift
  echo "$bench_name: round $round: $label"
  local out
  out="$("$@" 2>"$results.stderr")" || { cat "$results.stderr" >&2; echo "$bench_name: $label failed" >&2; exit 1; }
  printf '%s\n' "$out" | grep '^{' | tail -n 1 | sed "s/^{/{\"label\":\"$label\",/" >>"$results"
}

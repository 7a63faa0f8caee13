#!/usr/bin/env bash
# Mixture-of-experts training throughput, part of `make bench`: build/fabrica_bench --model moe
# (qwen3_moe: hidden 512, 4 layers, 8 experts, top-2, moe_intermediate_size 512, aux loss 0.001,
# batch 4 x 256, AdamW, clip) against transformers' own Qwen3MoeForCausalLM on the same shape
# (bench/moe_peer.py, bench/.venv), with each of its CPU experts implementations that fit in memory
# (grouped_mm: tokens sorted by expert and torch's grouped GEMM; eager: its loop over the experts
# hit; batched_mm gathers every token's expert weights, 2048 x 4 MB a layer here, and runs out of
# 24 GiB). Also both sides' dense model of the same active parameters (intermediate 1024): the MoE
# step over the dense step is what routing and dispatch cost. ROUNDS alternating rounds, each
# side's median shown, with every round's ratio.
#
# Environment (all optional): FABRICA_BENCH (default build/fabrica_bench), BENCH_WARMUP (2),
# BENCH_STEPS (5), BENCH_THREADS (2), BENCH_ROUNDS (3).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source bench/rounds.sh
bench_setup moe_bench 2 5

results="$(mktemp)"
trap 'rm -f "$results" "$results.stderr"' EXIT
for round in $(seq 1 "$rounds"); do
  run_one "fabrica moe" "$fabrica" --model moe "${args[@]}"
  run_one "transformers moe grouped_mm" "$peer_py" bench/moe_peer.py --experts grouped_mm "${args[@]}"
  run_one "transformers moe eager" "$peer_py" bench/moe_peer.py --experts eager "${args[@]}"
  run_one "fabrica dense" "$fabrica" --model moe-dense "${args[@]}"
  run_one "transformers dense" "$peer_py" bench/moe_peer.py --dense "${args[@]}"
done

BENCH_CPU="$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)" BENCH_COMMIT="$(git rev-parse --short HEAD)" \
python3 - "$results" <<'PY'
import json, os, sys
runs = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs.setdefault(r["label"], []).append(r)
median = {k: sorted(v, key=lambda r: r["tokens_per_s"])[len(v) // 2] for k, v in runs.items()}
print("=" * 78)
print("MoE training step: Fabrica vs transformers (qwen3_moe, 8 experts, top-2, hidden 512, 4 layers,")
print("  batch 4 x 256, fp32, aux loss on, AdamW + clip); dense = same active parameters")
t = next(r for r in median.values() if r["impl"] == "transformers")
print(f"  machine {os.environ['BENCH_CPU']}; fabrica {os.environ['BENCH_COMMIT']}; "
      f"torch {t['torch']}, transformers {t['transformers']}")
print("=" * 78)
print(f"{'run':<30} {'tokens/s':>9} {'step ms':>8} {'peak RSS MB':>11} {'final loss':>10}")
for label, r in median.items():
    print(f"{label:<30} {r['tokens_per_s']:>9.1f} {r['step_ms']:>8.1f} {r['peak_rss_mb']:>11.1f} {r['final_loss']:>10.4f}")
def ratio(a, b, key):
    return [x[key] / y[key] for x, y in zip(runs[a], runs[b])]
best = max(("transformers moe grouped_mm", "transformers moe eager"), key=lambda k: median[k]["tokens_per_s"])
fa = median["fabrica moe"]
print("-" * 78)
print(f"Fabrica MoE / transformers' best ({best.split()[-1]}): tokens/s x{fa['tokens_per_s'] / median[best]['tokens_per_s']:.2f}"
      f" (each round: {', '.join(f'x{x:.2f}' for x in ratio('fabrica moe', best, 'tokens_per_s'))}),"
      f" peak RSS x{fa['peak_rss_mb'] / median[best]['peak_rss_mb']:.2f}")
print(f"  transformers' process holds {t['import_rss_mb']:.0f} MB right after `import torch` (the CUDA wheel's libraries)")
print(f"MoE step / dense step: Fabrica x{fa['step_ms'] / median['fabrica dense']['step_ms']:.2f}"
      f" (each round: {', '.join(f'x{x:.2f}' for x in ratio('fabrica moe', 'fabrica dense', 'step_ms'))}),"
      f" transformers x{median[best]['step_ms'] / median['transformers dense']['step_ms']:.2f}")
print(f"Fabrica dense / transformers dense: tokens/s x{median['fabrica dense']['tokens_per_s'] / median['transformers dense']['tokens_per_s']:.2f}")
PY

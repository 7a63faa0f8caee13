#!/usr/bin/env bash
# Vision-language SFT and image preprocessing, part of `make bench`: Fabrica against transformers
# (what LLaMA-Factory runs) on the same work, bench/vlm_peer.py the peer (bench/.venv).
#   - Training: one Qwen2.5-VL folder (random init written by transformers: text hidden 512, 4 layers;
#     tower depth 4, width 256), batch 4 x 512 tokens with one 448x448 image a row (256 image
#     tokens), fp32, AdamW + clip; `fabrica_bench --model vlm` against transformers'
#     Qwen2_5_VLForConditionalGeneration, with LLaMA-Factory's default freezing (tower and merger
#     frozen) and with the tower trained too.
#   - Images: decode, LLaMA-Factory's 768x768 pre-resize, smart_resize, bicubic, normalise,
#     patchify over photo-sized JPEGs and a PNG (bench/vlm_peer.py make-images) and the shared
#     mllm_demo JPEGs; Fabrica as its dataset pipeline runs it (one image per thread) against
#     transformers' processors: the torchvision one (transformers 5's default where torchvision
#     is installed) and the Pillow one (whose pixels Fabrica reproduces exactly).
# ROUNDS alternating rounds; each side's median shown; the ratios are the median of the rounds'
# (each round's two sides ran back to back), with every round's.
#
# Environment (all optional): FABRICA_BENCH (default build/fabrica_bench), BENCH_WARMUP (1),
# BENCH_STEPS (4), BENCH_THREADS (2), BENCH_ROUNDS (3), LF_DATA (../shared/data/llamafactory).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source bench/rounds.sh
bench_setup vlm_bench 1 4

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$peer_py" bench/vlm_peer.py make-model "$work/model" >/dev/null 2>&1
"$peer_py" bench/vlm_peer.py make-images "$work/images"
images=("$work"/images/*)
for f in "${LF_DATA:-$root/../shared/data/llamafactory}"/mllm_demo_data/*.jpg; do [ -f "$f" ] && images+=("$f"); done
image_list="$(IFS=,; echo "${images[*]}")"

results="$work/results.jsonl"
for round in $(seq 1 "$rounds"); do
  run_one "fabrica frozen tower" "$fabrica" --model vlm --folder "$work/model" "${args[@]}"
  run_one "transformers frozen tower" "$peer_py" bench/vlm_peer.py train --folder "$work/model" "${args[@]}"
  run_one "fabrica tower trained" "$fabrica" --model vlm --folder "$work/model" --train-tower "${args[@]}"
  run_one "transformers tower trained" "$peer_py" bench/vlm_peer.py train --folder "$work/model" --train-tower "${args[@]}"
  run_one "fabrica images" "$fabrica" --images "$image_list" --folder "$work/model" --threads "$threads"
  run_one "transformers images torchvision" "$peer_py" bench/vlm_peer.py images --processor fast --folder "$work/model" --threads "$threads" "${images[@]}"
  run_one "transformers images pil" "$peer_py" bench/vlm_peer.py images --processor pil --folder "$work/model" --threads "$threads" "${images[@]}"
done

BENCH_CPU="$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)" BENCH_COMMIT="$(git rev-parse --short HEAD)" \
python3 - "$results" <<'PY'
import json, os, sys
runs = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs.setdefault(r["label"], []).append(r)
def key(label):
    return "images_per_s" if "images" in label else "tokens_per_s"
median = {k: sorted(v, key=lambda r: r[key(k)])[len(v) // 2] for k, v in runs.items()}
def ratios(a, b, field=None):
    return [x[field or key(a)] / y[field or key(b)] for x, y in zip(runs[a], runs[b])]
def summary(a, b, field=None):  # the median round's ratio (each round's sides ran back to back), then every round's
    r = ratios(a, b, field)
    return f"x{sorted(r)[len(r) // 2]:.2f} (each round: {', '.join(f'x{x:.2f}' for x in r)})"
t = median["transformers frozen tower"]
print("=" * 78)
print("Vision-language SFT step and image preprocessing: Fabrica vs transformers (Qwen2.5-VL,")
print("  batch 4 x 512 with one 448x448 image a row, fp32, AdamW + clip)")
print(f"  machine {os.environ['BENCH_CPU']}; fabrica {os.environ['BENCH_COMMIT']}; "
      f"torch {t['torch']}, transformers {t['transformers']}")
print("=" * 78)
print(f"{'run':<34} {'tokens/s':>9} {'step ms':>8} {'peak RSS MB':>11} {'final loss':>10}")
for label, r in median.items():
    if "images" not in label:
        print(f"{label:<34} {r['tokens_per_s']:>9.1f} {r['step_ms']:>8.1f} {r['peak_rss_mb']:>11.1f} {r['final_loss']:>10.4f}")
for setting in ("frozen tower", "tower trained"):
    a, b = f"fabrica {setting}", f"transformers {setting}"
    print(f"{setting}: tokens/s {summary(a, b)}; peak RSS {summary(a, b, 'peak_rss_mb')}")
print(f"  transformers' process holds {t['import_rss_mb']:.0f} MB right after `import torch`")
print("-" * 78)
for label in ("fabrica images", "transformers images torchvision", "transformers images pil"):
    r = median[label]
    print(f"{label:<34} {r['images_per_s']:>9.1f} images/s ({r['images']} images, {r['patches']} patches)")
for peer in ("torchvision", "pil"):
    label = f"transformers images {peer}"
    print(f"images/s vs transformers' {peer} processor: {summary('fabrica images', label)}")
PY

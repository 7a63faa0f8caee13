#!/usr/bin/env bash
# Preprocessing throughput, part of `make bench`: `fabrica data prepare` against Hugging Face
# `tokenizers` doing the same template rendering, tokenisation and sample building in Python
# (bench/prep_peer.py), both on every core, on the same data in the same run:
#   sft  alpaca_en_demo.json repeated PREP_REPEAT times (default 4, ~3.4 MB), template qwen3
#   pt   c4_demo.jsonl + wiki_demo.txt, each repeated PREP_REPEAT / 2 times (~3.5 MB)
# with the Qwen3 tokenizer and cutoff_len 2048. Fabrica writes a fresh cache every run
# (overwrite_cache in a temporary cache_dir) and also runs on one thread, to show its scaling.
# Times exclude loading the tokenizer on both sides and are the best of 3 runs; the sample and
# token counts of both sides must agree. Skipped when ../shared is absent.
#
#   bench/prep_bench.sh [build/fabrica]      PREP_REPEAT=n  PREP_THREADS=n (default: all cores)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
fabrica="${1:-build/fabrica}"
shared="${FAB_SHARED_DIR:-../shared}"
repeat="${PREP_REPEAT:-4}"
threads="${PREP_THREADS:-$(nproc)}"
tokenizer="$shared/data/tokenizers/qwen3"
lf="$shared/data/llamafactory"

if [ ! -f "$tokenizer/tokenizer.json" ] || [ ! -f "$lf/alpaca_en_demo.json" ]; then
  echo "prep_bench: $shared/data not found, skipped"
  exit 0
fi
[ -x "$fabrica" ] || { echo "prep_bench: $fabrica not found (build it first)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

python3 - "$lf" "$work" "$repeat" <<'PY'
import json, sys
from pathlib import Path
lf, work, repeat = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
records = json.loads((lf / "alpaca_en_demo.json").read_text(encoding="utf-8"))
(work / "sft.json").write_text(json.dumps(records * repeat, ensure_ascii=False), encoding="utf-8")
half = max(1, repeat // 2)
(work / "c4.jsonl").write_text((lf / "c4_demo.jsonl").read_text(encoding="utf-8") * half, encoding="utf-8")
(work / "wiki.txt").write_text((lf / "wiki_demo.txt").read_text(encoding="utf-8") * half, encoding="utf-8")
PY

declare -A files=([sft]="sft.json" [pt]="c4.jsonl,wiki.txt")
for stage in sft pt; do
  cat >"$work/$stage.yaml" <<EOF
model_name_or_path: $tokenizer
stage: $stage
dataset: ${files[$stage]}
dataset_dir: $work
template: qwen3
cutoff_len: 2048
overwrite_cache: true
cache_dir: $work/cache
EOF
done

results="$work/results.jsonl"
# run_fabrica STAGE THREADS: `fabrica data prepare` prints "data: N train samples, M eval samples,
# T tokens; X truncated, Y skipped (S s, K threads)"; the best of 3 runs becomes one JSON line.
run_fabrica() {
  for _ in 1 2 3; do "$fabrica" data prepare "$work/$1.yaml" "threads=$2" | grep '^data:'; done |
    python3 -c '
import json, re, sys
best = None
for line in sys.stdin:
    m = re.search(r"(\d+) train samples, (\d+) eval samples, (\d+) tokens; (\d+) truncated.*\(([\d.]+) s, (\d+) threads\)", line)
    r = {"impl": "fabrica", "stage": sys.argv[1], "samples": int(m[1]) + int(m[2]), "tokens": int(m[3]),
         "truncated": int(m[4]), "seconds": float(m[5]), "threads": int(m[6])}
    best = r if best is None or r["seconds"] < best["seconds"] else best
print(json.dumps(best))' "$1" >>"$results"
}
for stage in sft pt; do
  if [ "$threads" -gt 1 ]; then run_fabrica "$stage" 1; fi
  run_fabrica "$stage" "$threads"
done
declare -A peer_files=([sft]="$work/sft.json" [pt]="$work/c4.jsonl $work/wiki.txt")
for stage in sft pt; do
  # shellcheck disable=SC2086
  RAYON_NUM_THREADS="$threads" TOKENIZERS_PARALLELISM=true python3 bench/prep_peer.py --stage "$stage" \
    --tokenizer "$tokenizer" --cutoff 2048 ${peer_files[$stage]} | tail -n 1 >>"$results"
done

python3 - "$results" "$repeat" "$threads" <<'PY'
import json, sys
rows = {}
for r in map(json.loads, open(sys.argv[1])):
    rows[(r["stage"], r["impl"], r["threads"])] = r
threads = int(sys.argv[3])
print("=" * 78)
print("Preprocessing throughput: fabrica data prepare vs HF tokenizers + Python (bench/prep_peer.py)")
print(f"  qwen3 tokenizer and template, cutoff 2048; sft: alpaca_en_demo x{sys.argv[2]}; "
      f"pt: c4_demo + wiki_demo x{max(1, int(sys.argv[2]) // 2)}; best of 3; tokenizer load not timed")
print("=" * 78)
hdr = (f"{'stage':<5}  {'impl':<13}  {'threads':>7}  {'samples':>8}  {'tokens':>9}  {'seconds':>7}  "
       f"{'samples/s':>10}  {'tokens/s':>10}")
print(hdr)
print("-" * len(hdr))
status = 0
for stage in ("sft", "pt"):
    fa, hf = rows[(stage, "fabrica", threads)], rows[(stage, "hf-tokenizers", threads)]
    single = rows.get((stage, "fabrica", 1)) if threads > 1 else None
    for r in [x for x in (single, fa, hf) if x]:
        print(f"{stage:<5}  {r['impl']:<13}  {r['threads']:>7}  {r['samples']:>8}  {r['tokens']:>9}  "
              f"{r['seconds']:>7.3f}  {r['samples'] / r['seconds']:>10,.0f}  {r['tokens'] / r['seconds']:>10,.0f}")
    same = all(r["samples"] == hf["samples"] and r["tokens"] == hf["tokens"] for r in (fa, single) if r)
    line = f"{'':<5}  Fabrica/HF on {threads} threads: x{hf['seconds'] / fa['seconds']:.1f} samples/s and tokens/s"
    if single:
        line += f"; Fabrica {threads} threads / 1 thread: x{single['seconds'] / fa['seconds']:.2f}"
    print(line + ("" if same else "  (SAMPLE OR TOKEN COUNTS DIFFER: not the same work)"))
    status |= not same
sys.exit(status)
PY

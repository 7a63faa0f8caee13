"""The preprocessing peer of `make bench`: what a user without Fabrica would run to turn the same
datasets into training ids with Hugging Face `tokenizers` (PyPI, Rust). The qwen3 template is
rendered in Python as LLaMA-Factory renders it, every text goes through one `encode_batch` (which
uses all cores, RAYON_NUM_THREADS), then LLaMA-Factory's rules build the samples:

  sft  alpaca records: source "<|im_start|>user\\n{instruction\\ninput}<|im_end|>\\n<|im_start|>assistant\\n",
       target = the empty thought block's ids + "{output}<|im_end|>\\n"; infer_seqlen truncation to
       --cutoff; labels -100 over the source (processor/supervised.py)
  pt   each text + "<|im_end|>", packed per batch of 1000 texts into --cutoff blocks, the remainder
       dropped (processor/pretrain.py)

    python bench/prep_peer.py --stage sft --tokenizer DIR --cutoff 2048 FILE...

Times reading the files through the last sample (the tokenizer load is not timed; it is reloaded
before each run so its word cache starts cold, as in a fresh process) and prints one JSON line:
samples, tokens, truncated, seconds (best of --runs), threads.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "tokenizer"))
import tokenizer_parity  # noqa: E402,F401  (re-runs this script in build/pyref/.venv without `tokenizers`)

from tokenizers import Tokenizer  # noqa: E402

IGNORE = -100
EOS = "<|im_end|>"
USER = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
ASSISTANT = "{}<|im_end|>\n"
EMPTY_THOUGHT = "<think>\n\n</think>\n\n"


def infer_seqlen(source_len, target_len, cutoff_len):
    if target_len * 2 < cutoff_len:
        max_target_len = cutoff_len
    elif source_len * 2 < cutoff_len:
        max_target_len = cutoff_len - source_len
    else:
        max_target_len = int(cutoff_len * (target_len / (source_len + target_len)))
    new_target_len = min(max_target_len, target_len)
    new_source_len = min(max(cutoff_len - new_target_len, 0), source_len)
    return new_source_len, new_target_len


def read_records(path):
    text = Path(path).read_text(encoding="utf-8")
    if path.endswith(".txt"):  # datasets' text builder: one record per line, universal newlines
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return [{"text": line} for line in lines]
    if text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def sft(tok, files, cutoff):
    sources, targets = [], []
    for path in files:
        for r in read_records(path):
            user = r.get("instruction") or ""
            if r.get("input"):
                user = f"{user}\n{r['input']}" if user else r["input"]
            sources.append(USER.format(user))
            targets.append(ASSISTANT.format(r.get("output") or ""))
    thought = tok.encode(EMPTY_THOUGHT, add_special_tokens=False).ids
    encoded = tok.encode_batch_fast(sources + targets, add_special_tokens=False)
    n = len(sources)
    samples, truncated = [], 0
    for i in range(n):
        source = encoded[i].ids
        target = encoded[n + i].ids
        if "<think>" not in targets[i] and "</think>" not in targets[i]:
            target = thought + target
        source_len, target_len = infer_seqlen(len(source), len(target), cutoff)
        truncated += source_len < len(source) or target_len < len(target)
        ids = source[:source_len] + target[:target_len]
        labels = [IGNORE] * source_len + target[:target_len]
        samples.append((ids, labels))
    return samples, truncated


def pretrain(tok, files, cutoff, batch_size=1000):
    texts = [r["text"] + EOS for path in files for r in read_records(path)]
    encoded = tok.encode_batch_fast(texts, add_special_tokens=False)
    samples = []
    for start in range(0, len(encoded), batch_size):
        stream = [i for e in encoded[start:start + batch_size] for i in e.ids]
        usable = len(stream) // cutoff * cutoff
        for b in range(0, usable, cutoff):
            block = stream[b:b + cutoff]
            samples.append((block, list(block)))
    return samples, 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", choices=["sft", "pt"], required=True)
    ap.add_argument("--tokenizer", required=True, help="folder holding tokenizer.json")
    ap.add_argument("--cutoff", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    best, result = float("inf"), None
    for _ in range(args.runs):
        tok = Tokenizer.from_file(str(Path(args.tokenizer) / "tokenizer.json"))
        start = time.perf_counter()
        samples, truncated = (sft if args.stage == "sft" else pretrain)(tok, args.files, args.cutoff)
        best = min(best, time.perf_counter() - start)
        result = samples, truncated
    samples, truncated = result
    print(json.dumps({"impl": "hf-tokenizers", "stage": args.stage, "samples": len(samples),
                      "tokens": sum(len(ids) for ids, _ in samples), "truncated": truncated,
                      "seconds": best, "threads": int(os.environ.get("RAYON_NUM_THREADS") or os.cpu_count())}))


if __name__ == "__main__":
    main()

"""Single-thread encode throughput of Hugging Face `tokenizers` on the documents that
TokenizerBench.DISABLED_Throughput (tokenizer_parity_test.cpp) encodes: every string of the
LLaMA-Factory demo files (English, Chinese, web text, tool calls) and the lines of wiki_demo.txt.

    TOKENIZERS_PARALLELISM=false python3 tests/tokenizer/tokenizer_bench.py
    build/fabrica_tests --gtest_also_run_disabled_tests --gtest_filter='*Throughput*'
"""
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).parent))

from tokenizer_parity import shared_dir  # noqa: E402  (also makes sure `tokenizers` is installed)
from tokenizer_parity_texts import strings_in  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

FILES = ["alpaca_en_demo.json", "alpaca_zh_demo.json", "c4_demo.jsonl", "glaive_toolcall_en_demo.json",
         "wiki_demo.txt"]


def documents(folder):
    docs = []
    for name in FILES:
        text = (folder / name).read_text(encoding="utf-8")
        if name.endswith(".txt"):
            docs.extend(line for line in text.splitlines() if line)
        elif name.endswith(".jsonl"):
            docs.extend(s for line in text.splitlines() if line.strip() for s in strings_in(json.loads(line)))
        else:
            docs.extend(strings_in(json.loads(text)))
    return [d for d in docs if d]


def best_of(runs, fn):
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        count = fn()
        best = min(best, time.perf_counter() - start)
    return best, count


def main():
    folder = shared_dir() / "data"
    docs = documents(folder / "llamafactory")
    size = sum(len(d.encode()) for d in docs)
    print(f"{len(docs)} documents, {size / 1e6:.2f} MB")
    for name in ("qwen3", "llama3"):
        tok = Tokenizer.from_file(str(folder / "tokenizers" / name / "tokenizer.json"))
        modes = {
            "encode (one call per document)": lambda: sum(len(tok.encode(d, add_special_tokens=False).ids) for d in docs),
            "encode_batch_fast (1 thread)": lambda: sum(len(e.ids) for e in tok.encode_batch_fast(docs, add_special_tokens=False)),
        }
        for mode, fn in modes.items():
            seconds, ids = best_of(3, fn)
            print(f"HF tokenizers {name:7s} {mode:32s}: {ids} ids in {seconds:.3f} s = {ids / seconds / 1e6:.2f} M ids/s, "
                  f"{size / seconds / 1e6:.2f} MB/s")


if __name__ == "__main__":
    main()

"""Parity of a tokenizer trained by `fabrica tokenizer train` between Hugging Face `tokenizers`
and Fabrica's own tokenizer.

    python3 tests/tokenizer/bpe_trainer_parity.py [--fabrica build/fabrica] [--tokenizer DIR]
                                             [--vocab-size 8000] [--lines 600]

Without --tokenizer it trains one (vocab 8000) on the LLaMA-Factory demo data in
$FAB_SHARED_DIR/data/llamafactory (default: the repository's ../shared; where that is absent, on the
repository's own text), then encodes a few hundred
lines (alpaca_en_demo instruction/input/output, alpaca_zh_demo, plus hand-written edge cases) with
HF's Tokenizer.from_file(tokenizer.json) and with `fabrica tokenize --tokenizer DIR --input FILE`,
and checks that the ids are identical (with and without add_special_tokens) and that HF decodes
them back to the NFC form of the line. Exits 1 on any difference. Run with an interpreter that
lacks `tokenizers`, it uses (or makes) the pyref venv (pyref.py) in build/pyref/.venv.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
import pyref  # noqa: E402
from tokenizer_parity_texts import repository_texts  # noqa: E402


EDGE_CASES = [
    "<|im_start|>user\\nHello<|im_end|>",
    "<|im_start|>assistant Hi there!<|im_end|><|endoftext|>",
    "text<|im_end|>text <|endoftext|> text",
    "Café naïve résumé Straße — “quotes” ‘single’ … ellipsis",
    "e\u0301 combining accent (NFC turns it into é), Å vs A\u030a",
    "Emoji 🙂🚀✨👩‍👩‍👧 flags 🇫🇷🇯🇵",
    "    four leading spaces, trailing spaces    ",
    "tabs\tin\tthe\tmiddle\t",
    "I'm sure they'll say it's what we've done, I'd think; DON'T SHOUT",
    "numbers 1234567890 3.14159 -42 1e-9 0x1F",
    "x = [i ** 2 for i in range(10)]  # comment",
    "中文、日本語、한국어、Ελληνικά、русский、العربية、עברית、हिन्दी",
    "zero\u200bwidth and non\u00a0breaking spaces",
    "unseen characters: 龘 齉 𠀀 ꙮ",
    "",
    " ",
]


def shared_data_dir():
    shared = Path(os.environ.get("FAB_SHARED_DIR", REPO.parent / "shared"))
    return shared / "data" / "llamafactory"


def field_texts(data_dir):
    texts = []
    for name in ("alpaca_en_demo.json", "alpaca_zh_demo.json"):
        for record in json.loads((data_dir / name).read_text(encoding="utf-8")):
            texts += [record[k] for k in ("instruction", "input", "output") if record.get(k)]
    return texts


def test_lines(texts, count):
    """The edge cases and `count` non-blank lines spread evenly over the texts."""
    lines = []
    for text in texts:
        lines += [line for line in text.split("\n") if line.strip()]
    step = max(1, len(lines) // count)
    return EDGE_CASES + lines[::step][:count]


def train(fabrica, texts, vocab_size, out_dir):
    corpus = Path(out_dir) / "corpus.txt"
    corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
    tokenizer_dir = Path(out_dir) / "tokenizer"
    subprocess.check_call([fabrica, "tokenizer", "train", "--input", str(corpus), "--vocab-size", str(vocab_size),
                           "--output", str(tokenizer_dir)])
    return tokenizer_dir


def fabrica_ids(fabrica, tokenizer_dir, lines_file, add_special):
    command = [fabrica, "tokenize", "--tokenizer", str(tokenizer_dir), "--input", str(lines_file)]
    if add_special:
        command.append("--add-special-tokens")
    out = subprocess.run(command, check=True, capture_output=True).stdout.decode("utf-8")
    return [json.loads(line) for line in out.splitlines()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fabrica", default=str(REPO / "build" / "fabrica"))
    parser.add_argument("--trainer", help="binary for `tokenizer train` (default: --fabrica)")
    parser.add_argument("--tokenizer", help="a trained tokenizer folder (default: train one)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--lines", type=int, default=600)
    args = parser.parse_args()
    pyref.ensure("tokenizers")  # else installs it in build/pyref/.venv and re-runs this script there
    from tokenizers import Tokenizer

    data = shared_data_dir()
    if data.exists():
        texts = field_texts(data)
    else:
        print(f"bpe_trainer_parity: {data} not found: training on the repository's own text instead")
        texts = EDGE_CASES + repository_texts(REPO)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_dir = Path(args.tokenizer) if args.tokenizer else train(args.trainer or args.fabrica, texts,
                                                                          args.vocab_size, tmp)
        hf = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        lines = test_lines(texts, args.lines)
        lines_file = Path(tmp) / "lines.txt"
        lines_file.write_bytes("".join(line + "\n" for line in lines).encode("utf-8"))
        failures = 0
        for add_special in (False, True):
            ours = fabrica_ids(args.fabrica, tokenizer_dir, lines_file, add_special)
            if len(ours) != len(lines):
                sys.exit(f"fabrica tokenize printed {len(ours)} lines for {len(lines)}")
            for line, got in zip(lines, ours):
                expected = hf.encode(line, add_special_tokens=add_special).ids
                if got != expected:
                    failures += 1
                    if failures <= 5:
                        print(f"MISMATCH {line!r}\n  hf:      {expected}\n  fabrica: {got}")
                if hf.decode(expected, skip_special_tokens=False) != unicodedata.normalize("NFC", line):
                    failures += 1
                    print(f"HF ROUND TRIP FAILS {line!r}")
        tokens = sum(len(hf.encode(line).ids) for line in lines)
        print(f"{len(lines)} lines ({tokens} tokens, vocab {hf.get_vocab_size()}), encoded with and without "
              f"special tokens: {failures} differences")
        return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

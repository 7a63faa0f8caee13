"""Reference ids for the SentencePiece tokenizer (tests/tokenizer/spm_tokenizer_test.cpp) from the
`sentencepiece` package (PyPI, pinned in pyref_requirements.txt, in build/pyref/.venv).

    python3 tests/tokenizer/spm_parity.py build/reference

trains a Llama-2-style BPE model on the LLaMA-Factory demo data ($FAB_SHARED_DIR/data/llamafactory,
default ../shared; the repository's own text where that is absent), English and Chinese: byte fallback, split digits, identity normalization, no
removal of extra whitespace, a dummy prefix, <unk>=0 <s>=1 </s>=2 and one user-defined symbol. It
writes build/reference/spm/tokenizer.model, a Llama-2-style tokenizer_config.json (with two added
tokens after the model's vocabulary) and build/reference/spm_parity.json.

Expected ids follow Hugging Face's slow LlamaTokenizer (legacy mode): the text is split on the
added tokens of tokenizer_config.json (leftmost, longest first), each added token is one id and
every other piece is SentencePieceProcessor.encode(piece). "decoded_skip" is
SentencePieceProcessor.decode of the ids without the special ones (null where a non-special added
token remains, which SentencePiece cannot decode).
"""
import json
import os
import re
import sys
from pathlib import Path

import pyref

pyref.ensure("sentencepiece")

import sentencepiece as spm  # noqa: E402

from tokenizer_parity_texts import (corpus_texts, random_texts, repository_texts, strings_in,  # noqa: E402
                                    tricky_texts)

VOCAB_SIZE = 8000
USER_SYMBOL = "<tool>"  # matched by SentencePiece itself
# tokenizer_config.json's added_tokens_decoder beyond the model: (content, special)
EXTRA_TOKENS = [("<pad>", True), ("<tool_call>", False)]


def training_lines(folder):
    lines = [line for line in (folder / "wiki_demo.txt").read_text(encoding="utf-8").splitlines() if line.strip()]
    for name in ("alpaca_en_demo.json", "alpaca_zh_demo.json"):
        lines.extend(s for s in strings_in(json.loads((folder / name).read_text(encoding="utf-8"))) if s.strip())
    for line in (folder / "c4_demo.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            lines.extend(s for s in strings_in(json.loads(line)) if s.strip())
    return [line for text in lines for line in text.splitlines() if line.strip()]


def train(lines, out_dir):
    out_dir.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(out_dir / "tokenizer"), model_type="bpe",
        vocab_size=VOCAB_SIZE, byte_fallback=True, split_digits=True, character_coverage=0.99995,
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=True,
        allow_whitespace_only_pieces=True, max_sentence_length=16384, num_threads=1,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, user_defined_symbols=[USER_SYMBOL],
        minloglevel=2)
    (out_dir / "tokenizer.vocab").unlink()
    return spm.SentencePieceProcessor(model_file=str(out_dir / "tokenizer.model"))


def write_config(sp, out_dir):
    """Llama-2's tokenizer_config.json layout, plus the EXTRA_TOKENS."""
    def added(content, special):
        return {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                "single_word": False, "special": special}
    decoder = {str(i): added(sp.id_to_piece(i), True) for i in (sp.unk_id(), sp.bos_id(), sp.eos_id())}
    for offset, (content, special) in enumerate(EXTRA_TOKENS):
        decoder[str(sp.get_piece_size() + offset)] = added(content, special)
    config = {"add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": decoder,
              "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
              "legacy": True, "tokenizer_class": "LlamaTokenizer"}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2))
    return {entry["content"]: (int(i), entry["special"]) for i, entry in decoder.items()}


def encode(sp, added, text):
    """LlamaTokenizer (legacy): added tokens split off, SentencePiece on the rest."""
    pattern = "|".join(re.escape(t) for t in sorted(added, key=len, reverse=True))
    ids = []
    for i, piece in enumerate(re.split(f"({pattern})", text)):
        if i % 2:
            ids.append(added[piece][0])
        elif piece:
            ids.extend(sp.encode(piece))
    return ids


def spm_texts():
    return ["<s>", "</s>", "<unk>", "<s>Hello</s>", " <s> Hello </s> ", "<pad><pad>x", "a<tool_call>b",
            "<tool>", "x<tool>y <tool> ", "<0x41> <0xE4> ▁▁", "<s/s>", "</s><s>", "mixed 中文 <s> 日本 </s>"]


def main():
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else pyref.REPO / "build" / "reference")
    data = Path(os.environ.get("FAB_SHARED_DIR", pyref.REPO.parent / "shared")) / "data" / "llamafactory"
    if data.exists():
        lines = training_lines(data)
    else:
        print(f"spm_parity: {data} not found: training on the repository's own text instead", file=sys.stderr)
        lines = [t for text in tricky_texts() + repository_texts(pyref.REPO) for t in text.splitlines() if t.strip()]
    sp = train(lines, out_dir / "spm")
    added = write_config(sp, out_dir / "spm")
    texts = tricky_texts() + spm_texts() + corpus_texts(data, 300) + random_texts(300, seed=4321)
    special_ids = {i for i, special in added.values() if special}
    results = []
    for text in texts:
        ids = encode(sp, added, text)
        kept = [i for i in ids if i not in special_ids]
        in_model = all(i < sp.get_piece_size() for i in kept)  # else SentencePiece cannot decode them
        results.append({"ids": ids, "decoded_skip": sp.decode(kept) if in_model else None})
    fixture = {"sentencepiece_version": spm.__version__, "texts": texts, "results": results,
               "vocab_size": sp.get_piece_size() + len(EXTRA_TOKENS), "bos": sp.bos_id(), "eos": sp.eos_id(),
               "pieces": [sp.id_to_piece(i) for i in range(sp.get_piece_size())]}
    (out_dir / "spm_parity.json").write_text(json.dumps(fixture, ensure_ascii=False))
    print(f"spm_parity: {len(texts)} texts, vocabulary {sp.get_piece_size()} -> {out_dir / 'spm_parity.json'}")


if __name__ == "__main__":
    main()

"""Reference ids for tests/tokenizer/tokenizer_test.cpp from Hugging Face `tokenizers` (PyPI).

    python3 tests/tokenizer/tokenizer_parity.py build/reference

writes build/reference/tokenizer_parity.json and the synthetic tokenizer.json files it uses under
build/reference/tokenizers/. Run with an interpreter that lacks `tokenizers`, it makes a venv in
build/pyref/.venv, installs the pinned versions (pyref_requirements.txt) there and re-runs itself with it.

Tokenizers: the real Qwen3 and Llama-3 files in $FAB_SHARED_DIR/data/tokenizers (default: the
repository's ../shared; skipped when absent), Llama-3 with a TemplateProcessing post-processor
(as Llama-3.1 ships), and small BPE models trained here that exercise what the real files do not
(GPT-2 style ByteLevel with prefix space and regex, Split behaviours, Digits, Metaspace,
normalizers, normalized / lstrip / rstrip / single_word added tokens, byte fallback, unk, subword
prefixes).
"""
import json
import os
import random
import sys
from pathlib import Path

import pyref

REPO = pyref.REPO
pyref.ensure("tokenizers")

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers  # noqa: E402
from tokenizers import pre_tokenizers, processors, trainers  # noqa: E402

from tokenizer_parity_texts import corpus_texts, random_texts, tricky_texts  # noqa: E402


# ---- tokenizers -----------------------------------------------------------------------------------

def shared_dir():
    return Path(os.environ.get("FAB_SHARED_DIR", REPO.parent / "shared"))


def llama3_with_template(llama3_json, out_dir):
    doc = json.loads(Path(llama3_json).read_text())
    bos = "<|begin_of_text|>"
    doc["post_processor"] = {
        "type": "Sequence",
        "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {bos: {"id": bos, "ids": [128000], "tokens": [bos]}}},
        ],
    }
    return write_json(doc, out_dir / "llama3_template")


def write_json(doc, folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(doc, ensure_ascii=False))
    return folder


def save(tok, folder):
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def train(tok, texts, vocab_size, **kwargs):
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False, **kwargs)
    tok.train_from_iterator(texts, trainer)
    return tok


def toy_gpt2(texts, out_dir):
    """GPT-2 layout: ByteLevel with prefix space and its own regex; RoBERTa-style added tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    train(tok, texts, 800, special_tokens=["<s>", "</s>", "<pad>"],
          initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True),
                            AddedToken("<r>", rstrip=True, special=True)])
    tok.add_tokens([AddedToken("ab", single_word=True), AddedToken("[Norm]", normalized=True),
                    AddedToken("<tool>", normalized=False), AddedToken(" spaced", normalized=False)])
    tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")),
                                                      ("<s>", tok.token_to_id("<s>")))
    return save(tok, out_dir / "toy_gpt2")


def toy_split(texts, out_dir):
    """Every Split behaviour, invert, string patterns and Digits before a silent ByteLevel."""
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s+"), behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"[,.;!?]"), behavior="merged_with_next"),
        pre_tokenizers.Split("::", behavior="removed"),
        pre_tokenizers.Split(Regex(r"\p{L}+"), behavior="contiguous", invert=True),
        pre_tokenizers.Split(Regex(r"(?=x)"), behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    train(tok, texts, 700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    return save(tok, out_dir / "toy_split")


def toy_norm(texts, out_dir):
    """Normalizer chain with normalized added tokens; Llama-3's Split then ByteLevel."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([
        normalizers.NFKD(), normalizers.Lowercase(), normalizers.Strip(),
        normalizers.Replace(Regex(r"\s{2,}"), " "), normalizers.Replace("q", "k"), normalizers.NFC(),
        normalizers.Prepend("^"),
    ])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    train(tok, texts, 700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.add_tokens([AddedToken("[NormTok]", normalized=True), AddedToken("Ǆemo", normalized=True),
                    AddedToken("RAW", normalized=False), AddedToken("word", single_word=True, normalized=True)])
    tok.add_special_tokens([AddedToken("<|eot|>", special=True, normalized=False)])
    return save(tok, out_dir / "toy_norm")


def add_byte_tokens(folder, lowest=0, highest=255):
    """Puts <0x00>..<0xFF> in the model vocabulary (what SentencePiece conversions have)."""
    path = folder / "tokenizer.json"
    doc = json.loads(path.read_text())
    vocab = doc["model"]["vocab"]
    next_id = max(vocab.values()) + 1
    for b in range(lowest, highest + 1):
        vocab.setdefault(f"<0x{b:02X}>", next_id)
        next_id += 1
    for token in doc["added_tokens"]:  # keep added ids after the vocabulary
        token["id"] = vocab.get(token["content"], token["id"])
    path.write_text(json.dumps(doc, ensure_ascii=False))
    return folder


def toy_spm(texts, out_dir, name, byte_range, fuse_unk):
    """SentencePiece conversion layout: ▁ for spaces, byte fallback, unk, Strip/Fuse decoders."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=fuse_unk))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    latin = [t for t in texts if all(ord(c) < 0x250 for c in t)]
    train(tok, latin, 600, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=80)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    folder = save(tok, out_dir / name)
    return add_byte_tokens(folder, *byte_range)


def toy_metaspace(texts, out_dir, name, scheme, split):
    """Newer SentencePiece conversions (Llama-2, Mistral): a Metaspace pre-tokenizer and decoder."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=split)
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme=scheme)])
    latin = [t for t in texts if all(ord(c) < 0x250 for c in t)]
    train(tok, latin, 600, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=80)
    tok.add_special_tokens([AddedToken("<tool>", special=True, normalized=False)])
    return add_byte_tokens(save(tok, out_dir / name))


def toy_wordpiece_like(texts, out_dir):
    """BPE with a continuing-subword prefix and an end-of-word suffix (no byte level)."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s+"), behavior="removed")
    train(tok, texts, 900, special_tokens=["[UNK]"], limit_alphabet=120,
          continuing_subword_prefix="##", end_of_word_suffix="</w>")
    return save(tok, out_dir / "toy_suffix")


def tokenizer_folders(out_dir, training_texts):
    folders = {}
    shared = shared_dir() / "data" / "tokenizers"
    if (shared / "qwen3" / "tokenizer.json").exists():
        folders["qwen3"] = ("shared", "qwen3", shared / "qwen3")
        folders["llama3"] = ("shared", "llama3", shared / "llama3")
        folders["llama3_template"] = ("ref", "tokenizers/llama3_template",
                                      llama3_with_template(shared / "llama3" / "tokenizer.json", out_dir))
    else:
        print(f"tokenizer_parity: {shared} not found: real tokenizers skipped", file=sys.stderr)
    toys = {
        "toy_gpt2": toy_gpt2(training_texts, out_dir),
        "toy_split": toy_split(training_texts, out_dir),
        "toy_norm": toy_norm(training_texts, out_dir),
        "toy_spm": toy_spm(training_texts, out_dir, "toy_spm", (0, 255), True),
        "toy_spm_unk": toy_spm(training_texts, out_dir, "toy_spm_unk", (0, 0xBF), False),
        "toy_suffix": toy_wordpiece_like(training_texts, out_dir),
        "toy_meta_first": toy_metaspace(training_texts, out_dir, "toy_meta_first", "first", False),
        "toy_meta_always": toy_metaspace(training_texts, out_dir, "toy_meta_always", "always", True),
    }
    for name, folder in toys.items():
        folders[name] = ("ref", f"tokenizers/{name}", folder)
    return folders


# ---- fixture --------------------------------------------------------------------------------------

def reference_results(tok, texts):
    results = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        results.append({
            "ids": ids,
            "ids_special": tok.encode(text, add_special_tokens=True).ids,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip": tok.decode(ids, skip_special_tokens=True),
        })
    return results


def main():
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "build" / "reference")
    tok_dir = out_dir / "tokenizers"
    corpus = corpus_texts(shared_dir() / "data" / "llamafactory", 300)
    texts = tricky_texts() + corpus + random_texts(300, seed=1234)
    folders = tokenizer_folders(tok_dir, tricky_texts() * 3 + corpus)
    fixture = {"tokenizers_version": __import__("tokenizers").__version__, "texts": texts, "tokenizers": {}}
    for name, (root, relative, folder) in folders.items():
        tok = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
        config_path = Path(folder) / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        special = {}
        for key in ("bos_token", "eos_token", "pad_token"):
            value = config.get(key)
            value = value.get("content") if isinstance(value, dict) else value
            special[key] = tok.token_to_id(value) if value is not None else None
        vocab = tok.get_vocab(with_added_tokens=True)
        rng = random.Random(7)
        sample = rng.sample(sorted(vocab.items()), min(200, len(vocab)))
        fixture["tokenizers"][name] = {
            "root": root, "path": relative, "special": special,
            "vocab_size": max(vocab.values()) + 1,
            "vocab_sample": [[token, tok.token_to_id(token), tok.id_to_token(i)] for token, i in sample],
            "results": reference_results(tok, texts),
        }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tokenizer_parity.json").write_text(json.dumps(fixture, ensure_ascii=False))
    print(f"tokenizer_parity: {len(texts)} texts x {len(folders)} tokenizers -> "
          f"{out_dir / 'tokenizer_parity.json'}")


if __name__ == "__main__":
    main()

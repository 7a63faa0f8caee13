#!/usr/bin/env python3
"""Writes tests/dataset/fixtures/template_parity.json: what LLaMA-Factory itself makes of a few real
dataset records, so that tests/dataset/template_test.cpp can check Fabrica's dataset readers, chat
templates and preprocessors against it token for token.

It runs LLaMA-Factory's own code: the dataset loader and converters (loader._load_single_dataset),
the templates (get_template_and_fix_tokenizer) and the processors (Supervised-, Pretrain- and
PairwiseDatasetProcessor) on the real Qwen3 and Llama-3 tokenizers (transformers.AutoTokenizer).

Set-up used for the committed fixture (LLaMA-Factory 0.9.5, transformers 5.24, torch 2.15):

    bench/.venv/bin/pip download --no-deps llamafactory==0.9.5 -d /tmp/lf_dl
    bench/.venv/bin/pip install --no-deps --target /tmp/lf_pkgs /tmp/lf_dl/llamafactory-*.whl \
        peft==0.18.1 accelerate==1.11.0 datasets==4.0.0 pyarrow "dill<0.3.9" "multiprocess<0.70.17" \
        xxhash pandas requests python-dateutil pytz tzdata urllib3 certifi charset-normalizer
    PYTHONPATH=/tmp/lf_pkgs bench/.venv/bin/python tests/dataset/template_reference.py

(--no-deps because LLaMA-Factory pins older transformers/torchaudio; only its text paths run here,
so torchaudio, which it imports for audio, is replaced by an empty module.)

Fixture layout (kept small: token sequences are stored once in "sequences" and referenced by
index; labels are stored as run lengths alternating masked (-100) / copied-from-input_ids, first
run masked):
  examples:  {dataset, index, prompt, response, system, tools} as LLaMA-Factory aligned them
  counts:    {dataset: {records, empty}} over whole datasets
  supervised: groups of one tokenizer, template and option set, with [example, sequence, label runs]
              per example ([example, "error"] where LLaMA-Factory raises)
  pretrain/pairwise: the cases with their options and expected ids
"""
import argparse
import copy
import datetime as _datetime
import json
import os
import sys
import types
from pathlib import Path

os.environ.setdefault("DISABLE_VERSION_CHECK", "1")
os.environ.setdefault("HF_DATASETS_CACHE", "/tmp/fab_lf_datasets_cache")

import transformers  # noqa: E402  (imported before the torchaudio stub so it sees no torchaudio)
import transformers.image_utils  # noqa: E402,F401
import transformers.video_utils  # noqa: E402,F401

sys.modules.setdefault("torchaudio", types.ModuleType("torchaudio"))

import llamafactory.data.tool_utils as lf_tool_utils  # noqa: E402
from llamafactory.data import template as lf_template  # noqa: E402
from llamafactory.data.loader import _load_single_dataset  # noqa: E402
from llamafactory.data.parser import get_dataset_list  # noqa: E402
from llamafactory.data.processor import (  # noqa: E402
    PairwiseDatasetProcessor,
    PretrainDatasetProcessor,
    SupervisedDatasetProcessor,
)

IGNORE = -100
TOOL_DATE = "26 Jul 2024"


class _FixedDatetime(_datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(2024, 7, 26)


lf_tool_utils.datetime = _FixedDatetime  # llama3's tool prompt embeds today's date

REPO = Path(__file__).resolve().parents[2]
FIXTURE_DATA = REPO / "tests/dataset/fixtures/lf_data"

# (dataset, dataset_dir key, record indices): short records, tools with enums/items, multi-turn.
SFT_SAMPLES = [
    ("alpaca_en_demo", "shared", [554, 362]),
    ("alpaca_zh_demo", "shared", [608]),
    ("identity", "shared", [0]),
    ("glaive_toolcall_en_demo", "shared", [198, 290]),
    ("tool_edge", "fixture", [0, 1, 2]),
    ("sharegpt_think", "fixture", [0, 1]),
    ("alpaca_history", "fixture", [0, 1, 2]),
    ("role_content", "fixture", [0, 1]),
]
COUNT_DATASETS = [
    ("alpaca_en_demo", "shared"), ("alpaca_zh_demo", "shared"), ("identity", "shared"),
    ("glaive_toolcall_en_demo", "shared"), ("dpo_en_demo", "shared"), ("kto_en_demo", "shared"),
    ("c4_demo", "shared"), ("wiki_demo", "shared"), ("sharegpt_think", "fixture"),
    ("alpaca_history", "fixture"), ("role_content", "fixture"), ("alpaca_pairs", "fixture"),
    ("plain_text", "fixture"), ("tool_edge", "fixture"),
]
# Templates per tokenizer. chatml needs <|im_start|>/<|im_end|>, which Llama-3 lacks.
TEMPLATES = {
    "qwen3": ["default", "empty", "alpaca", "chatml", "qwen", "qwen3", "qwen3_nothink", "llama2", "mistral"],
    "llama3": ["llama3", "default", "alpaca", "llama2", "mistral", "empty"],
}
# (train_on_prompt, mask_history, cutoff_len, extra template options)
SFT_OPTIONS = [
    (False, False, 4096, {}),
    (True, False, 4096, {}),
    (False, True, 4096, {}),
    (False, False, 24, {}),
    (False, True, 40, {}),
]
QWEN3_EXTRA = [
    (False, False, 4096, {"enable_thinking": False}),
    (False, True, 4096, {"enable_thinking": None}),
    (False, False, 4096, {"enable_thinking": None}),
    (False, False, 4096, {"preserve_thinking": True}),
    (False, True, 4096, {"preserve_thinking": True}),
]
DEFAULT_SYSTEM_CASE = (False, False, 4096, {"default_system": "Custom default system."})


class Pool:
    """Distinct token sequences, stored once."""

    def __init__(self):
        self.sequences, self.index = [], {}

    def add(self, ids):
        key = tuple(ids)
        if key not in self.index:
            self.index[key] = len(self.sequences)
            self.sequences.append(list(ids))
        return self.index[key]


def label_runs(input_ids, labels):
    """Run lengths alternating masked / copied, starting with masked (possibly 0)."""
    assert len(input_ids) == len(labels)
    runs, masked, n = [], True, 0
    for x, y in zip(input_ids, labels):
        is_masked = y == IGNORE
        assert is_masked or x == y, "label neither -100 nor the input id"
        if is_masked != masked:
            runs.append(n)
            masked, n = is_masked, 0
        n += 1
    runs.append(n)
    return runs


def data_args(**kw):
    base = dict(
        template=None, train_on_prompt=False, mask_history=False, cutoff_len=4096, tool_format=None,
        default_system=None, enable_thinking=True, preserve_thinking=False, packing=False,
        dataset_dir=None, media_dir=None, streaming=False, preprocessing_num_workers=None,
        max_samples=None, overwrite_cache=True,
    )
    base.update(kw)
    return types.SimpleNamespace(**base)


_TOKENIZERS = {}


def fresh_tokenizer(shared, name):
    if name not in _TOKENIZERS:
        _TOKENIZERS[name] = transformers.AutoTokenizer.from_pretrained(str(shared / "data/tokenizers" / name))
    return copy.deepcopy(_TOKENIZERS[name])


def make_template(shared, tok_name, template_name, args):
    """A fresh tokenizer and template: get_template_and_fix_tokenizer mutates both."""
    saved = lf_template.TEMPLATES[template_name]
    lf_template.TEMPLATES[template_name] = copy.deepcopy(saved)
    try:
        tokenizer = fresh_tokenizer(shared, tok_name)
        template = lf_template.get_template_and_fix_tokenizer(tokenizer, args)
    finally:
        lf_template.TEMPLATES[template_name] = saved
    return tokenizer, template


def load_aligned(dataset, dataset_dir):
    args = data_args(dataset_dir=str(dataset_dir), media_dir=str(dataset_dir))
    attr = get_dataset_list([dataset], str(dataset_dir))[0]
    model_args = types.SimpleNamespace(cache_dir=None, hf_hub_token=None, ms_hub_token=None, om_hub_token=None)
    training_args = types.SimpleNamespace(local_process_index=0, seed=42, dataloader_num_workers=0)
    return _load_single_dataset(attr, model_args, args, training_args)


def as_example(row):
    return {
        "prompt": row["_prompt"], "response": row["_response"],
        "system": row["_system"] or "", "tools": row["_tools"] or "",
    }


def collect_examples(shared, dirs):
    examples, counts = [], {}
    for name, where in COUNT_DATASETS:
        rows = load_aligned(name, dirs[where])
        empty = sum(1 for r in rows if not r["_prompt"] and not r["_response"])
        counts[name] = {"records": len(rows), "empty": empty, "dir": where}
    for name, where, indices in SFT_SAMPLES:
        rows = load_aligned(name, dirs[where])
        for i in indices:
            examples.append({"dataset": name, "dir": where, "index": i, **as_example(rows[i])})
    return examples, counts


def encode_supervised(processor, ex):
    batch = {"_prompt": [ex["prompt"]], "_response": [ex["response"]], "_system": [ex["system"]],
             "_tools": [ex["tools"]], "_images": [None], "_videos": [None], "_audios": [None]}
    try:
        out = processor.preprocess_dataset(batch)
    except (RuntimeError, ValueError, KeyError) as err:  # e.g. a thought block llama2's formatter rejects
        return {"error": str(err)[:80]}
    if not out["input_ids"]:
        return {"dropped": True}
    return {"ids": out["input_ids"][0], "labels": out["labels"][0]}


def supervised_cases(shared, examples, pool):
    """Groups of {tokenizer, template, options, results: [[example, sequence, label runs] | [example, "error"]]}."""
    groups = []
    for tok_name, names in TEMPLATES.items():
        for template_name in names:
            options = list(SFT_OPTIONS)
            if template_name == "qwen3":
                options += QWEN3_EXTRA
            if template_name in ("qwen", "llama2"):
                options.append(DEFAULT_SYSTEM_CASE)
            for train_on_prompt, mask_history, cutoff_len, extra in options:
                args = data_args(template=template_name, train_on_prompt=train_on_prompt,
                                 mask_history=mask_history, cutoff_len=cutoff_len, **extra)
                tokenizer, template = make_template(shared, tok_name, template_name, args)
                processor = SupervisedDatasetProcessor(template=template, tokenizer=tokenizer, processor=None,
                                                       data_args=args)
                results = []
                for example_index, ex in enumerate(examples):
                    if cutoff_len < 4096 and len(ex["prompt"]) < 3:
                        continue  # small cutoffs matter for multi-turn samples
                    out = encode_supervised(processor, ex)
                    if "ids" in out:
                        results.append([example_index, pool.add(out["ids"]), label_runs(out["ids"], out["labels"])])
                    else:
                        results.append([example_index, "error" if "error" in out else "dropped"])
                groups.append({"tokenizer": tok_name, "template": template_name, "train_on_prompt": train_on_prompt,
                               "mask_history": mask_history, "cutoff_len": cutoff_len, **extra, "results": results})
    return groups


def pretrain_cases(shared, dirs, pool):
    c4 = load_aligned("c4_demo", dirs["shared"]).select(range(3))
    text = load_aligned("plain_text", dirs["fixture"])
    cases = []
    for tok_name, template_name, dataset, rows, packing, cutoff_len in [
        ("qwen3", "qwen3", "c4_demo", c4, True, 128),
        ("qwen3", "default", "c4_demo", c4, True, 100),
        ("llama3", "llama3", "c4_demo", c4, True, 128),
        ("llama3", "default", "plain_text", text, False, 8),
        ("qwen3", "qwen", "plain_text", text, False, 6),
    ]:
        args = data_args(template=template_name, cutoff_len=cutoff_len, packing=packing)
        tokenizer, template = make_template(shared, tok_name, template_name, args)
        processor = PretrainDatasetProcessor(template=template, tokenizer=tokenizer, processor=None, data_args=args)
        out = processor.preprocess_dataset({"_prompt": rows["_prompt"]})
        cases.append({"tokenizer": tok_name, "template": template_name, "dataset": dataset,
                      "dir": "shared" if dataset == "c4_demo" else "fixture", "max_samples": len(rows),
                      "packing": packing, "cutoff_len": cutoff_len,
                      "samples": [pool.add(ids) for ids in out["input_ids"]]})
    return cases


def pairwise_cases(shared, dirs, pool):
    cases = []
    sets = [("dpo_en_demo", "shared", [134, 80]), ("alpaca_pairs", "fixture", [0, 1])]
    for tok_name, template_name in [("qwen3", "qwen3"), ("qwen3", "qwen3_nothink"), ("llama3", "llama3"),
                                    ("llama3", "default")]:
        for cutoff_len in (4096, 48):
            args = data_args(template=template_name, cutoff_len=cutoff_len)
            tokenizer, template = make_template(shared, tok_name, template_name, args)
            processor = PairwiseDatasetProcessor(template=template, tokenizer=tokenizer, processor=None,
                                                 data_args=args)
            for dataset, where, indices in sets:
                rows = load_aligned(dataset, dirs[where])
                for i in indices:
                    r = rows[i]
                    out = processor.preprocess_dataset({k: [r[k]] for k in r})
                    cases.append({
                        "tokenizer": tok_name, "template": template_name, "dataset": dataset, "dir": where,
                        "index": i, "cutoff_len": cutoff_len,
                        "chosen": pool.add(out["chosen_input_ids"][0]),
                        "chosen_label_runs": label_runs(out["chosen_input_ids"][0], out["chosen_labels"][0]),
                        "rejected": pool.add(out["rejected_input_ids"][0]),
                        "rejected_label_runs": label_runs(out["rejected_input_ids"][0], out["rejected_labels"][0]),
                    })
    return cases


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shared", default=str(REPO.parent / "shared"))
    parser.add_argument("--out", default=str(REPO / "tests/dataset/fixtures/template_parity.json"))
    args = parser.parse_args()
    shared = Path(args.shared)
    dirs = {"shared": shared / "data/llamafactory", "fixture": FIXTURE_DATA}

    import llamafactory

    pool = Pool()
    examples, counts = collect_examples(shared, dirs)
    fixture = {
        "generator": "tests/dataset/template_reference.py",
        "llamafactory": llamafactory.__version__,
        "transformers": transformers.__version__,
        "tool_date": TOOL_DATE,
        "examples": examples,
        "counts": counts,
        "supervised": supervised_cases(shared, examples, pool),
        "pretrain": pretrain_cases(shared, dirs, pool),
        "pairwise": pairwise_cases(shared, dirs, pool),
    }
    fixture["sequences"] = pool.sequences
    text = json.dumps(fixture, ensure_ascii=False, separators=(",", ":"))
    Path(args.out).write_text(text + "\n", encoding="utf-8")
    n_sft = sum(len(g["results"]) for g in fixture["supervised"])
    print(f"wrote {args.out}: {len(text) // 1024} KiB, {n_sft} supervised, "
          f"{len(fixture['pretrain'])} pretrain, {len(fixture['pairwise'])} pairwise cases, "
          f"{len(pool.sequences)} distinct sequences")


if __name__ == "__main__":
    main()

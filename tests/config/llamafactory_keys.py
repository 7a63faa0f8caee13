#!/usr/bin/env python3
"""Writes tests/config/llamafactory_keys.txt: every field name of LLaMA-Factory's hparams dataclasses
(ModelArguments, DataArguments, FinetuningArguments, GeneratingArguments) and of
transformers.Seq2SeqTrainingArguments (LLaMA-Factory's TrainingArguments), one per line, sorted.
TrainConfig.EveryLlamaFactoryKeyIsKnown checks that each is a key of src/config/config_keys.h.

Run by hand with a venv that has llamafactory installed:
  /path/to/venv/bin/python tests/config/llamafactory_keys.py > tests/config/llamafactory_keys.txt
"""
import dataclasses
import importlib.metadata as md

from llamafactory.hparams import DataArguments, FinetuningArguments, GeneratingArguments, ModelArguments
from llamafactory.hparams import TrainingArguments  # transformers.Seq2SeqTrainingArguments + LLaMA-Factory's

names = set()
for cls in (ModelArguments, DataArguments, FinetuningArguments, GeneratingArguments, TrainingArguments):
    names.update(f.name for f in dataclasses.fields(cls) if f.init)
print(f"# llamafactory {md.version('llamafactory')}, transformers {md.version('transformers')}: "
      f"{len(names)} keys, written by tests/config/llamafactory_keys.py")
for name in sorted(names):
    print(name)

#!/usr/bin/env bash
# Prepares the PyTorch peer of `make bench`: a virtual environment in bench/.venv
# (git-ignored) holding a current PyTorch and PEFT from PyPI.
# Idempotent and quiet: does nothing when bench/.venv already imports torch.
#   PYTHON=...          interpreter used to create the venv (default: python3 on PATH)
#   TORCH_PIP_ARGS=...  extra pip arguments, e.g. an --index-url for the CPU-only wheel
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
py="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  echo "setup_peer: creating $venv with $("$py" --version 2>&1)"
  "$py" -m venv "$venv"
fi

if ! "$venv/bin/python" -W ignore -c 'import torch' >/dev/null 2>&1; then
  echo "setup_peer: installing torch into $venv (PyPI; this can take 10+ minutes)"
  # shellcheck disable=SC2086
  "$venv/bin/python" -m pip install --quiet ${TORCH_PIP_ARGS:-} torch
  "$venv/bin/python" -W ignore -c 'import torch; print("setup_peer: torch", torch.__version__)'
fi

if ! "$venv/bin/python" -W ignore -c 'import peft' >/dev/null 2>&1; then
  echo "setup_peer: installing peft into $venv (PyPI; the LoRA rows' peer)"
  "$venv/bin/python" -m pip install --quiet peft
fi

# The MoE bench's and the reference scripts' peer is transformers' own modeling code, version 5 or later.
if ! "$venv/bin/python" -W ignore -c 'import sys, transformers; sys.exit(int(transformers.__version__.split(".")[0]) < 5)' >/dev/null 2>&1; then
  echo "setup_peer: installing transformers>=5 into $venv (PyPI; the MoE bench's peer)"
  "$venv/bin/python" -m pip install --quiet "transformers>=5"
fi

# The vision-language bench's peer: transformers' image processors (Pillow, and torchvision behind
# transformers 5's default one).
if ! "$venv/bin/python" -W ignore -c 'import PIL, torchvision' >/dev/null 2>&1; then
  echo "setup_peer: installing pillow and torchvision into $venv (PyPI; the vision-language bench's peer)"
  "$venv/bin/python" -m pip install --quiet pillow torchvision
fi

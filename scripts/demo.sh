#!/usr/bin/env bash
# `make demo`: trains a small byte-level Llama from scratch on built-in text.
set -euo pipefail
cd "$(dirname "$0")/.."
exec build/fabrica demo "$@"

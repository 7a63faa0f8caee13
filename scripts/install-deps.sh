#!/usr/bin/env bash
# Installs every Debian package that Fabrica's build, tests and benchmarks need.
# Idempotent: packages already present are skipped; uses sudo when not root.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  clang libclang-rt-14-dev  # fuzz targets (libFuzzer, sanitizers)
  libdnnl-dev            # oneDNN: CPU matmul (f32, bf16 on AMX)
  nlohmann-json3-dev     # config.json and safetensors headers
  libyaml-cpp-dev        # run.yaml configs
  libpcre2-dev libicu-dev  # tokenizers: pre-tokenisation regexes, Unicode normalisation
  libsentencepiece-dev   # SentencePiece tokenizer.model (Llama-2 style)
  libjpeg62-turbo-dev libpng-dev libwebp-dev  # images of vision-language datasets (src/image)
  openmpi-bin libopenmpi-dev  # data parallel: collectives, mpirun launch
  iproute2               # network namespaces of the multi-node test
  slurm-wlm munge        # the Slurm test starts its own slurmctld, slurmd and munged (none run as services)
  libgtest-dev           # unit tests
  python3 python3-torch  # numerical reference (Debian's system python3)
  python3-venv           # the benchmark's PyTorch peer lives in a venv
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

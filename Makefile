# Thin front over CMake. `make` builds build/fabrica (Release); `make test`, `make bench`,
# `make demo` install what they need first (scripts/install-deps.sh).
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: all build deps test bench demo clean fuzz

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release

build: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# Reference fixtures from PyTorch (Debian's python3-torch, system python3).
$(BUILD)/reference/ops.safetensors: tests/reference/make_reference.py tests/reference/safetensors_io.py
	/usr/bin/python3 tests/reference/make_reference.py $(BUILD)/reference

# Tokenizer parity fixture from Hugging Face `tokenizers` (PyPI, in build/pyref/.venv).
$(BUILD)/reference/tokenizer_parity.json: tests/data/tokenizer_parity.py tests/data/tokenizer_parity_texts.py
	python3 tests/data/tokenizer_parity.py $(BUILD)/reference

test: deps build $(BUILD)/reference/ops.safetensors $(BUILD)/reference/tokenizer_parity.json
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=10 >$(BUILD)/fuzz.log 2>&1 \
	  && echo "fuzz: safetensors header parser, 10 s, no failure" \
	  || (tail -30 $(BUILD)/fuzz.log; exit 1)

bench: deps build
	@bash bench/setup_peer.sh
	@bash bench/run_bench.sh

demo: deps build
	@bash scripts/demo.sh

clean:
	rm -rf $(BUILD)

# Fuzz targets for the parsers of untrusted files (clang + libFuzzer, ASan, UBSan).
FUZZ_SECONDS ?= 60
FUZZ_FLAGS = -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Isrc
$(BUILD)/fuzz_safetensors_header: fuzz/safetensors_header_fuzz.cpp src/io/safetensors_header.cpp src/io/safetensors.h
	@mkdir -p $(BUILD)
	clang++ $(FUZZ_FLAGS) fuzz/safetensors_header_fuzz.cpp src/io/safetensors_header.cpp -o $@

fuzz: deps $(BUILD)/fuzz_safetensors_header
	@mkdir -p $(BUILD)/fuzz-corpus/safetensors_header
	$(BUILD)/fuzz_safetensors_header -seed=1 -max_total_time=$(FUZZ_SECONDS) \
	  $(BUILD)/fuzz-corpus/safetensors_header fuzz/corpus/safetensors_header

# Thin front over CMake. `make` builds build/fabrica (Release); `make test`, `make bench`,
# `make demo` install what they need first (scripts/install-deps.sh).
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: all build deps test bench demo clean

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

test: deps build $(BUILD)/reference/ops.safetensors
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

bench: deps build
	@bash bench/setup_peer.sh
	@bash bench/run_bench.sh

demo: deps build
	@bash scripts/demo.sh

clean:
	rm -rf $(BUILD)

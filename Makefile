# Thin front over CMake. `make` builds build/fabrica and the test binaries (Release); `make test`,
# `make bench`, `make demo` install what they need first (scripts/install-deps.sh). `make demo`
# builds only the fabrica binary, not the test suite or the GPU test binaries.
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: all build fabrica deps test test-asan bench demo demo-rl clean fuzz test-gpu gpu-pack

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release

build: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# Only the `fabrica` target: what the demos need.
fabrica: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS) --target fabrica

# Reference fixtures from PyTorch (Debian's python3-torch, system python3).
$(BUILD)/reference/ops.safetensors: tests/reference/make_reference.py tests/reference/safetensors_io.py \
    tests/reference/make_lora_reference.py \
    tests/reference/rope_transformers.json
	/usr/bin/python3 tests/reference/make_reference.py $(BUILD)/reference
	/usr/bin/python3 tests/reference/make_lora_reference.py $(BUILD)/reference

# The preference stages' losses (DPO family, KTO, reward model) over 5 steps, same python3-torch.
$(BUILD)/reference/pref/reference.safetensors: tests/reference/make_pref_reference.py tests/reference/make_reference.py \
    tests/reference/safetensors_io.py
	/usr/bin/python3 tests/reference/make_pref_reference.py $(BUILD)/reference

# stage grpo's objective (verl's formulas) on a fixed batch of rollouts, same python3-torch.
$(BUILD)/reference/grpo/reference.safetensors: tests/reference/make_grpo_reference.py tests/reference/make_reference.py \
    tests/reference/safetensors_io.py
	/usr/bin/python3 tests/reference/make_grpo_reference.py $(BUILD)/reference

# stage ppo's critic side (verl's GAE, whitening, value loss) on a fixed batch, same python3-torch.
$(BUILD)/reference/ppo/reference.safetensors: tests/reference/make_ppo_reference.py tests/reference/make_reference.py \
    tests/reference/safetensors_io.py
	/usr/bin/python3 tests/reference/make_ppo_reference.py $(BUILD)/reference

# Tokenizer parity fixture from Hugging Face `tokenizers` (PyPI, in build/pyref/.venv).
$(BUILD)/reference/tokenizer_parity.json: tests/tokenizer/tokenizer_parity.py tests/tokenizer/tokenizer_parity_texts.py \
    tests/tokenizer/pyref.py tests/tokenizer/pyref_requirements.txt
	python3 tests/tokenizer/tokenizer_parity.py $(BUILD)/reference

# SentencePiece tokenizer.model trained with PyPI `sentencepiece` (build/pyref/.venv), and its ids.
$(BUILD)/reference/spm_parity.json: tests/tokenizer/spm_parity.py tests/tokenizer/tokenizer_parity_texts.py \
    tests/tokenizer/pyref.py tests/tokenizer/pyref_requirements.txt
	python3 tests/tokenizer/spm_parity.py $(BUILD)/reference

test: deps build $(BUILD)/reference/ops.safetensors $(BUILD)/reference/pref/reference.safetensors $(BUILD)/reference/grpo/reference.safetensors \
    $(BUILD)/reference/ppo/reference.safetensors $(BUILD)/reference/tokenizer_parity.json $(BUILD)/reference/spm_parity.json
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --output-junit ctest-results.xml
	@python3 tests/check_skips.py $(BUILD)/ctest-results.xml
	@python3 tests/tokenizer/bpe_trainer_parity.py --fabrica $(BUILD)/fabrica >$(BUILD)/bpe_parity.log 2>&1 \
	  && tail -1 $(BUILD)/bpe_parity.log || (cat $(BUILD)/bpe_parity.log; exit 1)
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=10 >$(BUILD)/fuzz.log 2>&1 \
	  && echo "fuzz: safetensors header, tokenizer.json / tokenizer.model + encode, dataset readers, image decoders: 10 s each, no failure" \
	  || (tail -40 $(BUILD)/fuzz.log; exit 1)

# The whole ctest suite built with AddressSanitizer (OpenMP, oneDNN and MPI are not instrumented
# but run under it), in build-asan/. Leak checking is off: OpenMPI and ICU keep allocations to exit.
ASAN_BUILD = build-asan
test-asan: deps $(BUILD)/reference/ops.safetensors $(BUILD)/reference/pref/reference.safetensors $(BUILD)/reference/grpo/reference.safetensors \
    $(BUILD)/reference/ppo/reference.safetensors $(BUILD)/reference/tokenizer_parity.json $(BUILD)/reference/spm_parity.json
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFAB_SANITIZE=address -DFAB_CUDA=OFF
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	rm -rf $(ASAN_BUILD)/reference && cp -r $(BUILD)/reference $(ASAN_BUILD)/reference
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 ctest --output-on-failure -j $(JOBS) \
	  --output-junit ctest-results.xml
	@python3 tests/check_skips.py $(ASAN_BUILD)/ctest-results.xml

# GPU tests: every CUDA kernel against the CPU kernel, and a short training run on the device.
# Without a GPU (or without CUDA in the build) they print a skip line (exit 77 is that skip).
test-gpu: build
	@if [ -x $(BUILD)/fabrica_gpu_tests ]; then rc=0; $(BUILD)/fabrica_gpu_tests || rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 77 ]; \
	else echo "test-gpu: skipped, this build has no CUDA backend (nvcc was not found)"; fi

# What scripts/gpu_check.sh needs on the GPU machine, in build-gpu/ (carried by the device tool).
GPU_PACK = build-gpu
gpu-pack: build
	@test -x $(BUILD)/fabrica_gpu_tests || { echo "gpu-pack: this build has no CUDA backend"; exit 1; }
	rm -rf $(GPU_PACK) && mkdir -p $(GPU_PACK)
	cp $(BUILD)/fabrica_gpu_tests $(BUILD)/fabrica_gpu_bench $(GPU_PACK)/
	strip $(GPU_PACK)/fabrica_gpu_tests $(GPU_PACK)/fabrica_gpu_bench
	cp -L $$(ldd $(BUILD)/fabrica_gpu_tests | awk '/libgomp/ {print $$3}') $(GPU_PACK)/
	cp -r /usr/src/googletest/googletest $(GPU_PACK)/googletest
	@# fabrica itself, with the libraries a bare GPU machine lacks (not glibc's, not NCCL: it has those)
	rm -rf $(GPU_PACK)/bin && mkdir -p $(GPU_PACK)/bin/lib
	cp $(BUILD)/fabrica $(GPU_PACK)/bin/ && strip $(GPU_PACK)/bin/fabrica
	for lib in $$(ldd $(BUILD)/fabrica | awk '$$3 ~ /^\// {print $$3}' | grep -v -E 'lib(c|m|dl|rt|pthread)\.so|ld-linux|libnccl'); do \
	  cp -L $$lib $(GPU_PACK)/bin/lib/; done
	tar -cJf $(GPU_PACK)/fabrica-bin.tar.xz -C $(GPU_PACK)/bin . && rm -rf $(GPU_PACK)/bin
	@# the demo's task (tokenizer, config, data) for scripts/gpu_train_check.sh
	$(BUILD)/fabrica demo --steps 1 --workdir $(GPU_PACK)/train >/dev/null && rm -rf $(GPU_PACK)/train/out $(GPU_PACK)/train/cache
	@du -sh $(GPU_PACK); echo "device run: command \"BENCH=1 bash scripts/gpu_check.sh\", carry [\"$(GPU_PACK)\"], timeout_s 480"

bench: deps build
	@bash bench/setup_peer.sh
	@bash bench/run_bench.sh
	@bash bench/moe_bench.sh
	@bash bench/vlm_bench.sh
	@bench/.venv/bin/python bench/grpo_speed_vs_trl.py --work build/grpo_speed_vs_trl
	@bench/.venv/bin/python bench/grpo_speed_vs_trl.py --work build/grpo_speed_vs_trl_512 --hidden 512 --layers 4
	@bash bench/rollout_bench.sh
	@if [ -n "$$LLAMAFACTORY_VENV" ]; then bash bench/llamafactory_side_by_side.sh; fi

demo: deps fabrica
	@bash scripts/demo.sh

# Part-way SFT on the same task, then GRPO with the exact-match reward: accuracy before and after.
# STAGE=ppo: the same demonstration with stage ppo (a critic, GAE) in place of grpo.
STAGE ?= grpo
demo-rl: deps fabrica
	@bash scripts/demo.sh --rl --stage $(STAGE)

clean:
	rm -rf $(BUILD)

# Fuzz targets for the parsers of untrusted files (clang + libFuzzer, ASan, UBSan): the
# safetensors header, tokenizer.json loading and encoding, SentencePiece tokenizer.model loading,
# the dataset readers, and the image decoders (JPEG, PNG, WebP; fuzz/corpus/image seeds them).
FUZZ_SECONDS ?= 60
FUZZ_FLAGS = -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Isrc
TOKENIZER_SOURCES = $(addprefix src/tokenizer/,tokenizer.cpp tokenizer_json.cpp tokenizer_config.cpp hf_tokenizer.cpp \
  spm_tokenizer.cpp bpe.cpp pretokenizer.cpp regex.cpp normalizer.cpp added_tokens.cpp decoder.cpp post_processor.cpp \
  byte_level.cpp unicode.cpp unicode_tables.cpp)
DATASET_SOURCES = $(wildcard src/dataset/dataset*.cpp)
SHARED ?= ../shared

$(BUILD)/fuzz_safetensors_header: fuzz/safetensors_header_fuzz.cpp src/io/safetensors_header.cpp src/io/safetensors.h
	@mkdir -p $(BUILD)
	clang++ $(FUZZ_FLAGS) $(filter %.cpp,$^) -o $@

$(BUILD)/fuzz_tokenizer: fuzz/tokenizer_fuzz.cpp $(TOKENIZER_SOURCES)
	@mkdir -p $(BUILD)
	clang++ $(FUZZ_FLAGS) $(filter %.cpp,$^) $$(pkg-config --cflags --libs libpcre2-8 icu-uc sentencepiece) -o $@

$(BUILD)/fuzz_spm_model: fuzz/spm_model_fuzz.cpp $(TOKENIZER_SOURCES)
	@mkdir -p $(BUILD)
	clang++ $(FUZZ_FLAGS) $(filter %.cpp,$^) $$(pkg-config --cflags --libs libpcre2-8 icu-uc sentencepiece) -o $@

$(BUILD)/fuzz_dataset: fuzz/dataset_fuzz.cpp $(DATASET_SOURCES)
	@mkdir -p $(BUILD)
	clang++ $(FUZZ_FLAGS) $(filter %.cpp,$^) -o $@

$(BUILD)/fuzz_image: fuzz/image_fuzz.cpp src/image/image_decode.cpp src/image/exif.cpp
	@mkdir -p $(BUILD)
	clang++ $(FUZZ_FLAGS) $(filter %.cpp,$^) $$(pkg-config --cflags --libs libjpeg libpng libwebp) -o $@

FUZZ_TARGETS = safetensors_header tokenizer spm_model dataset image
fuzz: deps $(addprefix $(BUILD)/fuzz_,$(FUZZ_TARGETS))
	@mkdir -p $(BUILD)/fuzz-corpus/spm_model
	@[ ! -f $(BUILD)/reference/spm/tokenizer.model ] || cp $(BUILD)/reference/spm/tokenizer.model $(BUILD)/fuzz-corpus/spm_model/
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(BUILD)/fuzz-corpus/$$t; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	  FAB_FUZZ_TOKENIZER=$$( [ -f $(SHARED)/data/tokenizers/qwen3/tokenizer.json ] && echo $(SHARED)/data/tokenizers/qwen3 ) \
	  $(BUILD)/fuzz_$$t -seed=1 -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 \
	    $(BUILD)/fuzz-corpus/$$t fuzz/corpus/$$t 2>$(BUILD)/fuzz-$$t.log || { tail -40 $(BUILD)/fuzz-$$t.log; exit 1; }; \
	done

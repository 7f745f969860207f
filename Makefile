# llmkern — the two commands a new user needs (see README):
#   make run    install what is missing, build, and run the main job
#   make test   the same set-up, the whole suite, then the suite again under ASan + UBSan
#               (and, with clang installed, each fuzz target of tests/fuzz for 20 s)
#   make fuzz   each fuzz target for FUZZ_SECONDS (600)
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan

.PHONY: all deps build run test test-asan fuzz clean
FUZZ_SECONDS ?= 600

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j $(JOBS)

# The main job: what each op binds for the tiny Qwen3-MoE, then its training on the
# embedded corpus (config.json, model.safetensors, loss.csv, loss.png in out/tiny-moe).
run: build
	./$(BUILD)/llmkern explain --config configs/tiny-moe.yaml
	./$(BUILD)/llmkern train --config configs/tiny-moe.yaml --out out/tiny-moe

# The Python tests (ctest python_tests) need torch, transformers and pytest: installed into
# $(BUILD)/venv from PyPI when no python3 has them (python/install-deps.sh; bench/NOTES.md).
test: build
	@bash python/install-deps.sh $(BUILD)/venv
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
	$(MAKE) test-asan
	@if command -v clang >/dev/null; then FUZZ_SEED=1 bash scripts/fuzz.sh 20; else echo "fuzz: clang not installed, the 20 s fuzz runs skipped"; fi

test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLLMKERN_SANITIZE=ON
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)

# Each libFuzzer target of tests/fuzz for FUZZ_SECONDS (600) with clang: scripts/fuzz.sh.
fuzz: deps
	bash scripts/fuzz.sh $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) build-fuzz

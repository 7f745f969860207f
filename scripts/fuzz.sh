#!/usr/bin/env bash
# fuzz.sh — builds the libFuzzer targets of tests/fuzz with clang (ASan + UBSan +
# libFuzzer, in build-fuzz/) and runs each for SECONDS (default 600), starting from its
# seed corpus tests/fuzz/corpus/<target>/ (copied: the seeds in the tree stay as they
# are; what a run adds stays in build-fuzz/corpus/). One line per target: executions,
# coverage (libFuzzer's cov: edges and ft: features), corpus size; a crash stops with
# its reproducer in build-fuzz/crashes/. `make fuzz` runs 600 s each; `make test` 20 s
# each when clang is installed, with FUZZ_SEED=1 (the same mutations every run, so the
# suite does not turn red at random; 0, the default, draws a seed).
# Run: [FUZZ_SEED=N] bash scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
secs=${1:-600}; shift || true
src=$(cd "$(dirname "$0")/.." && pwd)
dir=${FUZZ_BUILD:-$src/build-fuzz}
jobs=${JOBS:-$(nproc)}
command -v clang >/dev/null || { echo "fuzz: clang not found (apt-get install clang)"; exit 1; }
mkdir -p "$dir"
CC=clang cmake -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLLMKERN_SANITIZE=ON -DLLMKERN_FUZZ=ON \
  -DLLMKERN_CUDA=OFF >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; exit 1; }
cmake --build "$dir" --target fuzz_targets -j "$jobs" >"$dir/build.log" 2>&1 || { tail -30 "$dir/build.log"; exit 1; }
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_yaml fuzz_config_json fuzz_safetensors fuzz_data fuzz_block_mask fuzz_index)
mkdir -p "$dir/crashes"
# a crash's input: add it to tests/fuzz/corpus/<target>/ and replay it in an ordinary test
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 UBSAN_OPTIONS=print_stacktrace=1 OMP_NUM_THREADS=1
status=0
for t in "${targets[@]}"; do
  corpus="$dir/corpus/$t"; mkdir -p "$corpus"
  [ -d "$src/tests/fuzz/corpus/$t" ] && cp -n "$src/tests/fuzz/corpus/$t"/* "$corpus"/ 2>/dev/null || true
  dict=(); [ -f "$src/tests/fuzz/$t.dict" ] && dict=(-dict="$src/tests/fuzz/$t.dict")
  log="$dir/$t.log"
  if "$dir/$t" "$corpus" "${dict[@]}" -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -max_len=65536 \
       -print_final_stats=1 -seed="${FUZZ_SEED:-0}" -artifact_prefix="$dir/crashes/$t-" >"$log" 2>&1; then r=ok; else r=FAILED; status=1; fi
  done_line=$(grep -a 'DONE' "$log" | tail -1 || true)
  execs=$(grep -a 'stat::number_of_executed_units' "$log" | awk '{print $2}' || true)
  echo "fuzz: $t: $r, ${secs} s, ${execs:-?} executions, ${done_line:-$(tail -1 "$log")}, corpus $(ls "$corpus" | wc -l) inputs"
  [ $r = ok ] || grep -a -A15 'ERROR\|==ERROR\|runtime error\|unexpected status' "$log" | head -40
done
exit $status

#!/usr/bin/env bash
# cli_exports.sh — libllmkern.so exports its API and nothing else (issue 21): every
# dynamic symbol it defines is declared LK_API in include/llmkern/*.h (or LK_INTERNAL_API
# in src/, for bench/peers_shim.c), every LK_API name the library defines is exported, the
# lk_* names python/llmkern and bench/*.py look up through ctypes are exported when the
# library defines them, and so is whatever libllmkern_peers_shim.so (CUDA builds) needs.
# Run: bash tests/cli_exports.sh build/llmkern .   (the .so and the archive beside the CLI)
set -u
bin=$1; src=$2
dir=$(dirname "$bin")
so=$dir/libllmkern.so; archive=$dir/libllmkern_internal.a
command -v nm >/dev/null || { echo "cli_exports: nm not found"; exit 1; }
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# names starting with __ are the toolchain's (the sanitizers' __odr_asan.* indicators)
nm -D --defined-only "$so" | awk '{print $3}' | sed 's/@.*//' | grep -v '^__' | sort -u >"$tmp/exported"
nm --defined-only "$archive" 2>/dev/null | awk 'NF == 3 && $2 ~ /^[TDRB]$/ {print $3}' | sort -u >"$tmp/defined"
{ grep -h '^LK_API' "$src"/include/llmkern/*.h
  grep -rh '^LK_INTERNAL_API' "$src"/src --include='*.h'; } |
  grep -oE '\b(lk|ce)_[A-Za-z0-9_]+[[:space:]]*[(;[]' | grep -oE '^[A-Za-z0-9_]+' | sort -u >"$tmp/declared"
echo "cli_exports: $(wc -l <"$tmp/exported") symbols exported, $(wc -l <"$tmp/declared") declared for export," \
     "$(wc -l <"$tmp/defined") defined in the library"

extra=$(comm -23 "$tmp/exported" "$tmp/declared")
[ -z "$extra" ] || fail "exported but not declared LK_API: $(echo $extra | head -c 600)"
missing=$(comm -12 "$tmp/declared" "$tmp/defined" | comm -23 - "$tmp/exported")
[ -z "$missing" ] || fail "declared LK_API and defined, but hidden: $(echo $missing | head -c 600)"
grep -q '^ce_' "$tmp/exported" && fail "internal ce_* symbols exported"

grep -ohE '\blk_[a-z0-9_]+' "$src"/python/llmkern/*.py "$src"/bench/*.py 2>/dev/null | sort -u >"$tmp/python"
py_missing=$(comm -12 "$tmp/python" "$tmp/defined" | comm -23 - "$tmp/exported")
[ -z "$py_missing" ] || fail "called from Python through ctypes but hidden: $py_missing"
if [ -f "$dir/libllmkern_peers_shim.so" ]; then
  nm -D --undefined-only "$dir/libllmkern_peers_shim.so" | awk '{print $2}' | sed 's/@.*//' |
    grep -E '^(lk|ce)_' | sort -u >"$tmp/shim"
  shim_missing=$(comm -23 "$tmp/shim" "$tmp/exported")
  [ -z "$shim_missing" ] || fail "bench/peers_shim.c needs these, hidden: $shim_missing"
  echo "cli_exports: the peers shim's $(wc -l <"$tmp/shim") lk_* imports are exported"
fi
[ $fails -eq 0 ] && echo "cli_exports: ok"
exit $((fails > 0))

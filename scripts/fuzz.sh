#!/usr/bin/env bash
# Builds the libFuzzer targets of the model file readers (clang, ASan + UBSan) and runs each for a bounded
# number of iterations from the committed seed corpus; any crash, leak, out-of-bounds read or allocation
# over 512 MiB fails. FUZZ_RUNS sets the iterations (default 20000).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${FUZZ_RUNS:-20000}
cmake -S tests/fuzz -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for target in gguf safetensors; do
  mkdir -p "$work/$target"
  echo "fuzz_$target: $runs runs from tests/fuzz/corpus/$target"
  rc=0
  # Reproducers of crashes go to the temporary folder, never into the tree.
  build-fuzz/fuzz_$target -artifact_prefix="$work/$target-" -runs="$runs" -max_len=16384 -malloc_limit_mb=512 -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 "$work/$target" "tests/fuzz/corpus/$target" >"$work/$target.log" 2>&1 || rc=$?
  if ((rc != 0)); then
    tail -40 "$work/$target.log"
    echo "fuzz_$target FAILED (exit $rc)"
    exit 1
  fi
  grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units)" "$work/$target.log"
done
echo "fuzz: clean"

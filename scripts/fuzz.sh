#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan; tests/fuzz) and runs each for a bounded time from its committed
# seed corpus in tests/fuzz/corpus/<name>; any crash, leak, out-of-bounds read, undefined behaviour, timeout or
# allocation over 512 MiB fails. A crash input found is committed into that corpus, so every later run replays it.
# FUZZ_SECONDS sets each target's time (default 45); FUZZ_TARGETS the names (default all).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-45}
targets=(${FUZZ_TARGETS:-gguf safetensors http_request openai_request grpc_request chat_template})
flags="-fsanitize=address,undefined -fsanitize=fuzzer-no-link -fno-sanitize-recover=all -fno-omit-frame-pointer -O1 -g"
cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
  -DINFERD_CUDA=OFF -DINFERD_BUILD_TESTS=OFF -DINFERD_FUZZ=ON -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build build-fuzz --target "${targets[@]/#/fuzz_}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for target in "${targets[@]}"; do
  mkdir -p "$work/$target"
  echo "fuzz_$target: ${seconds} s from tests/fuzz/corpus/$target"
  rc=0
  # New inputs and reproducers go to the temporary folder, never into the tree.
  build-fuzz/tests/fuzz/fuzz_$target -artifact_prefix="$work/$target-" -max_total_time="$seconds" -max_len=65536 \
    -malloc_limit_mb=512 -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    "$work/$target" "tests/fuzz/corpus/$target" >"$work/$target.log" 2>&1 || rc=$?
  if ((rc != 0)); then
    tail -40 "$work/$target.log"
    for crash in "$work/$target"-*; do
      [[ -e $crash ]] && echo "reproducer (base64): $(head -c 4096 "$crash" | base64 -w0)"
    done
    echo "fuzz_$target FAILED (exit $rc)"
    exit 1
  fi
  grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::new_units_added)" "$work/$target.log"
done
echo "fuzz: clean"

#!/usr/bin/env bash
# Builds with AddressSanitizer + UndefinedBehaviorSanitizer (leak checks on) and runs the CPU tests,
# the black-box server tests included. Any report fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DINFERD_CUDA=OFF -DINFERD_FUZZ_TEST=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
cmake --build build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
  ctest --test-dir build-asan --output-on-failure --timeout 900

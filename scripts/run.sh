#!/usr/bin/env bash
# Sets everything up, builds the server and starts it on configs/default.yaml (extra args go to inferd).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build --target inferd
exec build/server/inferd --config configs/default.yaml "$@"

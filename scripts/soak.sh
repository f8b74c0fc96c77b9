#!/usr/bin/env bash
# The attack battery (tests/adversarial) again and again against fresh servers for SOAK_MINUTES (default 5),
# in a shuffled order each round; stops at the first failure. Needs a build (bash scripts/test.sh makes one).
#   SOAK_MINUTES=10 bash scripts/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${SOAK_MINUTES:-5}
end=$((SECONDS + minutes * 60))
round=0
export INFERD_BIN=${INFERD_BIN:-$PWD/build/server/inferd} INFERD_SOURCE_DIR=$PWD
while ((SECONDS < end)); do
  round=$((round + 1))
  tests=$(.venv/bin/python -m pytest -q -p no:cacheprovider --collect-only tests/adversarial | grep '::' | shuf)
  echo "soak round $round ($((end - SECONDS)) s left)"
  # shellcheck disable=SC2086
  .venv/bin/python -m pytest -q -p no:cacheprovider $tests | tail -n 1
done
echo "soak: $round rounds clean in $minutes min"

#!/usr/bin/env bash
# On the GPU machine: where a decode step's time goes, by kernel, from Nsight Compute's per-kernel durations
# (clocks left alone) over a window of decode steps: batch 1 (the latency run) or, with BATCH=N, the decode
# run at batch N. Needs the bundle and the 8B model that gpu_run.sh bench writes.
#   [BATCH=N] bash scripts/profile_decode.sh [MODEL_DIR]      writes $OUT/profile_decode.{csv,txt}
# BENCH_FLAGS adds inferd-bench flags (e.g. "--load-format dummy --quantization fp8" for a config-only model
# directory), KERNELS the window's length (a model of many layers needs more than 600 kernels for a step), NAME
# the output files' name (profile_decode), SKIP the kernels skipped first (start-up, warm-up, prefill).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
M=${1:-/tmp/llama3-8b-random}
BUNDLE=/tmp/inferd-bundle
export LD_LIBRARY_PATH="$BUNDLE/lib:${LD_LIBRARY_PATH:-}"
# Skip start-up, the warm-up request (and at batch N its prefill steps); then 600 kernels: about three decode
# steps (a graph's kernels count one by one).
# PREFILL=1: the prefill runs instead (one prompt's steps, run eagerly): only the kernels enqueued inside the
# steps' "forward and sample" NVTX range are counted, so SKIP counts from the first step's.
filter=()
if [[ -n "${PREFILL:-}" ]]; then
  what=(--sections prefill) skip=${SKIP:-0} filter=(--nvtx --nvtx-include "forward and sample/")
elif [[ -n "${BATCH:-}" ]]; then
  what=(--sections decode --batches "$BATCH") skip=${SKIP:-20000}
else
  what=(--sections latency) skip=${SKIP:-7000}
fi
# GRAPHS=1: only the kernels of decode steps replayed from CUDA graphs (skipping start-up and prefill whatever their
# length), SKIP counted among them.
if [[ -n "${GRAPHS:-}" ]]; then
  skip=${SKIP:-3000} filter=(--nvtx --nvtx-include "forward and sample (decode graph)/")
fi
name=${NAME:-profile_decode}
# shellcheck disable=SC2086  # BENCH_FLAGS is a list of flags
ncu --clock-control none --metrics gpu__time_duration.sum --csv "${filter[@]}" --launch-skip "$skip" \
  --launch-count "${KERNELS:-600}" \
  "$BUNDLE/bin/inferd-bench" --model "$M" ${BENCH_FLAGS:-} "${what[@]}" > "$OUT/$name.csv" 2> "$OUT/$name.err"
python3 - "$OUT/$name.csv" <<'PY' | tee "$OUT/$name.txt"
import csv, collections, re, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
rows = rows[next(i for i, r in enumerate(rows) if "Kernel Name" in r):]  # the benchmark's own output may precede it
head = rows[0]
name_i, val_i, unit_i = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
total, by = 0.0, collections.defaultdict(lambda: [0.0, 0])
for r in rows[1:]:
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[r[unit_i]]
    us = float(r[val_i].replace(",", "")) * scale
    words = [w for w in re.findall(r"([A-Za-z_]\w*)\s*[<(]", r[name_i]) if w not in ("anonymous", "unnamed", "void")]
    name = (words[0] if words else r[name_i])[:70]
    by[name][0] += us
    by[name][1] += 1
    total += us
print(f"{len(rows) - 1} kernels, {total:.0f} us in all")
for name, (us, n) in sorted(by.items(), key=lambda kv: -kv[1][0]):
    print(f"{100 * us / total:5.1f}%  {us:9.1f} us  {n:4d} x {us / n:7.2f} us  {name}")
PY

#!/usr/bin/env bash
# Runs on the GPU machine in one call: makes the GPU test models and their transformers references, runs the
# kernel, sampler and whole-model parity tests, the CPU tests, one serving run under compute-sanitizer, then
# writes the Llama-3-8B-shaped random model, benchmarks it, and checks the served model's live efficiency
# metrics against the benchmark's ratios. Results go to $OUT (or ./gpu-results).
#   bash scripts/make_gpu_bundle.sh   (here)   then on the device:   bash scripts/gpu_run.sh [tests|parity|fp8|fp8-bench|accuracy|smollm2|speculative|bench|efficiency|sweep|multiturn|copies|tp|families|ab|all]
# image: the CUDA image's own inferd from its root filesystem in a chroot, serving the 8B model (needs
#   `bash docker/build-images.sh cuda && bash docker/export-payload.sh` here instead of the bundle; root there).
# parity: the test models and references, then the precision and whole-model parity tests alone.
# fp8: the test models and references (the -fp8 ones too), then every GPU test (the fp8 kernels' and the fp8
#   parity cases among them), or those GPU_TESTS_FILTER names (a gtest filter).
# fp8-bench: the 8B model benchmarked in bf16, with engine.quantization fp8, and with fp8 and
#   engine.kv_cache_dtype fp8_e4m3 in one run (same ceilings).
# accuracy: the bundled SmolLM2 served in bf16 and in fp8: perplexity over the King James text
#   (scripts/fetch_eval_text.sh) and greedy agreement on the reference and chat prompts (tests/gpu/accuracy_check.py).
# sweep: the 8B model served by inferd on cuda, `inferd-bench serve` at a list of request rates (CSV in $OUT).
# copies: the host KV pool's copy stream under compute-sanitizer memcheck, then a swap storm (the scheduler soak on
#   the 8B model with a tiny device pool and swap space) whose steps and copy batches are drawn on one device clock
#   (tests/gpu/copy_timeline.py).
# multiturn: simulated users in conversation (`inferd-bench serve --multi-turn`) on the 8B model with a device
#   pool smaller than their histories, the prefix cache's host tier off and on; TTFT, throughput, hit rates per tier,
#   device idle share and the KV copy time hidden behind compute.
# tp: tensor parallelism. On one GPU: the sharded loader and the NCCL path with one rank (gpu_tests
#   TensorParallelOnCuda.*), and, where .bundle/base.tar.xz holds the bundle of the commit before, the 8B model at
#   tensor_parallel_size 1 (and 2, with 2 GPUs; TP_AB_SIZES narrows; TP_AB_QUANTIZATIONS="none fp8" adds fp8)
#   benchmarked by both bundles in turn (A/B);
#   TP_PARTS (parity, bench, either, both or none) picks what follows, TP_SIZES (default "2 4 8") the parity suite's
#   sizes (one size a call fits the device tool's 10 minutes). With 2 or more GPUs:
#   the test models and their references, the parity suite at tensor_parallel_size 2, 4 and 8 (as many as there
#   are GPUs: it fails when it has nothing to compare), the 8B shape at 1, 2, 4 and 8 (TP_QUANTIZATIONS="none fp8"), and the
#   Llama-3-70B shape at 2, 4 and 8 (TP70_QUANTIZATION), both from weights made on the GPUs (model.load_format dummy).
# smollm2: the bundled SmolLM2 served on cuda through the SmolLM2 suites (structured output: the JSON-schema suite,
#   regex, EBNF and choices; tools; chat), driven by the openai SDK and checked with jsonschema (both must be
#   importable there: carry their wheels). Needs models/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/setup.sh).
# speculative: speculative decoding on cuda. The bundled SmolLM2 (real weights; models/SmolLM2-135M-Instruct.Q4_1.gguf)
#   through `inferd-bench speculative` on tools/spec_prompts.json's workloads (copy-heavy: quotes, edits, an agent's
#   transcript; ordinary chat) at batch 1 and 64 (SPEC_BATCHES), without speculation and with n-gram and suffix
#   drafts, with the config's defaults and with every step drafting (bf16), and in fp16 to compare tokens (that run
#   fails where speculation changed a token a top-1 margin of 0.1 or more decided); then the Llama-3-8B shape from weights made on the GPU: the device time of
#   a step checking 4 drafts at batch 1 against a plain decode step. SPEC_RUNS (default "default forced fp16") and
#   SPEC_VERIFY=0 narrow it; SPEC_REPEATS (default 3) rounds of the bf16 runs.
# families: the Qwen3-8B shape beside the Llama-3-8B shape, both from weights made on the GPU (model.load_format
#   dummy), bf16 and fp8, decode at 1, 64 and 128 rows and prefill (the model layer's per-head norms at full size);
#   Phi-3.5-mini's shape (heads of 96, run padded to 128; FAMILIES_PHI3=0 leaves it out); then Gemma 3 4B's shape
#   decoding at 32k context with its sliding windows and with every layer global; and `inferd plan` against the
#   Phi-3, Qwen3 and Gemma runs' real plans; Qwen3-30B-A3B's shape in bf16 and fp8 (a mixture of experts;
#   FAMILIES_MOE=0 leaves it out, FAMILIES_MOE_SECTIONS/_QUANTIZATIONS/_BATCHES narrow it) and Mixtral-8x7B's in fp8
#   (FAMILIES_MIXTRAL=0 leaves it out). FAMILIES_SECTIONS, FAMILIES_QUANTIZATIONS, FAMILIES_GEMMA and
#   FAMILIES_GEMMA_SECTIONS narrow it (e.g. latency, none, windows, latency: the plans alone;
#   FAMILIES_DENSE=0 leaves the 8B shapes out).
# ab: the build before (.bundle/base.tar.xz, its bin/inferd-bench) against this one, in turn, on the Llama-3-8B
#   and Qwen3-8B shapes, or Qwen3-30B-A3B's (AB_MODELS=qwen3moe; AB_* narrow it; AB_TESTS runs those GPU tests
#   first); variants in .bundle/side-NAME.tar.xz run between them.
# frontends: the 8B model served once, `inferd-bench serve` through gRPC and through the OpenAI HTTP API (SSE) on
#   the same requests, alternating, at 1, 64 and 256 concurrent streams: the per-token cost of HTTP+SSE.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
BUNDLE=/tmp/inferd-bundle
[[ "$what" == image ]] || { rm -rf "$BUNDLE" && mkdir -p "$BUNDLE" && tar -C "$BUNDLE" -xJf .bundle/bundle.tar.xz; }
export LD_LIBRARY_PATH="$BUNDLE/lib:${LD_LIBRARY_PATH:-}"
export INFERD_SOURCE_DIR="$PWD"
export PYTHONUNBUFFERED=1
# A PTX-only bundle (INFERD_CUDA_ARCHS=80-virtual, 89-virtual) is compiled by the driver at first use, minutes for
# the attention and fp8 kernels: a cache large enough to hold all of it lets each later process start at once.
export CUDA_CACHE_MAXSIZE=${CUDA_CACHE_MAXSIZE:-4294967296}
export PYTHONPATH="$BUNDLE/pystubs${PYTHONPATH:+:$PYTHONPATH}"  # gRPC stubs and grpc_health for the black-box tests
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee "$OUT/device.txt"
status=0
# A gpu_tests log in brief: every parity line and failure; precision lines only where a kernel is off by more
# than a rounding or so.
summarize_gpu_tests() {
  grep -E "^\[ parity|FAILED|Failure|Expected|Which is|^\[  (PASSED|SKIPPED)|tests ran" "$1"
  grep -E "^\[ precision" "$1" | grep -vE "error (0\.|1\.[0-2])"
}

# Random-weight models with head dims 64, 128 and 256 (the "-sharp" ones with large activations) and their
# references: fp32 on the CPU, bf16 on the GPU, and the fp8 ones.
make_models_and_references() {
  export INFERD_GPU_MODELS=/tmp/inferd-gpu-models
  rm -rf "$INFERD_GPU_MODELS"
  python3 tools/make_test_models.py --gpu-models "$INFERD_GPU_MODELS" || status=1
  python3 tools/make_reference_fixtures.py "$INFERD_GPU_MODELS" "$INFERD_GPU_MODELS/reference" || status=1
  python3 tools/make_reference_fixtures.py --device cuda --dtype bfloat16 --suffix=-bf16 --forced-on-fp32 \
    "$INFERD_GPU_MODELS" "$INFERD_GPU_MODELS/reference" || status=1
  python3 tools/make_reference_fixtures.py --fp8-weights --suffix=-fp8 "$INFERD_GPU_MODELS" \
    "$INFERD_GPU_MODELS/reference" || status=1
  python3 tools/make_reference_fixtures.py --fp8-weights --fp8-activations --suffix=-fp8a8 "$INFERD_GPU_MODELS" \
    "$INFERD_GPU_MODELS/reference" || status=1
  # At tensor_parallel_size N each rank quantizes its own slice of the row-parallel products' inputs.
  local n
  for n in ${1:-}; do
    python3 tools/make_reference_fixtures.py --fp8-weights --fp8-activations --fp8-activation-shards "$n" \
      --suffix="-fp8a8-tp$n" "$INFERD_GPU_MODELS" "$INFERD_GPU_MODELS/reference" || status=1
  done
}
# `inferd plan` for the config a bench ran (its model section given; the bench's scheduler limits) on the free memory
# the bench saw, against the bench's real memory plan: each part within 2%.
compare_plan() {  # model section, bench JSON, name, [engine section], [the plan's dtype row: bfloat16]
  printf "%s\nscheduler: {max_num_seqs: 256, max_num_batched_tokens: 8192}\n%s\n" "$1" "${4:-}" > "/tmp/plan_$3.yaml"
  local free_gib
  free_gib=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['memory_plan']['device_free_bytes'] / 2**30)" "$2")
  "$BUNDLE/bin/inferd" plan --config "/tmp/plan_$3.yaml" --gpu-memory-gib "$free_gib" --json > "$OUT/plan_$3.json" || status=1
  python3 - "$OUT/plan_$3.json" "$2" "${5:-bfloat16}" <<'PY' || status=1
import json, sys
plan = next(p for p in json.load(open(sys.argv[1]))["plans"] if p["dtype"] == sys.argv[3])
real = json.load(open(sys.argv[2]))["memory_plan"]
worst = 0
for key in ["weight_bytes", "activation_bytes", "other_bytes", "num_blocks"]:
    ratio = plan[key] / real[key]
    print(f"{key:18s} plan {plan[key]:>14} real {real[key]:>14}  plan/real {ratio:.4f}")
    if key != "other_bytes":
        worst = max(worst, abs(ratio - 1))
total = lambda p: p["weight_bytes"] + p["activation_bytes"] + p["other_bytes"] + p["num_blocks"] * p["kv_bytes_per_block"]
print(f"{'total':18s} plan {total(plan):>14} real {total(real):>14}  plan/real {total(plan) / total(real):.4f}")
sys.exit(0 if worst <= 0.02 and abs(total(plan) / total(real) - 1) <= 0.02 else 1)
PY
}

if [[ "$what" == all || "$what" == tests || "$what" == parity || "$what" == fp8 ]]; then
  make_models_and_references
  tar -C "$INFERD_GPU_MODELS" -czf "$OUT/gpu_references.tar.gz" reference
  # FP8 checkpoints (compressed-tensors, per channel) of four of them, beside the models (not referenced).
  rm -rf "$INFERD_GPU_MODELS-fp8"
  for m in llama3-hd64 qwen2-hd128 mixtral-hd128 qwen3-moe-hd128; do
    python3 tools/make_fp8_checkpoint.py "$INFERD_GPU_MODELS/$m" "$INFERD_GPU_MODELS-fp8/$m" || status=1
  done
  # One with KV cache scales (K 2, V 4), for the fp8 KV cache's scaled path.
  python3 tools/make_fp8_checkpoint.py --kv-scales 2,4 "$INFERD_GPU_MODELS/mistral-hd128-g3" \
    "$INFERD_GPU_MODELS-fp8/mistral-hd128-g3-kvscales" || status=1
fi
if [[ "$what" == parity ]]; then  # the precision and whole-model parity tests alone
  "$BUNDLE/bin/gpu_tests" --gtest_filter='Precision.*:Models/CudaParity.*:Models/SharpParity.*' --gtest_output="xml:$OUT/gpu_tests.xml" \
    > "$OUT/gpu_tests_parity.log" 2>&1 || status=1
  summarize_gpu_tests "$OUT/gpu_tests_parity.log"
fi
if [[ "$what" == fp8 ]]; then  # every GPU test, the fp8 ones among them
  "$BUNDLE/bin/gpu_tests" --gtest_filter="${GPU_TESTS_FILTER:-*}" --gtest_output="xml:$OUT/gpu_tests.xml" \
    > "$OUT/gpu_tests.log" 2>&1 || status=1
  summarize_gpu_tests "$OUT/gpu_tests.log"
fi
if [[ "$what" == all || "$what" == fp8-bench ]]; then
  echo "== benchmarks: bf16 and fp8 (engine.quantization) on the 8B model"
  M=/tmp/llama3-8b-random
  [[ -f $M/model.safetensors.index.json ]] || python3 tools/make_llama3_8b_random.py "$M" || status=1
  for run in none:auto fp8:auto fp8:fp8_e4m3; do
    q=${run%%:*} kv=${run##*:} name=${run/:auto/} && name=${name/:fp8_e4m3/_kv8}
    "$BUNDLE/bin/inferd-bench" --model "$M" --quantization $q --kv-cache-dtype $kv \
      --sections "${FP8_BENCH_SECTIONS:-products,latency,prefill,decode,throughput}" \
      --batches "${FP8_BENCH_BATCHES:-1,64,128,256}" --json "$OUT/bench_8b_$name.json" > "$OUT/bench_8b_$name.txt" 2>&1 || status=1
    echo "-- quantization $q, kv_cache_dtype $kv"
    grep -E "weights|memory plan" "$OUT/bench_8b_$name.txt" | head -n 3
    grep -v "^\[20" "$OUT/bench_8b_$name.txt"
  done
fi
if [[ "$what" == all || "$what" == tests ]]; then
  # The bundled SmolLM2 (98 MB) and Gemma 3 270M (253 MB) do not travel with the working tree (64 MiB per call):
  # without them, the tests that need them are left out here (CI runs them).
  left_out=()
  if [[ ! -f models/SmolLM2-135M-Instruct.Q4_1.gguf ]]; then
    left_out+=("*smollm2*" ChatTemplate.RendersEqualHuggingFace ChatTemplate.EndOfTurnTokensStopGeneration)
  fi
  [[ -f models/gemma-3-270m-q4_k_m.gguf ]] || left_out+=("*gemma3_270m*")
  filter="*"
  if (( ${#left_out[@]} )); then filter="-$(IFS=:; echo "${left_out[*]}")"; fi
  echo "== gpu_tests"
  "$BUNDLE/bin/gpu_tests" --gtest_filter="${GPU_TESTS_FILTER:-*}" --gtest_output="xml:$OUT/gpu_tests.xml" \
    > "$OUT/gpu_tests.log" 2>&1 || status=1
  summarize_gpu_tests "$OUT/gpu_tests.log"
  for t in core_tests engine_tests; do
    echo "== $t"
    "$BUNDLE/bin/$t" --gtest_filter="$filter" --gtest_output="xml:$OUT/$t.xml" 2>&1 | tail -n 3
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  done
  echo "== black-box gRPC suite against a cuda server"
  python3 -m pip show -q protobuf grpcio 2>/dev/null | grep -E "^(Name|Version)" | paste - - | tee "$OUT/python_grpc.txt"
  INFERD_BIN="$BUNDLE/bin/inferd" INFERD_PY_STUBS="$BUNDLE/pystubs" python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/server 2>&1 | tail -n 15
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  if [[ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ]]; then
    echo "== the bundled SmolLM2 answers chat questions on cuda"
    INFERD_SMOLLM2_BACKEND=cuda INFERD_BIN="$BUNDLE/bin/inferd" INFERD_PY_STUBS="$BUNDLE/pystubs" \
      python3 -m pytest -q -p no:cacheprovider tests/integration/test_chat.py -k "smollm2 or chat_equals" 2>&1 | tail -n 5
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  fi
  echo "== compute-sanitizer memcheck: the cuda server serving streams and bad input"
  MEMCHECK_LOG="$OUT/memcheck_server.txt" INFERD_REAL_BIN="$BUNDLE/bin/inferd" INFERD_START_TIMEOUT_S=300 \
    INFERD_BIN="$PWD/scripts/memcheck_wrapper.sh" INFERD_PY_STUBS="$BUNDLE/pystubs" python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/server -k "stream_and_unary or bad_input or memory_plan" 2>&1 | tail -n 5
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  grep -E "ERROR SUMMARY" "$OUT/memcheck_server.txt"
  echo "== compute-sanitizer memcheck: one engine serving run (batched prompts, prefill chunks, decode)"
  compute-sanitizer --tool memcheck --error-exitcode 3 "$BUNDLE/bin/gpu_tests" \
    --gtest_filter='Models/CudaParity.*/qwen2_hd128_bf16ref_bs3_budget24*' 2>&1 | tail -n 6 | tee "$OUT/memcheck.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi
if [[ "$what" == all || "$what" == tests || "$what" == copies ]]; then
  # The KV copy stream (host tier restores, swaps, write-backs) under memcheck. (synccheck did not finish this test
  # within 9 minutes on the H100; memcheck takes 6 s.)
  [[ -n "${INFERD_GPU_MODELS:-}" ]] || { export INFERD_GPU_MODELS=/tmp/inferd-gpu-models; rm -rf "$INFERD_GPU_MODELS";
    python3 tools/make_test_models.py --gpu-models "$INFERD_GPU_MODELS" || status=1; }
  for tool in memcheck; do
    echo "== compute-sanitizer $tool: the host KV pool's copies on their own stream"
    compute-sanitizer --tool $tool --error-exitcode 3 "$BUNDLE/bin/gpu_tests" \
      --gtest_filter='CudaBackend.HostTier*' 2>&1 | tail -n 4 | tee "$OUT/${tool}_copies.txt"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  done
fi

if [[ "$what" == all || "$what" == copies ]]; then
  # A swap storm: the scheduler soak on the 8B model with a device pool of a few requests and swap space, every
  # step profiled; both streams drawn from its log, and steps with copies under them against steps without.
  echo "== swap storm: the scheduler soak on the 8B model, ${STORM_BLOCKS:-96} device blocks and swap space"
  M=/tmp/llama3-8b-random
  [[ -f $M/model.safetensors.index.json ]] || python3 tools/make_llama3_8b_random.py "$M" || status=1
  INFERD_BIN="$BUNDLE/bin/inferd" INFERD_PY_STUBS="$BUNDLE/pystubs" INFERD_START_TIMEOUT_S=120 python3 \
    tests/soak/scheduler_soak.py --backend cuda --model "$M" --num-blocks "${STORM_BLOCKS:-96}" --swap-gib 4 \
    --requests "${STORM_REQUESTS:-2000}" --log "$OUT/storm_server.log" 2>&1 | tail -n 3
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  python3 tests/gpu/copy_timeline.py "$OUT/storm_server.log" --json "$OUT/storm_timeline.json" || status=1
  gzip -f "$OUT/storm_server.log"
fi

if [[ "$what" == smollm2 ]]; then
  echo "== the bundled SmolLM2 on cuda: structured output, tools and chat through the OpenAI SDK and gRPC"
  suites=(tests/integration/test_schema_suite.py tests/integration/test_structured_output.py
          tests/integration/test_tools.py tests/integration/test_chat.py)
  skip=() && python3 -c "import agents" 2>/dev/null || skip=(-k "not agents")  # openai-agents travels only if carried
  INFERD_SMOLLM2_BACKEND=cuda INFERD_BIN="$BUNDLE/bin/inferd" INFERD_PY_STUBS="$BUNDLE/pystubs" \
    python3 -m pytest -q -p no:cacheprovider -rs "${suites[@]}" "${skip[@]}" 2>&1 | tee "$OUT/smollm2_cuda.txt" | tail -n 25
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi
if [[ "$what" == all || "$what" == accuracy ]]; then
  echo "== accuracy on real weights: SmolLM2 in bf16 and fp8, perplexity and greedy agreement"
  if [[ -f models/SmolLM2-135M-Instruct.Q4_1.gguf && -f models/eval/kjv-genesis-exodus.txt ]]; then
    python3 tests/gpu/accuracy_check.py --bin "$BUNDLE/bin/inferd" --bench "$BUNDLE/bin/inferd-bench" \
      --model models/SmolLM2-135M-Instruct.Q4_1.gguf --text models/eval/kjv-genesis-exodus.txt \
      --out "$OUT/accuracy_smollm2.json" || status=1
  else
    echo "accuracy: models/SmolLM2-135M-Instruct.Q4_1.gguf or models/eval/kjv-genesis-exodus.txt is missing (scripts/setup.sh)"
    status=1
  fi
fi
if [[ "$what" == all || "$what" == bench ]]; then
  echo "== benchmarks"
  "$BUNDLE/bin/bench_rms_norm" 2>&1 | tee "$OUT/bench_rms_norm.txt" | tail -n 3 || status=1
  M=/tmp/llama3-8b-random
  [[ -f $M/model.safetensors.index.json ]] || python3 tools/make_llama3_8b_random.py "$M" || status=1
  "$BUNDLE/bin/inferd-bench" --model "$M" --json "$OUT/bench_8b.json" > "$OUT/bench_8b.txt" 2>&1 || status=1
  grep -E "memory plan|built its weights|engine ready" "$OUT/bench_8b.txt"
  grep -v "^\[20" "$OUT/bench_8b.txt"
  echo "== live efficiency metrics of the served 8B model against inferd-bench's offline ratios; energy per token"
  python3 tests/gpu/efficiency_check.py --bin "$BUNDLE/bin/inferd" --bench "$BUNDLE/bin/inferd-bench" --model "$M" \
    --out "$OUT/efficiency_8b.json" || status=1
  echo "== inferd plan against the start-up's real plan (same free memory, same limits)"
  compare_plan "model: {path: $M}" "$OUT/bench_8b.json" 8b
fi
if [[ "$what" == efficiency ]]; then  # the live-against-offline check alone (gpu_run.sh bench runs it too)
  M=/tmp/llama3-8b-random
  [[ -f $M/model.safetensors.index.json ]] || python3 tools/make_llama3_8b_random.py "$M" || status=1
  python3 tests/gpu/efficiency_check.py --bin "$BUNDLE/bin/inferd" --bench "$BUNDLE/bin/inferd-bench" --model "$M" \
    --out "$OUT/efficiency_8b.json" || status=1
fi
if [[ "$what" == sweep ]]; then
  M=/tmp/llama3-8b-random
  [[ -f $M/model.safetensors.index.json ]] || python3 tools/make_llama3_8b_random.py "$M" || status=1
  printf "model: {path: %s}\nengine: {backend: cuda}\nscheduler: {max_num_seqs: 256, max_num_batched_tokens: 8192, max_queue: 4096}\nserver: {listen: '127.0.0.1:50051', metrics_listen: '127.0.0.1:9090'}\n" "$M" > /tmp/sweep.yaml
  "$BUNDLE/bin/inferd" --config /tmp/sweep.yaml > "$OUT/sweep_server.log" 2>&1 &
  server=$!
  for _ in $(seq 1 120); do
    python3 -c "import grpc; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; import sys; sys.exit(0 if g.HealthStub(grpc.insecure_channel('127.0.0.1:50051')).Check(h.HealthCheckRequest(), timeout=1).status == 1 else 1)" 2>/dev/null && break
    sleep 1
  done
  "$BUNDLE/bin/inferd-bench" serve --address 127.0.0.1:50051 --num-prompts 200 --warmup 4 --random-input-len 512 \
    --random-output-len 128 --request-rates "${SWEEP_RATES:-4,8,16,32,64,inf}" --goodput ttft:1000,tpot:50 \
    --csv "$OUT/sweep_8b.csv" --json "$OUT/sweep_8b.json" 2>/dev/null | tee "$OUT/sweep_8b.txt" || status=1
  curl -s 127.0.0.1:9090/metrics > "$OUT/sweep_metrics.txt" || true
  kill -TERM $server; wait $server
fi
if [[ "$what" == all || "$what" == multiturn ]]; then
  # Simulated users in conversation on the 8B model, the device pool held to engine.num_blocks so that their
  # histories do not fit it: without and with the prefix cache's host tier, at equal device memory.
  echo "== multi-turn conversations: host tier off and on"
  M=/tmp/llama3-8b-random
  [[ -f $M/model.safetensors.index.json ]] || python3 tools/make_llama3_8b_random.py "$M" || status=1
  for host in 0 ${MULTITURN_HOST_GIB:-24}; do
    printf "model: {path: %s}\nengine: {backend: cuda, num_blocks: %s, host_kv_cache_gib: %s}\nscheduler: {max_num_seqs: 64, max_num_batched_tokens: 8192, max_queue: 4096}\nserver: {listen: '127.0.0.1:50051', metrics_listen: ''}\n" \
      "$M" "${MULTITURN_BLOCKS:-1536}" "$host" > /tmp/multiturn.yaml
    "$BUNDLE/bin/inferd" --config /tmp/multiturn.yaml > "$OUT/multiturn_server_host$host.log" 2>&1 &
    server=$!
    for _ in $(seq 1 120); do
      python3 -c "import grpc; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; import sys; sys.exit(0 if g.HealthStub(grpc.insecure_channel('127.0.0.1:50051')).Check(h.HealthCheckRequest(), timeout=1).status == 1 else 1)" 2>/dev/null && break
      sleep 1
    done
    echo "-- engine.host_kv_cache_gib $host"
    "$BUNDLE/bin/inferd-bench" serve --multi-turn --address 127.0.0.1:50051 ${MULTITURN_ARGS:---users 16 --turns 6 --system-len 1500 --turn-len 800 --output-len 100 --think-time 3} \
      --json "$OUT/multiturn_host$host.json" 2>/dev/null | tee "$OUT/multiturn_host$host.txt" || status=1
    kill -TERM $server; wait $server
    grep -E "host KV pool|memory plan" "$OUT/multiturn_server_host$host.log" | head -n 2
  done
  python3 - "$OUT/multiturn_host0.json" "$OUT/multiturn_host${MULTITURN_HOST_GIB:-24}.json" <<'PY' || status=1
import json, sys
off, on = (json.load(open(p)) for p in sys.argv[1:3])
p50 = lambda r: r["ttft_after_first_turn"]["median_ms"]
print(f"TTFT p50 (turns 2+): off {p50(off):.1f} ms, on {p50(on):.1f} ms: {p50(off) / max(p50(on), 1e-9):.2f}x better (target 2x)")
print(f"throughput: off {off['total_token_throughput']:.0f}, on {on['total_token_throughput']:.0f} tokens/s "
      f"({on['total_token_throughput'] / off['total_token_throughput']:.3f}x; target >= 1)")
print(f"device idle share: off {off['device_idle_share']:.3f}, on {on['device_idle_share']:.3f} (target: no higher)")
print(f"prefix hit rate: off {off['prefix_hit_rate']:.3f}; on {on['prefix_hit_rate']:.3f} "
      f"(device {on['prefix_hit_rate_device']:.3f}, host {on['prefix_hit_rate_host']:.3f})")
copy, waited = on["kv_copy_s"], on["kv_copy_waited_s"]
print(f"KV copies with the host tier: {copy:.3f} s on the copy stream, {100 * (1 - waited / copy) if copy else 100:.1f} % hidden")
sys.exit(0 if off["failed"] == 0 and on["failed"] == 0 else 1)
PY
fi
if [[ "$what" == image ]]; then
  bash docker/run-payload.sh "$OUT" || status=1
fi
if [[ "$what" == frontends ]]; then
  M=/tmp/llama3-8b-random
  [[ -f $M/model.safetensors.index.json ]] || python3 tools/make_llama3_8b_random.py "$M" || status=1
  printf "model: {path: %s}\nengine: {backend: cuda}\nscheduler: {max_num_seqs: 256, max_num_batched_tokens: 8192, max_queue: 4096}\nserver: {listen: '127.0.0.1:50051', http_listen: '127.0.0.1:8000', metrics_listen: ''}\n" "$M" > /tmp/frontends.yaml
  "$BUNDLE/bin/inferd" --config /tmp/frontends.yaml > "$OUT/frontends_server.log" 2>&1 &
  server=$!
  for _ in $(seq 1 120); do curl -sf 127.0.0.1:8000/health >/dev/null && break; sleep 1; done
  for c in 1 64 256; do
    n=$((c == 1 ? 8 : (c == 64 ? 256 : 512)))
    for round in 1 2; do
      for backend in grpc openai; do
        address=127.0.0.1:50051; [[ $backend == openai ]] && address=127.0.0.1:8000
        "$BUNDLE/bin/inferd-bench" serve --backend $backend --address $address --max-concurrency $c --num-prompts $n \
          --warmup 4 --random-input-len 256 --random-output-len 256 --json "$OUT/frontends_${backend}_c${c}_r${round}.json" \
          > /dev/null 2>&1 || status=1
      done
    done
  done
  kill -TERM $server; wait $server
  python3 - "$OUT" <<'PY' | tee "$OUT/frontends.txt"
import glob, json, sys
rows = {}
for f in glob.glob(f"{sys.argv[1]}/frontends_*_c*_r*.json"):
    backend, c, r = f.rsplit("/", 1)[1][len("frontends_"):-len(".json")].split("_")
    rows.setdefault((int(c[1:]), backend), []).append(json.load(open(f)))
print(f"{'streams':>7} {'api':>6} {'out tok/s':>10} {'TPOT med ms':>12} {'ITL p99 ms':>11} {'TTFT med ms':>12}  (best of 2)")
for c in sorted({k[0] for k in rows}):
    best = {}
    for backend in ("grpc", "openai"):
        runs = rows.get((c, backend), [])
        if not runs:
            continue
        r = max(runs, key=lambda x: x["output_throughput"])
        best[backend] = r
        print(f"{c:>7} {backend:>6} {r['output_throughput']:>10.0f} {r['tpot']['median_ms']:>12.3f} "
              f"{r['itl']['p99_ms']:>11.3f} {r['ttft']['median_ms']:>12.1f}  failed {r['failed']}")
    if len(best) == 2:
        g, o = best["grpc"], best["openai"]
        print(f"{c:>7} openai/grpc: throughput {o['output_throughput'] / g['output_throughput']:.3f}, "
              f"TPOT {o['tpot']['median_ms'] - g['tpot']['median_ms']:+.3f} ms per token")
PY
fi
if [[ "$what" == ab ]]; then
  # The build before against this one, in turn (AB_ROUNDS, default 2), one machine, one call: inferd-bench of each
  # (.bundle/base.tar.xz holds the build before's bin/inferd-bench, and lib/ where its libraries differ) on the
  # Llama-3-8B and Qwen3-8B shapes from weights made on the GPU (AB_MODELS, AB_QUANTIZATIONS, AB_SECTIONS,
  # AB_BATCHES narrow it). First the GPU tests that AB_TESTS names (a gtest filter), if any.
  if [[ -n ${AB_TESTS:-} ]]; then
    "$BUNDLE/bin/gpu_tests" --gtest_filter="$AB_TESTS" > "$OUT/ab_gpu_tests.log" 2>&1 || status=1
    echo "-- gpu_tests $AB_TESTS" && summarize_gpu_tests "$OUT/ab_gpu_tests.log" | tail -n 20
  fi
  BASE=/tmp/inferd-base && rm -rf "$BASE" && mkdir -p "$BASE" && tar -C "$BASE" -xJf .bundle/base.tar.xz
  base_libs="$BUNDLE/lib" && [[ -d "$BASE/lib" ]] && base_libs="$BASE/lib"
  # Variants timed between the two: each .bundle/side-NAME.tar.xz (its bin/inferd-bench, on this bundle's libraries).
  sides=""
  for f in .bundle/side-*.tar.xz; do
    [[ -f $f ]] || continue
    side=$(basename "$f" .tar.xz) && sides="$sides $side"
    rm -rf "/tmp/inferd-$side" && mkdir -p "/tmp/inferd-$side" && tar -C "/tmp/inferd-$side" -xJf "$f"
  done
  # AB_MODELS: llama3, qwen3 (8B shapes) and qwen3moe (Qwen3-30B-A3B's: 128 experts, 8 a token).
  declare -A ab_flags=([llama3]="" [qwen3]="--qwen3-8b" [qwen3moe]="--qwen3-30b-a3b")
  for m in ${AB_MODELS:-llama3 qwen3}; do
    python3 tools/make_llama3_8b_random.py "/tmp/ab-$m-config" --config-only ${ab_flags[$m]} >/dev/null || status=1
  done
  for i in $(seq 1 "${AB_ROUNDS:-2}"); do
    for m in ${AB_MODELS:-llama3 qwen3}; do
      for q in ${AB_QUANTIZATIONS:-none}; do
        for side in base $sides new; do
          bin="$BUNDLE/bin/inferd-bench" libs="$BUNDLE/lib" && [[ $side == base ]] && bin="$BASE/bin/inferd-bench" libs="$base_libs"
          [[ $side == side-* ]] && bin="/tmp/inferd-$side/bin/inferd-bench"
          name="ab_${m}_${q}_${side}_$i"
          LD_LIBRARY_PATH="$libs" "$bin" --model "/tmp/ab-$m-config" --load-format dummy --quantization "$q" \
            --sections "${AB_SECTIONS:-latency}" --batches "${AB_BATCHES:-1}" --json "$OUT/$name.json" \
            > "$OUT/$name.txt" 2>&1 || status=1
          echo "-- $name" && grep -v "^\[20" "$OUT/$name.txt" | grep -E "decode|latency|prefill" | head -n 6
        done
      done
    done
  done
fi
if [[ "$what" == speculative ]]; then
  if [[ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ]]; then
    # bf16 with the config's defaults (speculative.adaptive) and with every step drafting; fp16 (8 times finer
    # rounding) for the token comparison at margins of 0.1.
    for run in ${SPEC_RUNS:-default forced fp16}; do
      # Three rounds of each run (tokens/s the median: one round of 64 requests on SmolLM2 lasts half a second, and
      # rounds differ by several percent); one for fp16, which is there for its tokens.
      flags=(--repeats "${SPEC_REPEATS:-3}") && [[ $run == forced ]] && flags+=(--forced)
      [[ $run == fp16 ]] && flags=(--forced --dtype float16)
      "$BUNDLE/bin/inferd-bench" speculative --model models/SmolLM2-135M-Instruct.Q4_1.gguf "${flags[@]}" \
        --batches "${SPEC_BATCHES:-1,64}" --max-tokens "${SPEC_MAX_TOKENS:-256}" --json "$OUT/spec_smollm2_$run.json" \
        > "$OUT/spec_smollm2_$run.txt" 2>&1 || { [[ $run == fp16 ]] && status=1; }
      echo "-- SmolLM2, $run"
      grep -v "^\[20" "$OUT/spec_smollm2_$run.txt" | grep -v "^request" | tail -n 14
    done
  else
    echo "speculative: models/SmolLM2-135M-Instruct.Q4_1.gguf is missing (scripts/setup.sh)"
    status=1
  fi
  if [[ ${SPEC_VERIFY:-1} == 1 ]]; then
    python3 tools/make_llama3_8b_random.py /tmp/llama3-8b-config --config-only >/dev/null || status=1
    "$BUNDLE/bin/inferd-bench" speculative --model /tmp/llama3-8b-config --load-format dummy --verify-cost \
      --json "$OUT/spec_verify_8b.json" > "$OUT/spec_verify_8b.txt" 2>&1 || status=1
    grep -v "^\[20" "$OUT/spec_verify_8b.txt" | tail -n 3
  fi
fi
if [[ "$what" == families ]]; then
  python3 tools/make_llama3_8b_random.py /tmp/llama3-8b-config --config-only >/dev/null || status=1
  python3 tools/make_llama3_8b_random.py /tmp/qwen3-8b-config --config-only --qwen3-8b >/dev/null || status=1
  dense="llama3 qwen3" && [[ ${FAMILIES_DENSE:-1} == 1 ]] || dense=""
  for q in ${FAMILIES_QUANTIZATIONS:-none fp8}; do
    for m in $dense; do
      "$BUNDLE/bin/inferd-bench" --model "/tmp/$m-8b-config" --load-format dummy --quantization "$q" \
        --sections "${FAMILIES_SECTIONS:-latency,prefill,decode}" --batches 1,64,128 --json "$OUT/families_${m}_$q.json" \
        > "$OUT/families_${m}_$q.txt" 2>&1 || status=1
      echo "-- $m-8b shape, quantization $q"
      grep -v "^\[20" "$OUT/families_${m}_$q.txt" | grep -E "decode|latency|prefill|ceiling" | head -n 12
    done
  done
  # Gemma 3 4B's shape at 32k context: five 1024-token sliding-window layers to one global, against every layer
  # global (the same weights and KV pool).
  for g in ${FAMILIES_GEMMA:-windows full}; do
    flags=() && [[ $g == full ]] && flags=(--full-attention)
    python3 tools/make_llama3_8b_random.py "/tmp/gemma3-4b-$g" --config-only --gemma3-4b "${flags[@]}" >/dev/null ||
      status=1
    "$BUNDLE/bin/inferd-bench" --model "/tmp/gemma3-4b-$g" --load-format dummy --sections "${FAMILIES_GEMMA_SECTIONS:-decode}" --batches 1,8 \
      --decode-context 32768 --json "$OUT/families_gemma3_$g.json" > "$OUT/families_gemma3_$g.txt" 2>&1 || status=1
    echo "-- gemma3-4b shape at 32k context, attention: $g"
    grep -v "^\[20" "$OUT/families_gemma3_$g.txt" | grep -E "decode" | head -n 4
  done
  # Phi-3.5-mini's shape: heads of 96, run padded to 128.
  if [[ ${FAMILIES_PHI3:-1} == 1 ]]; then
    python3 tools/make_llama3_8b_random.py /tmp/phi3-mini-config --config-only --phi3-mini >/dev/null || status=1
    for q in ${FAMILIES_QUANTIZATIONS:-none fp8}; do
      "$BUNDLE/bin/inferd-bench" --model /tmp/phi3-mini-config --load-format dummy --quantization "$q" \
        --sections "${FAMILIES_SECTIONS:-latency,prefill,decode}" --batches 1,64,128 --json "$OUT/families_phi3_$q.json" \
        > "$OUT/families_phi3_$q.txt" 2>&1 || status=1
      echo "-- phi3-mini shape (heads of 96 padded to 128), quantization $q"
      grep -v "^\[20" "$OUT/families_phi3_$q.txt" | grep -E "decode|latency|prefill|ceiling|padded" | head -n 12
    done
    compare_plan "model: {path: /tmp/phi3-mini-config, load_format: dummy}" "$OUT/families_phi3_none.json" phi3_mini
  fi
  # Qwen3-30B-A3B's shape: a mixture of 128 experts, 8 a token, in bf16 and with fp8 experts (FAMILIES_MOE=0
  # leaves it out, FAMILIES_MOE_QUANTIZATIONS narrows it); then Mixtral-8x7B's shape in fp8 (8 experts of 14,336,
  # 2 a token; 47 GB; FAMILIES_MIXTRAL=0 leaves it out).
  if [[ ${FAMILIES_MOE:-1} == 1 ]]; then
    python3 tools/make_llama3_8b_random.py /tmp/qwen3-30b-a3b-config --config-only --qwen3-30b-a3b >/dev/null || status=1
    for q in ${FAMILIES_MOE_QUANTIZATIONS:-none fp8}; do
      name=qwen3_moe && [[ $q == none ]] || name=qwen3_moe_$q
      "$BUNDLE/bin/inferd-bench" --model /tmp/qwen3-30b-a3b-config --load-format dummy --quantization "$q" \
        --sections "${FAMILIES_MOE_SECTIONS:-latency,prefill,decode}" --batches "${FAMILIES_MOE_BATCHES:-1,64,128,256}" \
        --json "$OUT/families_$name.json" > "$OUT/families_$name.txt" 2>&1 || status=1
      echo "-- qwen3-30b-a3b shape (128 experts, 8 a token), quantization $q"
      grep -v "^\[20" "$OUT/families_$name.txt" | grep -E "decode|latency|prefill|ceiling|experts" | head -n 14
      row=bfloat16 && [[ $q == none ]] || row=$q
      compare_plan "model: {path: /tmp/qwen3-30b-a3b-config, load_format: dummy}" "$OUT/families_$name.json" "$name" \
        "" "$row"
    done
  fi
  if [[ ${FAMILIES_MIXTRAL:-1} == 1 ]]; then
    python3 tools/make_llama3_8b_random.py /tmp/mixtral-8x7b-config --config-only --mixtral-8x7b >/dev/null || status=1
    "$BUNDLE/bin/inferd-bench" --model /tmp/mixtral-8x7b-config --load-format dummy --quantization fp8 \
      --sections "${FAMILIES_MIXTRAL_SECTIONS:-latency,decode}" --batches 1,64 \
      --json "$OUT/families_mixtral_fp8.json" > "$OUT/families_mixtral_fp8.txt" 2>&1 || status=1
    echo "-- mixtral-8x7b shape (8 experts of 14,336, 2 a token), fp8"
    grep -v "^\[20" "$OUT/families_mixtral_fp8.txt" | grep -E "decode|latency|prefill|ceiling|experts" | head -n 12
    compare_plan "model: {path: /tmp/mixtral-8x7b-config, load_format: dummy}" "$OUT/families_mixtral_fp8.json" \
      mixtral_fp8 "" fp8
  fi
  echo "-- inferd plan against the real plans of the Qwen3 and Gemma 3 runs"
  [[ -z $dense ]] ||
    compare_plan "model: {path: /tmp/qwen3-8b-config, load_format: dummy}" "$OUT/families_qwen3_none.json" qwen3_8b
  [[ ! -f "$OUT/families_gemma3_windows.json" ]] ||
    compare_plan "model: {path: /tmp/gemma3-4b-windows, load_format: dummy}" "$OUT/families_gemma3_windows.json" \
      gemma3_4b
fi
if [[ "$what" == tp ]]; then
  gpus=$(nvidia-smi -L | wc -l)
  echo "== tensor parallelism on $gpus GPU(s)"
  # The parity suite below needs the references as much as the models: made here, so that it compares, never skips.
  if [[ ${TP_PARTS:-parity} == *parity* ]]; then
    sizes="" && for n in ${TP_SIZES:-2 4 8}; do (( n <= gpus )) && sizes="$sizes $n"; done
    make_models_and_references "$sizes"
  fi
  # Collectives that wait on each other can hang rather than fail: bounded, so that a hang is a failure with a log.
  timeout "${TP_TESTS_TIMEOUT:-300}" "$BUNDLE/bin/gpu_tests" --gtest_filter='TensorParallelOnCuda.*:Peer*' \
    --gtest_output="xml:$OUT/gpu_tp_tests.xml" > "$OUT/gpu_tp_tests.log" 2>&1 || { status=1 && echo "gpu_tests failed or hung"; }
  summarize_gpu_tests "$OUT/gpu_tp_tests.log"
  # The benchmarks need no weights on disk: config.json and tokenizer.json, and weights made on each GPU for its
  # shard (model.load_format dummy), so the 70B shape starts in seconds on any disk.
  M8=/tmp/llama3-8b-config M70=/tmp/llama3-70b-config M=$M8
  python3 tools/make_llama3_8b_random.py "$M8" --config-only >/dev/null || status=1
  python3 tools/make_llama3_8b_random.py "$M70" --config-only --70b >/dev/null || status=1
  bench_tp() {  # bundle dir, tensor_parallel_size, name, [extra flags]
    local tp=() && (( $2 > 1 )) && tp=(--tensor-parallel "$2")
    "$1/bin/inferd-bench" --model "${TP_MODEL:-$M}" "${tp[@]}" "${@:4}" --sections "${TP_SECTIONS:-latency,decode}" \
      --batches "${TP_BATCHES:-1,64,128}" --json "$OUT/tp_$3.json" > "$OUT/tp_$3.txt" 2>&1 || status=1
    echo "-- $3"
    grep -v "^\[20" "$OUT/tp_$3.txt" | grep -E "decode|latency|prefill|tok/s|ms" | head -n 14
  }
  if [[ -f .bundle/base.tar.xz ]]; then  # A/B against the commit before, in turn, twice: TP 1, and TP 2 on 2 GPUs
    BASE=/tmp/inferd-base && rm -rf "$BASE" && mkdir -p "$BASE" && tar -C "$BASE" -xJf .bundle/base.tar.xz
    for i in 1 2; do
      for n in ${TP_AB_SIZES:-1 2}; do
        (( n <= gpus )) || continue
        for q in ${TP_AB_QUANTIZATIONS:-none}; do
          LD_LIBRARY_PATH="$BASE/lib:$BUNDLE/lib" bench_tp "$BASE" $n "8b_${q}_tp${n}_base_$i" --load-format dummy --quantization "$q"
          bench_tp "$BUNDLE" $n "8b_${q}_tp${n}_new_$i" --load-format dummy --quantization "$q"
        done
      done
    done
  fi
  parts=${TP_PARTS:-parity bench}  # either or both, for runs split over calls
  if (( gpus >= 2 )) && [[ $parts == *parity* ]]; then
    for n in ${TP_SIZES:-2 4 8}; do
      (( n <= gpus )) || continue
      INFERD_TENSOR_PARALLEL=$n "$BUNDLE/bin/gpu_tests" --gtest_filter='Models/CudaParity.*:Models/Fp8Sharp.*' \
        --gtest_output="xml:$OUT/gpu_parity_tp${n}_tests.xml" > "$OUT/gpu_parity_tp$n.log" 2>&1 || status=1
      echo "-- parity at tensor_parallel_size $n" && summarize_gpu_tests "$OUT/gpu_parity_tp$n.log"
      echo "-- the black-box gRPC suite against a cuda server at tensor_parallel_size $n"
      INFERD_TENSOR_PARALLEL=$n INFERD_BIN="$BUNDLE/bin/inferd" INFERD_PY_STUBS="$BUNDLE/pystubs" \
        python3 -m pytest -q -p no:cacheprovider tests/gpu/server/test_cuda_server.py 2>&1 | tail -n 8
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    done
  fi
  if (( gpus >= 2 )) && [[ $parts == *bench* ]]; then
    for q in ${TP_QUANTIZATIONS:-none}; do
      for n in 1 2 4 8; do
        (( n <= gpus )) || continue
        TP_MODEL=$M8 bench_tp "$BUNDLE" $n "8b_${q}_tp$n" --load-format dummy --quantization "$q"
      done
    done
    echo "-- inferd plan at tensor_parallel_size 2 against the real plan of the 8B's TP 2 run"
    compare_plan "model: {path: $M8, load_format: dummy}" "$OUT/tp_8b_none_tp2.json" 8b_tp2 \
      "engine: {tensor_parallel_size: 2}"
    for n in 2 4 8; do
      (( n <= gpus )) || continue
      TP_MODEL=$M70 TP_SECTIONS=${TP70_SECTIONS:-latency,prefill,decode} bench_tp "$BUNDLE" $n "70b_tp$n" \
        --load-format dummy --quantization "${TP70_QUANTIZATION:-none}"
    done
  fi
fi
# One line per test binary, then everything but the headline files packed into one archive (the device tool
# brings back at most 8 files).
for x in "$OUT"/*_tests.xml; do
  [[ -f $x ]] && python3 -c "import sys, xml.etree.ElementTree as E; r = E.parse(sys.argv[1]).getroot(); print(sys.argv[1].rsplit('/', 1)[-1], 'tests', r.get('tests'), 'failures', r.get('failures'), 'errors', r.get('errors'), 'disabled', r.get('disabled'))" "$x"
done | tee "$OUT/test_summary.txt"
( cd "$OUT" && find . -maxdepth 1 -type f ! -name 'bench_8b.*' ! -name 'efficiency_8b.json' ! -name device.txt \
    ! -name test_summary.txt ! -name sweep_8b.csv ! -name 'image_payload*' ! -name frontends.txt ! -name results.tar.gz -printf '%f\n' | sort > /tmp/packed.txt
  [[ -s /tmp/packed.txt ]] && tar -czf results.tar.gz -T /tmp/packed.txt && xargs rm -f < /tmp/packed.txt )
exit $status

#!/usr/bin/env bash
# The cpu backend beside llama.cpp on the same machine, the same GGUF and the same threads, in one run: llama.cpp's
# llama-bench (pp512, and one stream: tg128) and llama-batched-bench (4 and 16 streams of 128 tokens), built from the
# pinned source scripts/fetch_ggml.sh fetches (its build tuned for this CPU, as llama.cpp builds by default); inferd
# in process as llama-bench runs (`inferd-bench cpu`: pp512, tg128 at 1, 4 and 16 streams) with engine.cpu_weights
# as_stored; then inferd serving the same file with as_stored and fp32, and llama.cpp's llama-server with a slot per
# stream, each measured by `inferd-bench serve` over the OpenAI API at 1, 4 and 16 concurrent streams of 128 prompt
# tokens and 128 generated (the client on the same cores), and each server's peak resident memory (VmHWM) after its
# 16 streams, inferd's KV pool holding as many tokens as llama-server's 16 slots of 512. Nothing else should run
# meanwhile.
#   bash scripts/bench_cpu.sh [GGUF] [THREADS]     (default: the bundled SmolLM2, every core)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=${2:-$(nproc)}
bash scripts/fetch_ggml.sh --llama-cpp
# Also llama-quantize and llama-perplexity, for the README's 8-bit comparison (this script does not run them).
if [[ ! -x build-llama/bin/llama-server || ! -x build-llama/bin/llama-perplexity ]]; then
  cmake -S third_party/llama.cpp -B build-llama -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >/dev/null
  cmake --build build-llama --target llama-bench llama-batched-bench llama-server llama-quantize llama-perplexity
fi
# One served run: the OpenAI API at 127.0.0.1:$1, concurrency $2, twice that many prompts of 128 tokens, 128 out.
serve() {
  build/tools/inferd-bench serve --backend openai --address "127.0.0.1:$1" --max-concurrency "$2" \
    --num-prompts $(($2 * 2)) --warmup 1 --random-input-len 128 --random-output-len 128 --random-range-ratio 0 2>&1 |
    grep -E "Output token throughput|error" | sed "s/^/$2 streams: /"
}
cmake --build build --target inferd inferd-bench >/dev/null
echo "== llama.cpp ($(cat third_party/llama.cpp/.sha256 | cut -c1-12)), $threads threads, $model"
build-llama/bin/llama-bench -m "$model" -t "$threads" -p 512 -n 128 -r 3 2>/dev/null | grep -E "model|pp512|tg128"
build-llama/bin/llama-batched-bench -m "$model" -t "$threads" -c 4096 -npp 16 -ntg 128 -npl 4,16 2>/dev/null |
  grep -E "^\|" || true
echo "== inferd in process (inferd-bench cpu), engine.cpu_weights: as_stored, $threads threads"
build/tools/inferd-bench cpu --model "$model" --threads "$threads" --batches 1,4,16 --gen 128 --repeats 3 2>/dev/null |
  grep -E "^(pp|tg)"
port=$((18000 + RANDOM % 1000))
for weights in as_stored fp32; do
  cfg=$(mktemp --suffix=.yaml)
  cat > "$cfg" <<YAML
model: {path: $model}
engine: {backend: cpu, num_threads: $threads, cpu_weights: $weights, num_blocks: $((16 * 512 / 16))}
server: {listen: '127.0.0.1:$((port + 1))', metrics_listen: '', http_listen: '127.0.0.1:$port'}
YAML
  build/server/inferd --config "$cfg" > "$cfg.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.1; done
  echo "== inferd, engine.cpu_weights: $weights, $threads threads"
  for c in 1 4 16; do serve "$port" "$c"; done
  grep VmHWM "/proc/$pid/status"
  kill $pid && wait $pid 2>/dev/null || true
  rm -f "$cfg" "$cfg.log"
done
# llama.cpp's llama-server with as many parallel slots (continuous batching) as streams, 512 tokens of context each.
echo "== llama.cpp's llama-server, $threads threads, slots = streams"
for c in 1 4 16; do
  build-llama/bin/llama-server -m "$model" -t "$threads" -np "$c" -c $((c * 512)) --host 127.0.0.1 --port "$port" \
    >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.1; done
  serve "$port" "$c"
  [[ $c == 16 ]] && grep VmHWM "/proc/$pid/status"
  kill $pid && wait $pid 2>/dev/null || true
done

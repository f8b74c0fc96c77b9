// inferd-bench: the engine in-process (no gRPC in the timed path) on a model and the cuda backend, against
// ceilings measured first on the same GPU: read-streaming bandwidth (a large read-only reduction) and the
// cuBLASLt bf16 and fp8 GEMM rates at 8192³. Prints a table and writes JSON.
//   inferd-bench --model DIR [--json FILE] [--sections products,tiles,latency,prefill,decode,throughput] [--batches
//   1,8]
//                [--quantization none|fp8] [--kv-cache-dtype auto|fp8_e4m3] [--tensor-parallel N]
//                [--load-format auto|dummy]
//   inferd-bench serve ...   (the serving benchmark against a running server: tools/serve_bench.cc)
//   inferd-bench serve --multi-turn ...   (simulated users in conversation: tools/multi_turn_bench.cc)
//   inferd-bench perplexity FILE ...   (a running server's perplexity over a text: tools/perplexity_bench.cc)
//   inferd-bench cpu ...   (the cpu backend in process, as llama-bench measures llama.cpp: tools/cpu_bench.cc)
#include <cstdio>
#include <string>

#include "tools/cpu_bench.h"
#include "tools/multi_turn_bench.h"
#include "tools/perplexity_bench.h"
#include "tools/serve_bench.h"
#include "tools/spec_bench.h"

#if INFERD_WITH_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "engine/backends/cuda/ceilings.h"
#include "engine/backends/cuda/cuda_check.h"
#include "engine/backends/cuda/gemm.h"
#include "engine/backends/cuda/run_timer.h"
#include "engine/engine.h"
#include "engine/model/model_config.h"
#include "engine/runtime/device_layout.h"
#include "engine/runtime/step_cost.h"
#include "kernels/fp8.h"
#include "kernels/gemv.h"
#include "nlohmann/json.hpp"
#include "tools/bench_sink.h"
#include "tools/fp8_tiles_bench.h"

namespace inferd {
namespace {

#define BENCH_CUDA(expr)                                               \
  do {                                                                 \
    cudaError_t e_ = (expr);                                           \
    if (e_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                    \
    }                                                                  \
  } while (0)

// Median milliseconds of `reps` runs of fn enqueued back to back on `stream`, after `warmup` runs.
double TimeMs(const std::function<absl::Status()>& fn, int warmup, int reps, cudaStream_t stream) {
  absl::StatusOr<std::vector<float>> ms = cuda::TimeRuns(fn, warmup, stream);
  if (ms.ok()) ms = cuda::TimeRuns(fn, reps, stream);
  if (!ms.ok()) {
    std::fprintf(stderr, "%s\n", ms.status().ToString().c_str());
    std::exit(1);
  }
  return cuda::Median(*std::move(ms));
}

double ReadCeilingTBs() {
  auto r = cuda::MeasureReadBandwidth(int64_t{1} << 30, 0);
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
    std::exit(1);
  }
  return *r / 1e12;
}

double GemmCeilingTflops(bool fp8) {
  int64_t ws = 0;
  auto gemm = cuda::Gemm::Create(CUDA_R_16BF, kGemmWorkspaceBytes, &ws);
  auto r = gemm.ok() ? cuda::MeasureGemmRate(**gemm, true, 8192, 0, fp8) : absl::StatusOr<double>(gemm.status());
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
    std::exit(1);
  }
  return *r / 1e12;
}

// The decode step's matrix products (each layer's q/k/v, o, gate/up and down, then the LM head) at m = 1..16
// rows, through cuBLASLt and through the streaming kernel (on CUDA cores and on tensor cores, kernels/gemv.h),
// each reading a fresh region of a 2 GiB pool so no weight is served from L2. Prints the weight bandwidth of each and
// the per-step chain, and returns it as JSON. fp8: the layers' weights are e4m3 (the LM head stays bf16); cuBLASLt gets
// e4m3 inputs, the streaming kernel bf16 ones, as the forward pass runs them.
nlohmann::json DecodeProducts(const ModelConfig& c, double read_tbs, bool fp8) {
  struct Shape {
    const char* name;
    int64_t n, k;
    bool lm_head;  // fp32 output, once per step
  };
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const std::vector<Shape> shapes = {{"qkv", c.qkv_width(), H, false},
                                     {"o", H, c.q_width(), false},
                                     {"gate_up", 2 * I, H, false},
                                     {"down", H, I, false},
                                     {"lm_head", c.vocab_size, H, true}};
  const int64_t pool_bytes = int64_t{2} << 30;
  int64_t ws = 0;
  auto gemm = cuda::Gemm::Create(CUDA_R_16BF, kGemmWorkspaceBytes, &ws);
  if (!gemm.ok()) {
    std::fprintf(stderr, "%s\n", gemm.status().ToString().c_str());
    std::exit(1);
  }
  char* pool;
  void *x, *y, *x8;
  float* scales;
  BENCH_CUDA(cudaMalloc(&pool, pool_bytes));
  constexpr int64_t kMaxRows = 128;
  BENCH_CUDA(cudaMalloc(&x, kMaxRows * std::max(H, I) * 2));
  BENCH_CUDA(cudaMalloc(&y, kMaxRows * c.vocab_size * 4));
  BENCH_CUDA(cudaMalloc(&x8, kMaxRows * std::max(H, I)));
  BENCH_CUDA(cudaMalloc(&scales, 2 * I * 4));
  {
    std::vector<uint16_t> host(size_t{1} << 24);  // random bf16 in [-1, 1), repeated over the pool
    std::mt19937 rng(3);
    for (uint16_t& v : host) v = static_cast<uint16_t>(0x3c00 + (rng() % 0x0300)) | ((rng() & 1) << 15);
    if (fp8) {  // as bytes, finite e4m3 values (exponents 3..13, no NaN)
      auto* b = reinterpret_cast<uint8_t*>(host.data());
      for (size_t i = 0; i < host.size() * 2; ++i) b[i] = static_cast<uint8_t>(0x18 + rng() % 0x50) | (rng() & 0x80);
    }
    for (int64_t off = 0; off < pool_bytes; off += host.size() * 2) {
      BENCH_CUDA(cudaMemcpy(pool + off, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    }
    BENCH_CUDA(cudaMemcpy(x8, host.data(), kMaxRows * std::max(H, I), cudaMemcpyHostToDevice));
    for (uint16_t& v : host) v = static_cast<uint16_t>(0x3c00 + (rng() % 0x0300)) | ((rng() & 1) << 15);
    BENCH_CUDA(cudaMemcpy(x, host.data(), kMaxRows * std::max(H, I) * 2, cudaMemcpyHostToDevice));
    const std::vector<float> ones(2 * I, 1.f / 64);  // per row, or [0] for the whole tensor
    BENCH_CUDA(cudaMemcpy(scales, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
  }
  // Paths: 0 the library GEMM (fp8: CUTLASS's kernel with the per-token and per-channel scales in its epilogue,
  // kernels/fp8_gemm.h, as the layers run it), 1 the streaming kernel's CUDA-core form, 2 its tensor-core form, and
  // for fp8 3 cuBLASLt with per-tensor scales on both sides and 4 cuBLASLt with the per-token and per-channel ones,
  // for comparison. A product's weight and input for the path: fp8 layer weights with their scales; fp8 inputs for
  // the GEMMs.
  const int paths = fp8 ? 5 : 3;
  const auto streaming = [&](int path) { return path == 1 || path == 2; };
  const char* path_names[] = {fp8 ? "CUTLASS scaled" : "cuBLASLt", "CUDA cores", "tensor cores", "cuBLASLt per-tensor",
                              "cuBLASLt scaled"};
  const char* path_keys[] = {fp8 ? "cutlass_ms" : "cublaslt_ms", "streaming_ms", "tensor_core_ms",
                             "cublaslt_per_tensor_ms", "cublaslt_ms"};
  auto weight_at = [&](const char* at, bool lm_head, int path) {
    return fp8 && !lm_head ? cuda::Operand(at, scales, path == 3) : cuda::Operand(at);
  };
  auto input_for = [&](bool lm_head, int path) {
    return fp8 && !lm_head && !streaming(path) ? cuda::Operand(x8, scales, path == 3) : cuda::Operand(x);
  };
  auto weight_bytes = [&](const Shape& sh) { return sh.n * sh.k * (fp8 && !sh.lm_head ? 1 : 2); };
  nlohmann::json out = nlohmann::json::array();
  std::printf("decode-step products (weights streamed; %% of the read ceiling):\n");
  std::printf("%4s %-8s %22s %22s %22s %22s %22s\n", "m", "product", path_names[0], "streaming, CUDA cores",
              "streaming, tensor", fp8 ? "cuBLASLt per-tensor" : "", fp8 ? "cuBLASLt scaled" : "");
  double chain_bytes = 0;
  for (const Shape& sh : shapes) chain_bytes += double(weight_bytes(sh)) * (sh.lm_head ? 1 : c.num_layers);
  // The whole chain of one decode step, captured in one CUDA graph: each layer's products read the next
  // regions of the pool, then the LM head.
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreate(&stream));
  auto set_path = [&](int path) {
    (*gemm)->set_gemv_max_rows(streaming(path) ? kernels::kGemvMaxRows : 0);
    (*gemm)->set_fp8_gemv_max_rows(streaming(path) ? kernels::kGemvMaxRows : 0);
    (*gemm)->set_fp8_cutlass(path != 4);
  };
  // One product on the path: streaming products go to the kernel straight, in the form the path names.
  auto run = [&](int path, const char* w, int64_t m, const Shape& sh) -> absl::Status {
    const auto form = path == 1 ? kernels::GemvForm::kCudaCores : kernels::GemvForm::kTensorCores;
    const auto* xb = static_cast<const __nv_bfloat16*>(x);
    if (fp8 && streaming(path) && !sh.lm_head) {
      const auto* wq = reinterpret_cast<const kernels::Fp8*>(w);
      return cuda::FromCuda(kernels::GemvFp8<__nv_bfloat16, __nv_bfloat16>(
                                xb, wq, scales, nullptr, static_cast<__nv_bfloat16*>(y), m, sh.n, sh.k, stream, form),
                            "kernels::GemvFp8");
    }
    if (streaming(path)) {
      const auto* wb = reinterpret_cast<const __nv_bfloat16*>(w);
      return cuda::FromCuda(sh.lm_head
                                ? kernels::Gemv<__nv_bfloat16, float>(xb, wb, nullptr, static_cast<float*>(y), m, sh.n,
                                                                      sh.k, stream, 0, form)
                                : kernels::Gemv<__nv_bfloat16, __nv_bfloat16>(
                                      xb, wb, nullptr, static_cast<__nv_bfloat16*>(y), m, sh.n, sh.k, stream, 0, form),
                            "kernels::Gemv");
    }
    return (*gemm)->Run(input_for(sh.lm_head, path), weight_at(w, sh.lm_head, path), y, m, sh.n, sh.k, nullptr,
                        sh.lm_head, stream);
  };
  auto chain_ms = [&](int64_t m, int path) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    int64_t off = 0;
    BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int layer = 0; layer <= c.num_layers; ++layer) {
      for (const Shape& sh : shapes) {
        if (sh.lm_head != (layer == c.num_layers)) continue;
        const int64_t bytes = weight_bytes(sh);
        if (off + bytes > pool_bytes) off = 0;
        const absl::Status st = run(path, pool + off, m, sh);
        if (!st.ok()) std::fprintf(stderr, "%s\n", st.ToString().c_str());
        off += bytes;
      }
    }
    BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
    BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    const double ms =
        TimeMs([&] { return cuda::FromCuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch"); }, 3, 9, stream);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return ms;
  };
  for (int64_t m : {1, 2, 3, 4, 5, 6, 8, 16, 64, 128}) {
    double chain[5] = {0, 0, 0, 0, 0};
    for (int path = 0; path < paths; ++path) {
      if (streaming(path) && m > kernels::kGemvMaxRows) continue;
      set_path(path);
      if (fp8 && path == 0) {  // CUTLASS's tile for each shape measured first, as the engine's start-up does
        for (const Shape& sh : shapes) {
          if (sh.lm_head) continue;
          std::vector<cuda::Operand> weights;
          for (int64_t off = 0; off + weight_bytes(sh) <= pool_bytes && weights.size() < 8; off += weight_bytes(sh)) {
            weights.push_back(weight_at(pool + off, false, path));
          }
          const auto tuned = (*gemm)->Tune(input_for(false, path), weights, y, m, sh.n, sh.k, nullptr, false, stream);
          if (!tuned.ok()) std::fprintf(stderr, "%s\n", tuned.status().ToString().c_str());
        }
      }
      chain[path] = chain_ms(m, path);
    }
    for (const Shape& sh : shapes) {
      const int64_t bytes = weight_bytes(sh);
      const int64_t regions = std::max<int64_t>(1, pool_bytes / bytes);
      double ms[5] = {0, 0, 0, 0, 0};
      for (int path = 0; path < paths; ++path) {
        if (streaming(path) && m > kernels::kGemvMaxRows) continue;
        set_path(path);
        int64_t i = 0;
        ms[path] = TimeMs([&] { return run(path, pool + (i++ % regions) * bytes, m, sh); }, 3, 21, stream);
      }
      auto cell = [&](double t) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%7.1f us %5.1f%%", 1e3 * t, 100 * bytes / (t * 1e-3) / (read_tbs * 1e12));
        return t > 0 ? std::string(buf) : std::string("-");
      };
      std::printf("%4lld %-8s %22s %22s %22s %22s %22s\n", static_cast<long long>(m), sh.name, cell(ms[0]).c_str(),
                  cell(ms[1]).c_str(), cell(ms[2]).c_str(), fp8 ? cell(ms[3]).c_str() : "",
                  fp8 ? cell(ms[4]).c_str() : "");
      nlohmann::json row = {{"m", m}, {"product", sh.name}, {"bytes", bytes}};
      for (int path = 0; path < paths; ++path) row[path_keys[path]] = ms[path];
      out.push_back(row);
    }
    for (int path = 0; path < paths; ++path) {
      if (chain[path] <= 0) continue;
      std::printf("%4lld chain in a graph, %-12s %7.2f ms  %.2f TB/s  %5.1f%%\n", static_cast<long long>(m),
                  path_names[path], chain[path], chain_bytes / (chain[path] * 1e-3) / 1e12,
                  100 * chain_bytes / (chain[path] * 1e-3) / (read_tbs * 1e12));
      out.push_back({{"m", m}, {"product", "chain"}, {"bytes", chain_bytes}, {path_keys[path], chain[path]}});
    }
  }
  cudaStreamDestroy(stream);
  cudaFree(pool);
  cudaFree(x);
  cudaFree(y);
  cudaFree(x8);
  cudaFree(scales);
  return out;
}

// Submits one request of random prompt tokens (greedy, ignore_eos) without waiting.
// Every prompt is different, so no request reuses another's cached prefix.
std::shared_ptr<BenchSink> Start(Engine& engine, int32_t prompt_len, int32_t new_tokens) {
  static std::atomic<uint32_t> serial{0};
  const uint32_t n = serial++;
  std::mt19937 rng(n);
  Request r;
  r.id = "bench-" + std::to_string(n);
  // Token ids drawn over the whole vocabulary, as `inferd-bench serve` draws them: a GEMM's power draw, and with
  // it the clock the GPU holds, depends on its operands, so a narrower draw would time other work.
  std::uniform_int_distribution<int32_t> id(10, engine.model().config.vocab_size - 1);
  for (int32_t i = 0; i < prompt_len; ++i) r.prompt.push_back(id(rng));
  r.sampling.temperature = 0;
  r.stopping.max_tokens = new_tokens;
  r.stopping.ignore_eos = true;
  return SubmitOrExit(engine, std::move(r));
}

std::shared_ptr<BenchSink> Run(Engine& engine, int32_t prompt_len, int32_t new_tokens, absl::Time* submitted) {
  *submitted = absl::Now();
  auto sink = Start(engine, prompt_len, new_tokens);
  WaitOk(*sink);
  return sink;
}

// Share of wall time between two stats snapshots in which the device ran no step.
double IdleShare(const EngineStats& a, const EngineStats& b, double wall_s) {
  return wall_s > 0 ? std::max(0.0, 1.0 - (b.device_busy_s - a.device_busy_s) / wall_s) : 0.0;
}

int Main(int argc, char** argv) {
  std::string model, json_path;
  std::string sections = "products,latency,prefill,decode,throughput";
  std::vector<int32_t> batches = {1, 8, 32, 64, 128, 256};
  bool graphs = true;
  std::string plan_ahead = "auto";
  int32_t profile_steps = 0;
  int32_t prefill_idle_ms = 1000;
  int32_t decode_context = 512;
  std::string quantization = "none";
  std::string kv_cache_dtype = "auto";
  int32_t tensor_parallel = 1;
  std::string load_format = "auto";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 < argc && a == "--sections") sections = argv[++i];
    if (i + 1 < argc && a == "--model") model = argv[++i];
    if (i + 1 < argc && a == "--json") json_path = argv[++i];
    if (a == "--no-graphs") graphs = false;
    if (i + 1 < argc && a == "--plan-ahead") plan_ahead = argv[++i];
    if (i + 1 < argc && a == "--profile-steps") profile_steps = std::atoi(argv[++i]);
    if (i + 1 < argc && a == "--prefill-idle-ms") prefill_idle_ms = std::atoi(argv[++i]);
    if (i + 1 < argc && a == "--decode-context") decode_context = std::atoi(argv[++i]);
    if (i + 1 < argc && a == "--quantization") quantization = argv[++i];
    if (i + 1 < argc && a == "--kv-cache-dtype") kv_cache_dtype = argv[++i];
    if (i + 1 < argc && a == "--tensor-parallel") tensor_parallel = std::atoi(argv[++i]);
    if (i + 1 < argc && a == "--load-format") load_format = argv[++i];
    if (i + 1 < argc && a == "--batches") {
      batches.clear();
      for (absl::string_view b : absl::StrSplit(argv[++i], ',')) batches.push_back(std::atoi(std::string(b).c_str()));
    }
  }
  if (model.empty()) {
    std::fprintf(stderr,
                 "usage: inferd-bench --model DIR [--json FILE] [--sections LIST] [--batches B,...] [--no-graphs]\n"
                 "       [--plan-ahead auto|on|off] [--profile-steps N] [--prefill-idle-ms MS] [--quantization Q]\n"
                 "       [--kv-cache-dtype auto|fp8_e4m3] [--tensor-parallel N] [--load-format auto|dummy]\n"
                 "       [--decode-context N]\n"
                 "  LIST: comma-separated of products,latency,prefill,decode,throughput (default: all)\n"
                 "  B: the decode section's batch sizes (default 1,8,32,64,128,256)\n"
                 "  --no-graphs: decode steps launched kernel by kernel (engine.cuda_graphs: false)\n"
                 "  --plan-ahead: engine.plan_ahead (default auto: on for cuda)\n"
                 "  --profile-steps N: log where each of the first N steps' time went (engine.profile_steps)\n"
                 "  --prefill-idle-ms MS: the GPU's idle time before each timed prompt of the prefill section "
                 "(default 1000)\n"
                 "  --quantization none|fp8: engine.quantization (FLOPs utilisation then against the fp8 GEMM "
                 "ceiling)\n"
                 "  --kv-cache-dtype auto|fp8_e4m3: engine.kv_cache_dtype\n"
                 "  --tensor-parallel N: engine.tensor_parallel_size (the model split over GPUs 0..N-1)\n"
                 "  --load-format dummy: model.load_format (config.json alone; random weights made on the GPUs)\n"
                 "  --decode-context N: the decode section's prompt length (default 512)\n");
    return 2;
  }
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  // Warm the GPU up (it idles at low clocks) with the ceiling kernels themselves, then measure them.
  ReadCeilingTBs();
  const double read_tbs = ReadCeilingTBs();
  const double bf16_tflops = GemmCeilingTflops(false);
  const double fp8_tflops = GemmCeilingTflops(true);
  const bool fp8 = quantization == "fp8";
  const double gemm_tflops = fp8 ? fp8_tflops : bf16_tflops;  // what the prefill's FLOPs utilisation is against
  std::printf("device %s: read-streaming %.2f TB/s, GEMM 8192^3 bf16 %.0f TFLOP/s, fp8 e4m3 %.0f TFLOP/s\n", prop.name,
              read_tbs, bf16_tflops, fp8_tflops);
  const auto want = [&](const std::string& name) {
    return absl::StrContains(absl::StrCat(",", sections, ","), absl::StrCat(",", name, ","));
  };
  nlohmann::json products, tiles;
  if (want("products") || (want("tiles") && fp8)) {  // the layers' shapes, from config.json alone
    std::ifstream f(model + "/config.json");
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    auto mc = ParseModelConfig(text);
    if (!mc.ok()) {
      std::fprintf(stderr, "%s/config.json: %s\n", model.c_str(), mc.status().ToString().c_str());
      return 1;
    }
    if (want("products")) products = DecodeProducts(*mc, read_tbs, fp8);
    if (want("tiles") && fp8) tiles = Fp8TileProducts(*mc, read_tbs, fp8_tflops);
  }

  Config config;
  config.model.path = model;
  config.model.load_format = load_format;
  config.engine.backend = "cuda";
  config.engine.cuda_graphs = graphs;
  config.engine.plan_ahead = plan_ahead;
  config.engine.profile_steps = profile_steps;
  config.engine.quantization = quantization;
  config.engine.kv_cache_dtype = kv_cache_dtype;
  config.engine.tensor_parallel_size = tensor_parallel;
  config.scheduler.max_num_seqs = 256;
  config.scheduler.max_num_batched_tokens = 8192;
  config.scheduler.max_queue = 1000;
  const absl::Time t0 = absl::Now();
  auto engine = Engine::Create(config);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  const double startup_s = absl::ToDoubleSeconds(absl::Now() - t0);
  const ModelConfig& c = (*engine)->model().config;
  const MemoryPlan& plan = (*engine)->memory_plan();
  // Bytes and FLOPs per step counted as the live metrics count them (engine/runtime/step_cost.h).
  const StepCostModel cost(c, plan, config.engine.block_size, tensor_parallel);
  nlohmann::json out = {{"device", prop.name},
                        {"read_ceiling_tb_s", read_tbs},
                        {"gemm_ceiling_tflop_s", bf16_tflops},
                        {"fp8_gemm_ceiling_tflop_s", fp8_tflops},
                        {"quantization", quantization},
                        {"kv_cache_dtype", kv_cache_dtype},
                        {"tensor_parallel_size", tensor_parallel},
                        {"startup_s", startup_s},
                        {"weight_bytes", plan.weight_bytes},
                        {"decode_products", products},
                        {"fp8_tiles", tiles},
                        {"memory_plan",
                         {{"device_free_bytes", plan.device_free_bytes},
                          {"budget_bytes", plan.budget_bytes},
                          {"weight_bytes", plan.weight_bytes},
                          {"activation_bytes", plan.activation_bytes},
                          {"other_bytes", plan.other_bytes},
                          {"kv_bytes_per_block", plan.kv_bytes_per_block},
                          {"num_blocks", plan.num_blocks}}}};

  absl::Time submitted;
  Run(**engine, 128, 16, &submitted);  // warm-up
  // Latency: 128-token prompt, 256 new tokens.
  if (want("latency")) {
    const EngineStats s0 = (*engine)->Stats();
    auto lat = Run(**engine, 128, 256, &submitted);
    const double decode_s = absl::ToDoubleSeconds(lat->times.back() - lat->times.front());
    const double tok_s = (lat->times.size() - 1) / decode_s;
    const double step_bytes = cost.OfUniform(1, 1, 128 + 128, 1).bytes;  // the mean decode step
    const double mbu = step_bytes * tok_s / (read_tbs * 1e12);
    const double idle = IdleShare(s0, (*engine)->Stats(), absl::ToDoubleSeconds(lat->times.back() - submitted));
    std::printf("%-28s %10.1f tok/s  %7.2f ms/token  bandwidth utilisation %.1f%%  GPU idle %.1f%%\n",
                "latency (decode, batch 1)", tok_s, 1e3 / tok_s, 100 * mbu, 100 * idle);
    out["latency"] = {{"tokens_per_s", tok_s},
                      {"ms_per_token", 1e3 / tok_s},
                      {"bandwidth_utilisation", mbu},
                      {"gpu_idle_share", idle}};
  }
  // Prefill: each prompt timed after the GPU has sat idle for prefill_idle_ms, as a lone request arrives. A
  // FLOPs-bound step's speed depends on the power drawn in the second before it (back to back, a 4096-token
  // prefill takes ~5% longer on the H100), so every timed prompt starts from the same state; the median of
  // kPrefillRuns is reported.
  constexpr int kPrefillRuns = 5;
  for (int32_t len : {512, 4096}) {
    if (!want("prefill")) break;
    Run(**engine, len, 1, &submitted);  // warm this shape
    std::vector<double> ttfts;
    for (int i = 0; i < kPrefillRuns; ++i) {
      absl::SleepFor(absl::Milliseconds(prefill_idle_ms));
      auto p = Run(**engine, len, 1, &submitted);
      ttfts.push_back(absl::ToDoubleSeconds(p->times.front() - submitted));
    }
    std::sort(ttfts.begin(), ttfts.end());
    const double ttft = ttfts[kPrefillRuns / 2];
    const double flops = cost.OfUniform(1, len, len, 1).flops;
    const double mfu = flops / ttft / (gemm_tflops * 1e12);
    std::printf("%-28s %10.0f tok/s  TTFT %7.1f ms (%.1f-%.1f)  FLOPs utilisation %.1f%%\n",
                ("prefill " + std::to_string(len)).c_str(), len / ttft, 1e3 * ttft, 1e3 * ttfts.front(),
                1e3 * ttfts.back(), 100 * mfu);
    out["prefill_" + std::to_string(len)] = {{"tokens_per_s", len / ttft},
                                             {"ttft_ms", 1e3 * ttft},
                                             {"ttft_ms_runs", ttfts},
                                             {"idle_before_ms", prefill_idle_ms},
                                             {"flops_utilisation", mfu}};
  }
  // Decode at batch B: B requests of decode_context prompt tokens (512 unless --decode-context) and 128 new ones
  // started together; decode tokens/s from the moment the last one has its first token.
  for (int32_t B : batches) {
    if (!want("decode")) break;
    std::vector<std::shared_ptr<BenchSink>> sinks;
    const EngineStats before = (*engine)->Stats();
    const absl::Time started = absl::Now();
    for (int32_t i = 0; i < B; ++i) sinks.push_back(Start(**engine, decode_context, 128));
    for (auto& s : sinks) WaitOk(*s);
    const double idle = IdleShare(before, (*engine)->Stats(), absl::ToDoubleSeconds(absl::Now() - started));
    absl::Time t0 = absl::InfinitePast(), t1 = absl::InfinitePast();
    for (auto& s : sinks) {
      t0 = std::max(t0, s->times.front());
      t1 = std::max(t1, s->times.back());
    }
    int64_t after = 0;
    for (auto& s : sinks) {
      for (const absl::Time& t : s->times) after += t > t0;
    }
    const double secs = absl::ToDoubleSeconds(t1 - t0);
    const double rate = secs > 0 ? after / secs : 0;
    const double bytes = cost.OfUniform(B, 1, decode_context + 64, B).bytes;  // the mean decode step
    const double util = rate > 0 ? bytes * (rate / B) / (read_tbs * 1e12) : 0;
    std::printf("%-28s %10.0f tok/s  %7.2f ms/step   bandwidth utilisation %.1f%%  GPU idle %.1f%%\n",
                ("decode, batch " + std::to_string(B)).c_str(), rate, rate > 0 ? 1e3 * B / rate : 0, 100 * util,
                100 * idle);
    out["decode_batch" + std::to_string(B)] = {
        {"tokens_per_s", rate}, {"bandwidth_utilisation", util}, {"gpu_idle_share", idle}};
  }
  // Throughput: 1000 requests of 512 + 128 tokens submitted at once.
  if (want("throughput")) {
    const EngineStats a = (*engine)->Stats();
    const absl::Time t0 = absl::Now();
    std::vector<std::shared_ptr<BenchSink>> sinks;
    for (int32_t i = 0; i < 1000; ++i) sinks.push_back(Start(**engine, 512, 128));
    for (auto& s : sinks) WaitOk(*s);
    const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
    const double idle_t = IdleShare(a, (*engine)->Stats(), secs);
    std::printf("%-28s %10.0f tok/s total, %.0f generated tok/s, %.1f s, GPU idle %.1f%%\n",
                "throughput (1000 x 512+128)", 1000 * 640 / secs, 1000 * 128 / secs, secs, 100 * idle_t);
    out["throughput"] = {{"total_tokens_per_s", 1000 * 640 / secs},
                         {"generated_tokens_per_s", 1000 * 128 / secs},
                         {"seconds", secs},
                         {"gpu_idle_share", idle_t}};
  }
  std::printf("start-up %.1f s\n", startup_s);
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(1) << "\n";
  return 0;
}

}  // namespace
}  // namespace inferd

#endif  // INFERD_WITH_CUDA

int main(int argc, char** argv) {
  if (argc > 2 && std::string(argv[1]) == "serve" && std::string(argv[2]) == "--multi-turn") {
    return inferd::MultiTurnMain(argc, argv);
  }
  if (argc > 1 && std::string(argv[1]) == "serve") return inferd::ServeMain(argc, argv);
  if (argc > 1 && std::string(argv[1]) == "perplexity") return inferd::PerplexityMain(argc, argv);
  if (argc > 1 && std::string(argv[1]) == "speculative") return inferd::SpecMain(argc, argv);
  if (argc > 1 && std::string(argv[1]) == "cpu") return inferd::CpuBenchMain(argc, argv);
#if INFERD_WITH_CUDA
  return inferd::Main(argc, argv);
#else
  std::fprintf(stderr,
               "inferd-bench: built without CUDA: only `inferd-bench serve`, `perplexity`, `speculative` and `cpu` are "
               "available\n");
  return 2;
#endif
}

// A mixture-of-experts block with fp8 experts (e4m3, a scale per row of each expert), both ways the cuda backend
// runs it, against the same arithmetic on the CPU (the cpu backend's routing; sums in fp64; the device's roundings):
// - streamed (decode): the rows in bf16 against the e4m3 weights (MoeExpertGemv, MoeRowGatedGemv,
//   MoeRowDownCombine with scales), and the few-row path bit for bit the grouped one;
// - grouped (prefill, sm_90a): the rows quantized per slot (MoeGatherFp8), CUTLASS's fp8 grouped GEMM into fp32
//   sums rounded to bf16, MoeActivateMulFp8 (scales, SiLU·mul, quantized again), the down GEMM, MoeCombineFp8.
// Experts no row chose, odd row counts and inner dimensions of several 16-byte chunks are among the cases; the
// grouped block also captured in a CUDA graph and replayed with another routing, as decode steps run it.
#include "kernels/moe_fp8.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/model/moe_routing.h"
#include "kernels/elementwise.h"
#include "kernels/fp8.h"
#include "kernels/moe_grouped_gemm.h"
#include "kernels/moe_products.h"
#include "kernels/moe_routing.h"
#include "tests/gpu/gpu_test_util.h"

namespace inferd {
namespace {

using kernels::Fp8;
using testing::Bf;
using testing::Deq;
using testing::Dev;
using testing::HaveGpu;
using testing::QuantizeRow;
namespace k = kernels;

// Rows of [rows, cols] quantized one by one.
struct Quantized {
  std::vector<Fp8> q;
  std::vector<float> scale;
};
Quantized QuantizeRows(const std::vector<float>& v, int64_t rows, int64_t cols) {
  Quantized out{std::vector<Fp8>(rows * cols), std::vector<float>(rows)};
  for (int64_t r = 0; r < rows; ++r) out.scale[r] = QuantizeRow(v.data() + r * cols, cols, out.q.data() + r * cols);
  return out;
}

float Silu(float g) {
  return g / (1.f + std::exp(-g));
}

struct Case {
  int64_t rows;
  int32_t experts, topk;
  bool normalize;
  int64_t hidden, inter;
};

struct Block {
  Case c;
  std::vector<float> x, logits;
  Quantized gate_up, down;  // [experts · 2 · inter, hidden] and [experts · hidden, inter]
};

Block MakeBlock(const Case& c) {
  std::mt19937 rng(static_cast<uint32_t>(c.rows * 13 + c.experts));
  std::normal_distribution<float> d(0.f, 1.f);
  Block b{c, std::vector<float>(c.rows * c.hidden), std::vector<float>(c.rows * c.experts), {}, {}};
  for (float& v : b.x) v = Bf(d(rng));
  for (float& v : b.logits) v = 2.f * d(rng);
  std::vector<float> gate_up(int64_t{c.experts} * 2 * c.inter * c.hidden),
      down(int64_t{c.experts} * c.hidden * c.inter);
  for (float& v : gate_up) v = Bf(0.1f * d(rng));
  for (float& v : down) v = Bf(0.1f * d(rng));
  b.gate_up = QuantizeRows(gate_up, int64_t{c.experts} * 2 * c.inter, c.hidden);
  b.down = QuantizeRows(down, int64_t{c.experts} * c.hidden, c.inter);
  return b;
}

// Σ_i a[i] · deq(q[i]) in fp64.
double Dot(const float* a, const Fp8* q, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(a[i]) * Deq(q[i]);
  return s;
}

// The block on the CPU. quantized_inputs: each product's input row through e4m3 too (the grouped path), the sums
// rounded to bf16 (the grouped GEMM's output) and times the row's scale; else the rows as they are (bf16).
std::vector<float> Reference(const Block& b, bool quantized_inputs) {
  const Case& c = b.c;
  const auto sum = [&](double s) { return quantized_inputs ? Bf(float(s)) : float(s); };
  std::vector<float> want(c.rows * c.hidden);
  for (int64_t r = 0; r < c.rows; ++r) {
    std::vector<float> p(b.logits.begin() + r * c.experts, b.logits.begin() + (r + 1) * c.experts);
    std::vector<int32_t> order, ids(c.topk);
    std::vector<float> route(c.topk);
    RouteRow(p.data(), c.experts, c.topk, c.normalize, order, ids.data(), route.data());
    std::vector<float> x(b.x.begin() + r * c.hidden, b.x.begin() + (r + 1) * c.hidden);
    float x_scale = 1.f;
    if (quantized_inputs) {
      std::vector<Fp8> q(c.hidden);
      x_scale = QuantizeRow(x.data(), c.hidden, q.data());
      for (int64_t i = 0; i < c.hidden; ++i) x[i] = Deq(q[i]);
    }
    std::vector<double> acc(c.hidden, 0.0);
    for (int32_t j = 0; j < c.topk; ++j) {
      const int64_t e = ids[j];
      std::vector<float> act(c.inter);
      for (int64_t i = 0; i < c.inter; ++i) {
        const int64_t g_row = e * 2 * c.inter + i, u_row = g_row + c.inter;
        const float g =
            Bf(sum(Dot(x.data(), b.gate_up.q.data() + g_row * c.hidden, c.hidden)) * x_scale * b.gate_up.scale[g_row]);
        const float u =
            Bf(sum(Dot(x.data(), b.gate_up.q.data() + u_row * c.hidden, c.hidden)) * x_scale * b.gate_up.scale[u_row]);
        act[i] = Bf(Bf(Silu(g)) * u);
      }
      float act_scale = 1.f;
      if (quantized_inputs) {
        std::vector<Fp8> q(c.inter);
        act_scale = QuantizeRow(act.data(), c.inter, q.data());
        for (int64_t i = 0; i < c.inter; ++i) act[i] = Deq(q[i]);
      }
      for (int64_t col = 0; col < c.hidden; ++col) {
        const int64_t row = e * c.hidden + col;
        const float y =
            Bf(sum(Dot(act.data(), b.down.q.data() + row * c.inter, c.inter)) * act_scale * b.down.scale[row]);
        acc[col] += route[j] * y;
      }
    }
    for (int64_t col = 0; col < c.hidden; ++col) want[r * c.hidden + col] = Bf(float(acc[col]));
  }
  return want;
}

// Within a few bf16 steps of the outputs' scale: the sums run in another order, so a rounding of an intermediate
// (or an e4m3 rounding of an activation) may land a step apart.
void ExpectNear(const std::vector<__nv_bfloat16>& got, const std::vector<float>& want, const char* what,
                const Case& c) {
  double scale = 0, worst = 0;
  for (float v : want) scale = std::max(scale, double(std::abs(v)));
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = __bfloat162float(got[i]);
    worst = std::isnan(g) ? INFINITY : std::max(worst, std::abs(g - want[i]));
  }
  EXPECT_GT(scale, 0.0);
  EXPECT_LT(worst, 4.0 / 128 * scale) << what << ": " << c.rows << " rows, " << c.experts << " experts, top " << c.topk
                                      << ": worst " << worst << " against outputs up to " << scale;
}

// The routing on the device; ids, weights, offsets, sorted slots and their places.
struct Routing {
  explicit Routing(const Block& b)
      : slots(b.c.rows * b.c.topk),
        logits(b.logits),
        ids(slots),
        weights(slots),
        counts(std::vector<int32_t>(b.c.experts, 0)),
        offsets(b.c.experts + 1),
        sorted(slots),
        positions(slots) {}
  int64_t slots;
  Dev<float> logits;
  Dev<int32_t> ids;
  Dev<float> weights;
  Dev<int32_t> counts, offsets, sorted, positions;
};

void RunStreamed(const Case& c) {
  const Block b = MakeBlock(c);
  Routing rt(b);
  const int64_t S = rt.slots;
  Dev<__nv_bfloat16> x(testing::ToBf16(b.x));
  Dev<Fp8> gu(b.gate_up.q), dn(b.down.q);
  Dev<float> gu_scale(b.gate_up.scale), dn_scale(b.down.scale);
  Dev<__nv_bfloat16> xs(S * c.hidden), gus(S * 2 * c.inter), acts(S * c.inter), ys(S * c.hidden),
      out(c.rows * c.hidden);
  CUDA_OK(k::MoeRoute(rt.logits.get(), c.rows, c.experts, c.topk, c.normalize, rt.ids.get(), rt.weights.get(),
                      rt.counts.get(), rt.offsets.get(), rt.sorted.get(), rt.positions.get(), nullptr));
  CUDA_OK(k::MoeGather(x.get(), rt.sorted.get(), S, c.topk, c.hidden, xs.get(), nullptr));
  CUDA_OK(k::MoeExpertGemv(xs.get(), gu.get(), gu_scale.get(), rt.offsets.get(), c.experts, gus.get(), 2 * c.inter,
                           c.hidden, nullptr));
  CUDA_OK(k::ActivateMul(gus.get(), acts.get(), S, c.inter, k::GatedActivation::kSilu, nullptr));
  CUDA_OK(k::MoeExpertGemv(acts.get(), dn.get(), dn_scale.get(), rt.offsets.get(), c.experts, ys.get(), c.hidden,
                           c.inter, nullptr));
  CUDA_OK(k::MoeCombine(ys.get(), rt.positions.get(), rt.weights.get(), c.rows, c.topk, c.hidden, out.get(), nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<__nv_bfloat16> grouped = out.Host();
  ExpectNear(grouped, Reference(b, /*quantized_inputs=*/false), "streamed", c);
  // The few-row path: bit for bit the grouped streaming path.
  Dev<__nv_bfloat16> row_out(c.rows * c.hidden);
  CUDA_OK(k::MoeTopK(rt.logits.get(), c.rows, c.experts, c.topk, c.normalize, rt.ids.get(), rt.weights.get(), nullptr));
  CUDA_OK(k::MoeRowGatedGemv(x.get(), gu.get(), gu_scale.get(), rt.ids.get(), c.rows, c.topk, acts.get(), c.inter,
                             c.hidden, k::GatedActivation::kSilu, nullptr));
  CUDA_OK(k::MoeRowDownCombine(acts.get(), dn.get(), dn_scale.get(), rt.ids.get(), rt.weights.get(), c.rows, c.topk,
                               row_out.get(), c.hidden, c.inter, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<__nv_bfloat16> by_row = row_out.Host();
  int64_t differ = 0;
  for (size_t i = 0; i < by_row.size(); ++i) differ += std::memcmp(&by_row[i], &grouped[i], 2) != 0;
  EXPECT_EQ(differ, 0) << c.rows << " rows, " << c.experts << " experts: the few-row path against the grouped one";
}

// short_runs: the grouped GEMM told the step's slots (its schedule for runs under 128 rows on average). in_graph:
// the block captured once in a CUDA graph, as a decode step's, and replayed after the router's logits changed (so
// every run's length moves): its output is that of the new routing.
void RunGrouped(const Case& c, bool short_runs, bool in_graph = false) {
  Block b = MakeBlock(c);
  Routing rt(b);
  const int64_t S = rt.slots;
  Dev<__nv_bfloat16> x(testing::ToBf16(b.x));
  Dev<Fp8> gu(b.gate_up.q), dn(b.down.q);
  Dev<float> gu_scale(b.gate_up.scale), dn_scale(b.down.scale);
  Dev<Fp8> xq(S * c.hidden), act_q(S * c.inter);
  Dev<float> x_scales(S), act_scales(S);
  Dev<__nv_bfloat16> gate_up_sums(S * 2 * c.inter), out_sums(S * c.hidden);
  Dev<__nv_bfloat16> out(c.rows * c.hidden);
  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t ws_bytes = k::MoeGroupedGemmWorkspaceBytes(c.experts, sms);
  void* ws = nullptr;
  CUDA_OK(cudaMalloc(&ws, ws_bytes));
  const int64_t hint = short_runs ? S : 0;
  const auto block = [&](cudaStream_t st) {
    CUDA_OK(k::MoeRoute(rt.logits.get(), c.rows, c.experts, c.topk, c.normalize, rt.ids.get(), rt.weights.get(),
                        rt.counts.get(), rt.offsets.get(), rt.sorted.get(), rt.positions.get(), st));
    CUDA_OK(k::MoeGatherFp8(x.get(), rt.sorted.get(), S, c.topk, c.hidden, xq.get(), x_scales.get(), st));
    CUDA_OK(k::MoeGroupedGemmFp8(xq.get(), gu.get(), rt.offsets.get(), c.experts, gate_up_sums.get(), 2 * c.inter,
                                 c.hidden, ws, ws_bytes, sms, st, hint));
    CUDA_OK(k::MoeActivateMulFp8<__nv_bfloat16>(gate_up_sums.get(), x_scales.get(), gu_scale.get(), rt.ids.get(),
                                                rt.sorted.get(), S, c.inter, k::GatedActivation::kSilu, act_q.get(),
                                                act_scales.get(), st));
    CUDA_OK(k::MoeGroupedGemmFp8(act_q.get(), dn.get(), rt.offsets.get(), c.experts, out_sums.get(), c.hidden, c.inter,
                                 ws, ws_bytes, sms, st, hint));
    CUDA_OK(k::MoeCombineFp8(out_sums.get(), act_scales.get(), dn_scale.get(), rt.ids.get(), rt.positions.get(),
                             rt.weights.get(), c.rows, c.topk, c.hidden, out.get(), st));
  };
  if (!in_graph) {
    ASSERT_NO_FATAL_FAILURE(block(nullptr));
    // Each slot's row as MoeGatherFp8 quantized it: bit for bit the CPU's rounding of its bf16 row.
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<int32_t> sorted = rt.sorted.Host();
    const std::vector<Fp8> got_q = xq.Host();
    const std::vector<float> got_scales = x_scales.Host();
    std::vector<float> row(c.hidden);
    std::vector<Fp8> want(c.hidden);
    int64_t wrong = 0;
    for (int64_t i = 0; i < S; ++i) {
      const int64_t r = sorted[i] / c.topk;
      for (int64_t j = 0; j < c.hidden; ++j) row[j] = Bf(b.x[r * c.hidden + j]);
      wrong += QuantizeRow(row.data(), c.hidden, want.data()) != got_scales[i];
      for (int64_t j = 0; j < c.hidden; ++j) wrong += want[j].__x != got_q[i * c.hidden + j].__x;
    }
    EXPECT_EQ(wrong, 0) << c.rows << " rows: the gathered rows' e4m3 values and scales";
    // SiLU·mul's values read once (rows of whole vectors of 8 up to 1,024, aligned) against the same sums one element
    // off alignment (each value computed twice): bit for bit.
    Dev<__nv_bfloat16> moved(S * 2 * c.inter + 1);
    CUDA_OK(cudaMemcpy(moved.get() + 1, gate_up_sums.get(), S * 2 * c.inter * sizeof(__nv_bfloat16),
                       cudaMemcpyDeviceToDevice));
    Dev<Fp8> act_q_moved(S * c.inter);
    Dev<float> act_scales_moved(S);
    CUDA_OK(k::MoeActivateMulFp8<__nv_bfloat16>(moved.get() + 1, x_scales.get(), gu_scale.get(), rt.ids.get(),
                                                rt.sorted.get(), S, c.inter, k::GatedActivation::kSilu,
                                                act_q_moved.get(), act_scales_moved.get(), nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<Fp8> act_a = act_q.Host(), act_b = act_q_moved.Host();
    const std::vector<float> scale_a = act_scales.Host(), scale_b = act_scales_moved.Host();
    int64_t differ = 0;
    for (size_t i = 0; i < act_a.size(); ++i) differ += act_a[i].__x != act_b[i].__x;
    for (int64_t i = 0; i < S; ++i) differ += std::memcmp(&scale_a[i], &scale_b[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0) << c.rows << " rows: SiLU·mul's quantized rows, aligned against one element off";
  } else {
    cudaStream_t st = nullptr;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    ASSERT_NO_FATAL_FAILURE(block(st));
    CUDA_OK(cudaStreamEndCapture(st, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphLaunch(exec, st));
    std::mt19937 rng(static_cast<uint32_t>(c.rows * 5 + 1));
    std::normal_distribution<float> d(0.f, 2.f);
    for (float& v : b.logits) v = d(rng);  // another routing, replayed by the same graph
    CUDA_OK(cudaMemcpyAsync(rt.logits.get(), b.logits.data(), b.logits.size() * 4, cudaMemcpyHostToDevice, st));
    CUDA_OK(cudaGraphLaunch(exec, st));
    CUDA_OK(cudaStreamSynchronize(st));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
  }
  CUDA_OK(cudaDeviceSynchronize());
  cudaFree(ws);
  ExpectNear(out.Host(), Reference(b, /*quantized_inputs=*/true),
             in_graph     ? "grouped, replayed in a graph"
             : short_runs ? "grouped, short runs"
                          : "grouped",
             c);
}

const Case kCases[] = {
    {1, 8, 2, true, 256, 96},      // one row: most experts get none
    {5, 8, 2, true, 256, 96},      //
    {40, 128, 8, false, 128, 64},  // Qwen3-MoE's routing: many experts with no row, some with several
    {37, 16, 4, true, 64, 48},     //
    {300, 16, 4, true, 512, 160},  // runs of ~75 rows: several of CUTLASS's 128-row tiles among them
    {3, 16, 4, true, 2064, 208},   // rows of 129 e4m3 chunks: several batches of loads and a partial one
    {1100, 16, 4, true, 64, 48},   // 4,400 slots: prefill's SiLU·mul pass, a warp a slot
    {1100, 16, 4, true, 64, 784},  // the same with 98 vectors of 8 a row: lanes of 3 and of 4 in registers
};

TEST(MoeFp8, StreamedExpertsMatchTheCpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  for (const Case& c : kCases) RunStreamed(c);
}

TEST(MoeFp8, GroupedExpertsMatchTheCpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  int device = 0;
  CUDA_OK(cudaGetDevice(&device));
  if (!k::MoeGroupedGemmAvailable(device)) GTEST_SKIP() << "the grouped GEMM needs compute capability 9.0 (sm_90a)";
  for (const Case& c : kCases) {
    for (bool short_runs : {false, true}) RunGrouped(c, short_runs);
    RunGrouped(c, /*short_runs=*/true, /*in_graph=*/true);
  }
}

}  // namespace
}  // namespace inferd

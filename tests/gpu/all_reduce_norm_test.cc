// The one-shot peer sum fused with the residual add and RMSNorm after it (kernels::PeerAllReduceAddRmsNorm) against
// the two kernels it replaces, run on the same ranks: PeerAllReduceSum, then AddRmsNorm (out in T) or
// AddRmsNormFp8 (out quantized per row). Every rank's residual and output must hold the reference's bits. Random
// bf16 and fp16 rows of odd widths (fewer vectors than threads, a width no thread count divides), more rows than the
// kernel has blocks (a block takes several rows), plain sums between the fused calls (the inbox slots alternate
// across both kinds of call); 2 and 4 ranks sharing this GPU, and where there are GPUs enough each rank on a GPU of
// its own, directly and captured in one CUDA graph per rank and replayed.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/all_reduce.h"
#include "kernels/elementwise.h"
#include "kernels/fp8.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/peer_group.h"

namespace inferd {
namespace {

using testing::FromFloatHost;
using testing::GpuCount;
using testing::HaveGpu;
using testing::PeerTestGroup;
namespace k = kernels;

constexpr float kEps = 1e-5f;

struct Case {
  int64_t rows, n;
  bool fp8;
};

// One rank's device buffers for one case: what the fused kernel reads and writes, and the same for the reference.
template <typename T>
struct RankBuffers {
  T *delta, *residual, *weight, *out, *ref_delta, *ref_residual, *ref_out, *scratch;
  k::Fp8 *q, *ref_q;
  float *scales, *ref_scales;
};

template <typename T>
T* Alloc(int64_t elements) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, elements * sizeof(T) + 16), cudaSuccess);
  return static_cast<T*>(p);
}

// The bytes of `elements` elements at a and b that differ, and the first that does ("" where none).
template <typename T>
std::string Differences(const T* a, const T* b, int64_t elements) {
  std::vector<unsigned char> ha(elements * sizeof(T)), hb(ha.size());
  EXPECT_EQ(cudaMemcpy(ha.data(), a, ha.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(hb.data(), b, hb.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  int64_t wrong = 0, first = -1;
  for (size_t i = 0; i < ha.size(); ++i) {
    if (ha[i] != hb[i] && wrong++ == 0) first = static_cast<int64_t>(i);
  }
  if (wrong == 0) return "";
  return std::to_string(wrong) + " of " + std::to_string(ha.size()) + " bytes differ, the first at byte " +
         std::to_string(first);
}

template <typename T>
void RunAndCheck(int ranks, const std::vector<Case>& cases, bool graph, int replays, bool own_gpus = false) {
  int64_t largest = 0;
  for (const Case& c : cases) largest = std::max(largest, c.rows * c.n);
  PeerTestGroup group(ranks, largest * 2, own_gpus);
  std::mt19937 rng(ranks * 31 + static_cast<int>(cases.size()) + (own_gpus ? 7 : 0));
  std::normal_distribution<float> d(0.f, 1.f);
  // Per case: every rank's delta, one residual (every rank holds the same), one weight.
  std::vector<std::vector<std::vector<T>>> deltas(cases.size());
  std::vector<std::vector<T>> residuals(cases.size()), weights(cases.size());
  std::vector<std::vector<RankBuffers<T>>> bufs(cases.size(), std::vector<RankBuffers<T>>(ranks));
  for (size_t c = 0; c < cases.size(); ++c) {
    const int64_t size = cases[c].rows * cases[c].n;
    deltas[c].assign(ranks, std::vector<T>(size));
    residuals[c].resize(size);
    weights[c].resize(cases[c].n);
    for (T& v : residuals[c]) v = FromFloatHost<T>(3.f * d(rng));
    for (T& v : weights[c]) v = FromFloatHost<T>(1.f + 0.3f * d(rng));
    for (int r = 0; r < ranks; ++r) {
      group.Use(r);
      RankBuffers<T>& b = bufs[c][r];
      for (T** p : {&b.delta, &b.residual, &b.out, &b.ref_delta, &b.ref_residual, &b.ref_out, &b.scratch}) {
        *p = Alloc<T>(size);
      }
      b.weight = Alloc<T>(cases[c].n);
      b.q = Alloc<k::Fp8>(size);
      b.ref_q = Alloc<k::Fp8>(size);
      b.scales = Alloc<float>(cases[c].rows);
      b.ref_scales = Alloc<float>(cases[c].rows);
      cudaMemcpy(b.weight, weights[c].data(), cases[c].n * sizeof(T), cudaMemcpyHostToDevice);
    }
  }
  auto upload = [&](int pass) {
    for (size_t c = 0; c < cases.size(); ++c) {
      for (int r = 0; r < ranks; ++r) {
        for (T& v : deltas[c][r]) v = FromFloatHost<T>(d(rng) * (1.f + pass));
        const RankBuffers<T>& b = bufs[c][r];
        const size_t bytes = deltas[c][r].size() * sizeof(T);
        group.Use(r);
        for (T* p : {b.delta, b.ref_delta}) cudaMemcpy(p, deltas[c][r].data(), bytes, cudaMemcpyHostToDevice);
        for (T* p : {b.residual, b.ref_residual}) cudaMemcpy(p, residuals[c].data(), bytes, cudaMemcpyHostToDevice);
        cudaMemcpy(b.scratch, deltas[c][r].data(), bytes, cudaMemcpyHostToDevice);
      }
    }
  };
  // Calls are enqueued rank by rank per call, as the engine's rank threads enqueue them (Collectives: each rank's
  // collective waits for every rank's work before it): kernels of ranks sharing a GPU may wait on one another.
  // The reference: the sum, then the norm kernel, on every rank.
  auto reference = [&] {
    for (size_t c = 0; c < cases.size(); ++c) {
      const Case& cs = cases[c];
      for (int r = 0; r < ranks; ++r) {
        group.Use(r);
        ASSERT_EQ(k::PeerAllReduceSum<T>(group.groups[r], bufs[c][r].ref_delta, cs.rows * cs.n, group.streams[r]),
                  cudaSuccess);
      }
      for (int r = 0; r < ranks; ++r) {
        group.Use(r);
        const RankBuffers<T>& b = bufs[c][r];
        ASSERT_EQ(cs.fp8 ? k::AddRmsNormFp8<T>(b.ref_residual, b.ref_delta, b.weight, b.ref_q, b.ref_scales, cs.rows,
                                               cs.n, kEps, group.streams[r])
                         : k::AddRmsNorm<T>(b.ref_residual, b.ref_delta, b.weight, b.ref_out, cs.rows, cs.n, kEps,
                                            group.streams[r]),
                  cudaSuccess);
      }
    }
  };
  // The fused calls of ranks `first` to `last`, each followed by a plain sum of a case's size (the slots alternate
  // across kinds of call).
  auto fused = [&](int first, int last) {
    for (size_t c = 0; c < cases.size(); ++c) {
      const Case& cs = cases[c];
      for (int r = first; r <= last; ++r) {
        group.Use(r);
        const RankBuffers<T>& b = bufs[c][r];
        ASSERT_EQ(
            k::PeerAllReduceAddRmsNorm<T>(group.groups[r], b.delta, b.residual, b.weight, cs.fp8 ? nullptr : b.out, b.q,
                                          b.scales, cs.rows, cs.n, kEps, group.streams[r]),
            cudaSuccess);
      }
      for (int r = first; r <= last; ++r) {
        group.Use(r);
        ASSERT_EQ(k::PeerAllReduceSum<T>(group.groups[r], bufs[c][r].scratch, cs.rows * cs.n, group.streams[r]),
                  cudaSuccess);
      }
    }
  };
  // Graphs (ranks on GPUs of their own, as a served model runs them): one per rank.
  std::vector<cudaGraphExec_t> execs(ranks, nullptr);
  if (graph) {
    for (int r = 0; r < ranks; ++r) {
      group.Use(r);
      cudaGraph_t g;
      ASSERT_EQ(cudaStreamBeginCapture(group.streams[r], cudaStreamCaptureModeThreadLocal), cudaSuccess);
      fused(r, r);
      ASSERT_EQ(cudaStreamEndCapture(group.streams[r], &g), cudaSuccess);
      ASSERT_EQ(cudaGraphInstantiate(&execs[r], g, 0), cudaSuccess);
      cudaGraphDestroy(g);
    }
  }
  for (int pass = 0; pass < replays; ++pass) {
    upload(pass);
    reference();
    ASSERT_EQ(group.Synchronize(), cudaSuccess);
    if (graph) {
      for (int r = 0; r < ranks; ++r) {
        group.Use(r);
        ASSERT_EQ(cudaGraphLaunch(execs[r], group.streams[r]), cudaSuccess);
      }
    } else {
      fused(0, ranks - 1);
    }
    ASSERT_EQ(group.Synchronize(), cudaSuccess);
    for (size_t c = 0; c < cases.size(); ++c) {
      const Case& cs = cases[c];
      const int64_t size = cs.rows * cs.n;
      for (int r = 0; r < ranks; ++r) {
        const RankBuffers<T>& b = bufs[c][r];
        group.Use(r);
        const std::string where = ::testing::PrintToString(ranks) + (own_gpus ? " ranks on their own GPUs" : " ranks") +
                                  ", " + std::to_string(cs.rows) + " rows of " + std::to_string(cs.n) +
                                  (cs.fp8 ? " into fp8" : "") + ", rank " + std::to_string(r) + ", pass " +
                                  std::to_string(pass) + (graph ? " (graph)" : "");
        EXPECT_EQ(Differences(b.residual, b.ref_residual, size), "") << "the residual: " << where;
        if (cs.fp8) {
          EXPECT_EQ(Differences(b.q, b.ref_q, size), "") << "the quantized rows: " << where;
          EXPECT_EQ(Differences(b.scales, b.ref_scales, cs.rows), "") << "the scales: " << where;
        } else {
          EXPECT_EQ(Differences(b.out, b.ref_out, size), "") << "the normed rows: " << where;
        }
      }
    }
  }
  for (cudaGraphExec_t e : execs)
    if (e) cudaGraphExecDestroy(e);
  for (auto& per_case : bufs) {
    for (RankBuffers<T>& b : per_case) {
      for (void* p : std::initializer_list<void*>{b.delta, b.residual, b.weight, b.out, b.ref_delta, b.ref_residual,
                                                  b.ref_out, b.scratch, b.q, b.ref_q, b.scales, b.ref_scales}) {
        cudaFree(p);
      }
    }
  }
}

// Widths: one vector, a width no thread count divides, the 8B's hidden size, the 70B's; rows: a decode step's one,
// and more than the kernel's blocks where the ranks share a GPU (32).
const std::vector<Case> kCases = {{1, 8, false},   {3, 1544, false}, {1, 4096, false}, {40, 4096, false},
                                  {1, 4096, true}, {5, 1544, true},  {37, 8192, true}, {2, 8192, false}};

TEST(PeerAllReduceAddRmsNorm, EqualsTheSumThenTheNormOnEveryRank) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  for (int ranks : {2, 4}) {
    RunAndCheck<__nv_bfloat16>(ranks, kCases, /*graph=*/false, 2);
    RunAndCheck<__half>(ranks, kCases, /*graph=*/false, 1);
  }
}

TEST(PeerAllReduceAddRmsNorm, RanksOnGpusOfTheirOwnEqualTheReference) {
  const int gpus = GpuCount();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpus;
  // More rows than the kernel's blocks on GPUs of their own (128).
  std::vector<Case> cases = kCases;
  cases.push_back({200, 4096, false});
  cases.push_back({256, 4096, true});
  for (int ranks : {2, 4, 8}) {
    if (ranks > gpus) continue;
    RunAndCheck<__nv_bfloat16>(ranks, cases, /*graph=*/false, 2, /*own_gpus=*/true);
    RunAndCheck<__nv_bfloat16>(ranks, cases, /*graph=*/true, 2, /*own_gpus=*/true);
  }
}

TEST(PeerAllReduceAddRmsNorm, ShapesItCannotTakeAreRefused) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  PeerTestGroup group(2, 4096 * 2);
  __nv_bfloat16* p = Alloc<__nv_bfloat16>(32768);
  k::Fp8* q = Alloc<k::Fp8>(32768);
  float* scales = Alloc<float>(4);
  const auto call = [&](int64_t rows, int64_t n, __nv_bfloat16* out, k::Fp8* quantized) {
    return k::PeerAllReduceAddRmsNorm<__nv_bfloat16>(group.groups[0], p, p, p, out, quantized, scales, rows, n, kEps,
                                                     group.streams[0]);
  };
  EXPECT_EQ(call(1, 4100, p, nullptr), cudaErrorInvalidValue);        // not whole vectors of 8
  EXPECT_EQ(call(2, 4096, p, nullptr), cudaErrorInvalidValue);        // larger than the inbox
  EXPECT_EQ(call(1, 16392, p, nullptr), cudaErrorInvalidValue);       // wider than a block's registers hold
  EXPECT_EQ(call(1, 4096, nullptr, nullptr), cudaErrorInvalidValue);  // neither output
  EXPECT_EQ(call(1, 4096, p + 1, nullptr), cudaErrorInvalidValue);    // unaligned output
  EXPECT_EQ(call(0, 4096, p, q), cudaErrorInvalidValue);              // no rows
  EXPECT_FALSE(k::PeerAllReduceAddRmsNormSupports(16392));
  EXPECT_TRUE(k::PeerAllReduceAddRmsNormSupports(16384));
  for (void* m : std::initializer_list<void*>{p, q, scales}) cudaFree(m);
}

}  // namespace
}  // namespace inferd

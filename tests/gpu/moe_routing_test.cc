// A mixture of experts' routing on the device (kernels::MoeRoute, and MoeTopK alone) against the cpu backend's
// arithmetic: the softmax over the experts, the top k (the larger weight first, the lower expert among equals), the
// weights renormalised or not, and every (row, k) slot grouped by expert. Random logits of odd row counts and expert
// counts up to the largest taken, ties (every logit equal), calls in a row (the counts must be left zero), and refused
// shapes.
#include "kernels/moe_routing.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/model/moe_routing.h"
#include "tests/gpu/gpu_test_util.h"

namespace inferd {
namespace {

using testing::HaveGpu;
namespace k = kernels;

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// The cpu backend's routing of one row (engine/model/moe_routing.h).
void Reference(const float* logits, int32_t experts, int32_t topk, bool normalize, int32_t* ids, float* weights) {
  std::vector<float> p(logits, logits + experts);
  std::vector<int32_t> order;
  RouteRow(p.data(), experts, topk, normalize, order, ids, weights);
}

template <typename T>
T* Device(size_t n) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
  return static_cast<T*>(p);
}

// Routes `logits` on the device (twice: the second call must find the counts zero again) and checks it.
void RouteAndCheck(const std::vector<float>& logits, int64_t rows, int32_t experts, int32_t topk, bool normalize) {
  const std::string where = std::to_string(rows) + " rows, " + std::to_string(experts) + " experts, top " +
                            std::to_string(topk) + (normalize ? ", renormalised" : "");
  float* d_logits = Device<float>(logits.size());
  int32_t* ids = Device<int32_t>(rows * topk);
  float* weights = Device<float>(rows * topk);
  int32_t* counts = Device<int32_t>(experts);
  int32_t* offsets = Device<int32_t>(experts + 1);
  int32_t* sorted = Device<int32_t>(rows * topk);
  int32_t* positions = Device<int32_t>(rows * topk);
  int32_t* touched = Device<int32_t>(1);
  ASSERT_EQ(cudaMemcpy(d_logits, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(counts, 0, experts * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(touched, 0, 4), cudaSuccess);
  for (int call = 0; call < 2; ++call) {
    ASSERT_EQ(k::MoeRoute(d_logits, rows, experts, topk, normalize, ids, weights, counts, offsets, sorted, positions,
                          nullptr, touched),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<int32_t> got_ids(rows * topk), got_offsets(experts + 1), got_sorted(rows * topk), left(experts),
        got_positions(rows * topk);
    std::vector<float> got_weights(rows * topk);
    cudaMemcpy(got_ids.data(), ids, got_ids.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(got_weights.data(), weights, got_weights.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(got_offsets.data(), offsets, got_offsets.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(got_sorted.data(), sorted, got_sorted.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(left.data(), counts, left.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(got_positions.data(), positions, got_positions.size() * 4, cudaMemcpyDeviceToHost);
    int64_t wrong_ids = 0;
    double worst = 0;
    std::vector<int32_t> want_ids(topk);
    std::vector<float> want_weights(topk);
    for (int64_t r = 0; r < rows; ++r) {
      Reference(logits.data() + r * experts, experts, topk, normalize, want_ids.data(), want_weights.data());
      for (int32_t j = 0; j < topk; ++j) {
        wrong_ids += got_ids[r * topk + j] != want_ids[j];
        worst = std::max(worst, double(std::abs(got_weights[r * topk + j] - want_weights[j])));
      }
    }
    EXPECT_EQ(wrong_ids, 0) << where << ", call " << call;
    EXPECT_LT(worst, 1e-6) << where;
    // Every slot once, in the run of its expert; the runs in expert order, as long as the expert's count.
    EXPECT_EQ(got_offsets[0], 0) << where;
    EXPECT_EQ(got_offsets[experts], rows * topk) << where;
    std::vector<int32_t> seen(rows * topk, 0);
    for (int32_t e = 0; e < experts; ++e) {
      const int64_t want = std::count(got_ids.begin(), got_ids.end(), e);
      ASSERT_EQ(got_offsets[e + 1] - got_offsets[e], want) << where << ": expert " << e;
      for (int32_t i = got_offsets[e]; i < got_offsets[e + 1]; ++i) {
        const int32_t slot = got_sorted[i];
        ASSERT_TRUE(slot >= 0 && slot < rows * topk) << where;
        EXPECT_EQ(got_ids[slot], e) << where << ": slot " << slot << " in expert " << e << "'s run";
        ++seen[slot];
      }
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), rows * topk) << where << ": every slot exactly once";
    int64_t misplaced = 0;
    for (int64_t slot = 0; slot < rows * topk; ++slot) misplaced += got_sorted[got_positions[slot]] != slot;
    EXPECT_EQ(misplaced, 0) << where << ": each slot's position is where the grouped order holds it";
    EXPECT_EQ(std::count(left.begin(), left.end(), 0), experts) << where << ": the counts are left zero";
    // The experts that got rows, added to what the last call left (the live metrics' count of experts read).
    int32_t got_touched = 0;
    cudaMemcpy(&got_touched, touched, 4, cudaMemcpyDeviceToHost);
    std::vector<int32_t> distinct = got_ids;
    std::sort(distinct.begin(), distinct.end());
    const int64_t want_touched = std::unique(distinct.begin(), distinct.end()) - distinct.begin();
    EXPECT_EQ(got_touched, (call + 1) * want_touched) << where << ", call " << call;
    // MoeTopK alone: the same experts and weights, bit for bit, and no counts touched.
    int32_t* ids2 = Device<int32_t>(rows * topk);
    float* weights2 = Device<float>(rows * topk);
    ASSERT_EQ(k::MoeTopK(d_logits, rows, experts, topk, normalize, ids2, weights2, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<int32_t> top_ids(rows * topk);
    std::vector<float> top_weights(rows * topk);
    cudaMemcpy(top_ids.data(), ids2, top_ids.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(top_weights.data(), weights2, top_weights.size() * 4, cudaMemcpyDeviceToHost);
    EXPECT_EQ(top_ids, got_ids) << where << ": MoeTopK";
    EXPECT_EQ(top_weights, got_weights) << where << ": MoeTopK";
    cudaFree(ids2);
    cudaFree(weights2);
  }
  for (void* p : std::initializer_list<void*>{d_logits, ids, weights, counts, offsets, sorted, positions, touched}) {
    cudaFree(p);
  }
}

TEST(MoeRoute, EqualsTheCpuRoutingAndGroupsEverySlotByExpert) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(17);
  std::normal_distribution<float> d(0.f, 3.f);
  struct Shape {
    int64_t rows;
    int32_t experts, topk;
  };
  // Mixtral's 8 / 2, Qwen3-MoE's 128 / 8, an expert count no warp divides, the largest taken; a decode step's few
  // rows, more rows than a block takes, a prefill's.
  for (const Shape s : {Shape{1, 8, 2}, Shape{5, 8, 2}, Shape{3, 60, 4}, Shape{64, 128, 8}, Shape{1000, 128, 8},
                        Shape{4096, 8, 2}, Shape{33, 512, 16}, Shape{17, 7, 7}, Shape{9, 1, 1}}) {
    std::vector<float> logits(s.rows * s.experts);
    for (float& v : logits) v = d(rng);
    for (bool normalize : {true, false}) RouteAndCheck(logits, s.rows, s.experts, s.topk, normalize);
  }
}

TEST(MoeRoute, AmongEqualWeightsTheLowerExpertComesFirst) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  std::vector<float> logits(3 * 64, 0.5f);  // every expert alike: experts 0..k-1, each 1/64 (renormalised 1/k)
  logits[64 + 40] = 2.f;                    // row 1: expert 40 first, then 0, 1, ...
  RouteAndCheck(logits, 3, 64, 4, true);
  RouteAndCheck(logits, 3, 64, 4, false);
}

TEST(MoeRoute, ShapesItCannotTakeAreRefused) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const auto route = [](int64_t rows, int32_t experts, int32_t topk) {
    return k::MoeRoute(nullptr, rows, experts, topk, true, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                       nullptr);
  };
  EXPECT_EQ(route(0, 8, 2), cudaErrorInvalidValue);
  EXPECT_EQ(route(1, 8, 9), cudaErrorInvalidValue);
  EXPECT_EQ(route(1, 8, 0), cudaErrorInvalidValue);
  EXPECT_EQ(route(1, k::kMoeMaxExperts + 1, 2), cudaErrorInvalidValue);
  EXPECT_EQ(route(1, 64, k::kMoeMaxTopK + 1), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace inferd

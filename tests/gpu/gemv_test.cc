// The small-batch product kernel against an fp64 reference of the same rounded inputs, on random data and odd
// shapes, with and without bias, rounded (bf16, fp16) and fp32 outputs; outputs poisoned before each run.
// Tolerance per element: fp32 accumulation (1e-5 of Σ|w·x|) plus one rounding of the output dtype.
#include "kernels/gemv.h"

#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>

#include "kernels/elementwise.h"
#include "tests/gpu/gpu_test_util.h"

namespace inferd {
namespace {

using testing::Dev;
using testing::Random;

template <typename T>
float ToF(T v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return testing::ToFloatHost(v);
  }
}
template <typename T>
T FromF(float v) {
  return testing::FromFloatHost<T>(v);
}
template <typename T>
std::vector<T> Round(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FromF<T>(v[i]);
  return out;
}

// (m, n, k, bias)
using Shape = std::tuple<int, int, int, bool>;

// pad > 0: y's rows are n + pad elements apart (a slice of wider rows, as a rank's run of the logits is), and the
// pad between them must keep what it held.
// form: the one Gemv picks for m (kAuto), or forced to the other.
template <typename T, typename Out>
void CheckShape(const Shape& shape, uint32_t seed, int pad = 0, kernels::GemvForm form = kernels::GemvForm::kAuto) {
  const auto [m, n, k, with_bias] = shape;
  std::mt19937 rng(seed);
  const std::vector<T> x = Round<T>(Random(size_t(m) * k, rng));
  const std::vector<T> w = Round<T>(Random(size_t(n) * k, rng, 0.05f));
  const std::vector<T> bias = Round<T>(Random(n, rng));
  Dev<T> dx(x), dw(w), db(bias);
  const int64_t ldy = n + pad;
  Dev<Out> dy(size_t(m) * ldy);
  CUDA_OK(cudaMemset(dy.get(), 0x5A, size_t(m) * ldy * sizeof(Out)));
  ASSERT_TRUE(kernels::GemvSupports(dx.get(), dw.get(), m, k));
  CUDA_OK((kernels::Gemv<T, Out>(dx.get(), dw.get(), with_bias ? db.get() : nullptr, dy.get(), m, n, k, nullptr,
                                 pad ? ldy : 0, form)));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<Out> y = dy.Host();
  for (int r = 0; r < m; ++r) {
    for (int c = n; c < ldy; ++c) {
      const auto* bytes = reinterpret_cast<const unsigned char*>(&y[size_t(r) * ldy + c]);
      for (size_t b = 0; b < sizeof(Out); ++b) ASSERT_EQ(bytes[b], 0x5A) << "pad of row " << r << " written";
    }
  }
  const double out_eps = std::is_same_v<Out, float> ? 1e-7 : (std::is_same_v<Out, __half> ? 1e-3 : 8e-3);
  int bad = 0;
  for (int r = 0; r < m; ++r) {
    for (int c = 0; c < n; ++c) {
      double ref = with_bias ? ToF(bias[c]) : 0.0, mag = std::abs(ref);
      for (int i = 0; i < k; ++i) {
        const double p = double(ToF(x[size_t(r) * k + i])) * ToF(w[size_t(c) * k + i]);
        ref += p;
        mag += std::abs(p);
      }
      const double got = ToF(y[size_t(r) * ldy + c]);
      const double tol = 1e-5 * mag + out_eps * std::abs(ref) + 1e-30;
      if (!(std::abs(got - ref) <= tol) && ++bad <= 5) {
        ADD_FAILURE() << "y[" << r << ", " << c << "] = " << got << ", reference " << ref << " (tolerance " << tol
                      << ") for m=" << m << " n=" << n << " k=" << k;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

class GemvTest : public ::testing::TestWithParam<Shape> {};

TEST_P(GemvTest, Bf16MatchesReference) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  CheckShape<__nv_bfloat16, __nv_bfloat16>(GetParam(), 1);
}
TEST_P(GemvTest, Bf16WithFp32OutputMatchesReference) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  CheckShape<__nv_bfloat16, float>(GetParam(), 2);
}
TEST_P(GemvTest, Bf16WithFp32OutputIntoWiderRowsMatchesReference) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  CheckShape<__nv_bfloat16, float>(GetParam(), 5, /*pad=*/13);
}
TEST_P(GemvTest, Fp16MatchesReference) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  CheckShape<__half, __half>(GetParam(), 3);
}
TEST_P(GemvTest, Fp16WithFp32OutputMatchesReference) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  CheckShape<__half, float>(GetParam(), 4);
}
// The form kAuto does not pick for these rows (CUDA cores from kGemvTensorCoreRows rows on, tensor cores below):
// both stay correct at every row count, since benchmarks force either.
kernels::GemvForm OtherForm(int m) {
  return m >= kernels::kGemvTensorCoreRows ? kernels::GemvForm::kCudaCores : kernels::GemvForm::kTensorCores;
}
TEST_P(GemvTest, Bf16InTheOtherFormMatchesReference) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  CheckShape<__nv_bfloat16, __nv_bfloat16>(GetParam(), 9, 0, OtherForm(std::get<0>(GetParam())));
}
TEST_P(GemvTest, Fp16WithFp32OutputInTheOtherFormMatchesReference) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  CheckShape<__half, float>(GetParam(), 10, /*pad=*/3, OtherForm(std::get<0>(GetParam())));
}

// Every row count; k below one lane sweep (8), between sweeps (264, 1000), past the unrolled loop (4104), not a
// multiple of a tile's 32-k piece (1000, 1032, 520, 2056); n not a multiple of the warps per block or of a tile's
// 16 rows.
INSTANTIATE_TEST_SUITE_P(OddShapes, GemvTest,
                         ::testing::Values(Shape{1, 37, 8, false}, Shape{2, 129, 264, true},
                                           Shape{3, 1001, 1000, false}, Shape{4, 67, 4104, true},
                                           Shape{5, 250, 2056, false}, Shape{6, 33, 1032, true},
                                           Shape{7, 513, 520, false}, Shape{8, 130, 4096, true},
                                           Shape{8, 3, 14336, false}));

TEST(Gemv, RefusesShapesItCannotRun) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  Dev<__nv_bfloat16> x(size_t{64}), w(size_t{64});
  Dev<float> y(size_t{64});
  EXPECT_FALSE(kernels::GemvSupports(x.get(), w.get(), 0, 8));
  EXPECT_FALSE(kernels::GemvSupports(x.get(), w.get(), kernels::kGemvMaxRows + 1, 8));
  EXPECT_FALSE(kernels::GemvSupports(x.get(), w.get(), 1, 12));
  EXPECT_FALSE(kernels::GemvSupports(x.get() + 1, w.get(), 1, 8));
  EXPECT_EQ((kernels::Gemv<__nv_bfloat16, float>(x.get(), w.get(), nullptr, y.get(), 1, 4, 12, nullptr)),
            cudaErrorInvalidValue);
}

// The fused q/k/v product with RoPE and the K/V write against the two kernels it replaces (Gemv, then
// RopeWriteKv), bit for bit: the q/k/v rows and the whole of both caches, untouched slots included.
// (rows, head_dim, bias)
using RopeShape = std::tuple<int, int, bool>;
class GemvQkvRopeTest : public ::testing::TestWithParam<RopeShape> {};

template <typename T>
void CheckQkvRope(const RopeShape& shape, uint32_t seed) {
  const auto [m, D, with_bias] = shape;
  const int heads = 6, kv_heads = 2, slots_in_cache = 16;
  const int64_t k = 200, n = int64_t{heads + 2 * kv_heads} * D, cache = int64_t{slots_in_cache} * kv_heads * D;
  std::mt19937 rng(seed);
  const std::vector<T> x = Round<T>(Random(size_t(m) * k, rng));
  const std::vector<T> w = Round<T>(Random(size_t(n) * k, rng, 0.05f));
  const std::vector<T> bias = Round<T>(Random(n, rng));
  const std::vector<T> k_init = Round<T>(Random(cache, rng)), v_init = Round<T>(Random(cache, rng));
  std::vector<float> inv_freq(D / 2);
  for (int i = 0; i < D / 2; ++i) inv_freq[i] = std::pow(500000.f, -2.f * i / D);
  const std::vector<int32_t> positions = {4001, 37, 0, 2, 900, 77, 5, 1}, slots = {11, 5, 0, 15, 2, 9, 3, 7};
  Dev<T> dx(x), dw(w), db(bias), k_a(k_init), v_a(v_init), k_b(k_init), v_b(v_init);
  Dev<float> dfreq(inv_freq);
  Dev<int32_t> dpos(positions), dslots(slots);
  Dev<T> qkv_a(size_t(m) * n), qkv_b(size_t(m) * n);
  const T* b = with_bias ? db.get() : nullptr;
  CUDA_OK((kernels::Gemv<T, T>(dx.get(), dw.get(), b, qkv_a.get(), m, n, k, nullptr)));
  CUDA_OK(kernels::RopeWriteKv(qkv_a.get(), dpos.get(), dslots.get(), dfreq.get(), k_a.get(), v_a.get(), m, heads,
                               kv_heads, D, 1.f, 1.f, nullptr));
  CUDA_OK(kernels::GemvQkvRope(dx.get(), dw.get(), b, qkv_b.get(), m, k, dpos.get(), dslots.get(), dfreq.get(),
                               k_b.get(), v_b.get(), heads, kv_heads, D, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  auto same = [](const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
  };
  EXPECT_TRUE(same(qkv_a.Host(), qkv_b.Host()));
  EXPECT_TRUE(same(k_a.Host(), k_b.Host()));
  EXPECT_TRUE(same(v_a.Host(), v_b.Host()));
  EXPECT_FALSE(same(k_a.Host(), k_init)) << "the tokens' K was written";
}

TEST_P(GemvQkvRopeTest, Bf16EqualsProductThenRope) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  CheckQkvRope<__nv_bfloat16>(GetParam(), 5);
}
TEST_P(GemvQkvRopeTest, Fp16EqualsProductThenRope) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  CheckQkvRope<__half>(GetParam(), 6);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemvQkvRopeTest,
                         ::testing::Values(RopeShape{1, 128, false}, RopeShape{2, 128, true}, RopeShape{1, 64, true},
                                           RopeShape{2, 64, false}, RopeShape{3, 128, true}, RopeShape{5, 64, false},
                                           RopeShape{8, 128, false}, RopeShape{6, 96, true}, RopeShape{4, 256, true}));

TEST(GemvQkvRope, RefusesShapesItCannotRun) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  Dev<__nv_bfloat16> x(size_t{3 * 64}), w(size_t{64});
  EXPECT_TRUE(kernels::GemvQkvRopeSupports(x.get(), w.get(), 1, 64, 72));
  EXPECT_FALSE(kernels::GemvQkvRopeSupports(x.get(), w.get(), kernels::kGemvTensorCoreRows, 64, 72))
      << "rows on tensor cores need head_dim % 16 == 0";
  EXPECT_TRUE(kernels::GemvQkvRopeSupports(x.get(), w.get(), 3, 64, 80));
  EXPECT_FALSE(kernels::GemvQkvRopeSupports(x.get(), w.get(), kernels::kGemvMaxRows + 1, 64, 128));
  EXPECT_FALSE(kernels::GemvQkvRopeSupports(x.get(), w.get(), 1, 64, 7));
}

// The fused gate/up product with the gated activation against the two kernels it replaces (Gemv into gate_up,
// then ActivateMul), bit for bit, with the output poisoned first.
// (rows, inter, k, activation)
using GatedShape = std::tuple<int, int, int, kernels::GatedActivation>;
class GemvGatedActTest : public ::testing::TestWithParam<GatedShape> {};

std::string GatedName(const GatedShape& shape) {
  const auto [m, inter, k, act] = shape;
  return std::string(act == kernels::GatedActivation::kSilu ? "silu" : "gelu_tanh") + "_m" + std::to_string(m) +
         "_inter" + std::to_string(inter) + "_k" + std::to_string(k);
}

template <typename T>
void CheckGatedAct(const GatedShape& shape, uint32_t seed) {
  const auto [m, inter, k, act] = shape;
  std::mt19937 rng(seed);
  const std::vector<T> x = Round<T>(Random(size_t(m) * k, rng));
  const std::vector<T> w = Round<T>(Random(size_t(2) * inter * k, rng, 0.05f));
  Dev<T> dx(x), dw(w), gate_up(size_t(m) * 2 * inter), out_a(size_t(m) * inter), out_b(size_t(m) * inter);
  CUDA_OK(cudaMemset(out_b.get(), 0x5A, size_t(m) * inter * sizeof(T)));
  CUDA_OK((kernels::Gemv<T, T>(dx.get(), dw.get(), nullptr, gate_up.get(), m, 2 * inter, k, nullptr)));
  CUDA_OK(kernels::ActivateMul(gate_up.get(), out_a.get(), m, inter, act, nullptr));
  CUDA_OK(kernels::GemvGatedAct(dx.get(), dw.get(), out_b.get(), m, inter, k, act, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<T> a = out_a.Host(), b = out_b.Host();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(T)), 0);
  float largest = 0.f;
  for (T v : b) largest = std::max(largest, std::abs(ToF(v)));
  EXPECT_GT(largest, 0.f) << "the outputs carry values";
}

TEST_P(GemvGatedActTest, Bf16EqualsProductThenActivation) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  CheckGatedAct<__nv_bfloat16>(GetParam(), 7);
}
TEST_P(GemvGatedActTest, Fp16EqualsProductThenActivation) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  CheckGatedAct<__half>(GetParam(), 8);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemvGatedActTest,
                         ::testing::Values(GatedShape{1, 1, 8, kernels::GatedActivation::kSilu},
                                           GatedShape{2, 37, 200, kernels::GatedActivation::kSilu},
                                           GatedShape{1, 1000, 4104, kernels::GatedActivation::kGeluTanh},
                                           GatedShape{2, 515, 264, kernels::GatedActivation::kGeluTanh},
                                           GatedShape{3, 37, 200, kernels::GatedActivation::kSilu},
                                           GatedShape{5, 1000, 4104, kernels::GatedActivation::kSilu},
                                           GatedShape{8, 515, 1032, kernels::GatedActivation::kGeluTanh},
                                           GatedShape{7, 3, 8, kernels::GatedActivation::kSilu}),
                         [](const auto& info) { return GatedName(info.param); });

TEST(GemvGatedAct, RefusesShapesItCannotRun) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  Dev<__nv_bfloat16> x(9 * 16), w(2 * 4 * 16), out(9 * 4);
  const auto silu = kernels::GatedActivation::kSilu;
  EXPECT_EQ(kernels::GemvGatedAct(x.get(), w.get(), out.get(), kernels::kGemvMaxRows + 1, 4, 16, silu, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::GemvGatedAct(x.get(), w.get(), out.get(), 1, 4, 12, silu, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(kernels::GemvGatedAct(x.get(), w.get(), out.get(), 1, 0, 16, silu, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace inferd

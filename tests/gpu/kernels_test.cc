// The layer kernels and FlashInfer paged attention against CPU references on random data and odd sizes,
// outputs poisoned before each run. Tolerances: bf16 rounding (relative 1e-2 for attention and norms), exact
// for copies. Skip without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <tuple>

#include "engine/model/model_tensors.h"
#include "kernels/decode_attention.h"
#include "kernels/elementwise.h"
#include "kernels/fill_random.h"
#include "kernels/paged_attention.h"
#include "tests/gpu/gpu_test_util.h"

namespace inferd {
namespace {

using testing::Bf;
using testing::Dev;
using testing::FromBf16;
using testing::Random;
using testing::RelError;
using testing::ToBf16;
using bf16 = __nv_bfloat16;

TEST(Kernels, GatherRowsCopiesExactly) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(1);
  const int64_t rows = 37, cols = 97;
  const std::vector<float> table = Random(rows * cols, rng);
  const std::vector<int32_t> idx = {36, 0, 5, 5, 17};
  Dev<bf16> src(ToBf16(table));
  Dev<int32_t> d_idx(idx);
  Dev<bf16> dst(idx.size() * cols);
  CUDA_OK(kernels::GatherRows(src.get(), d_idx.get(), dst.get(), idx.size(), cols, nullptr));
  const std::vector<float> got = FromBf16(dst.Host());
  for (size_t i = 0; i < idx.size(); ++i)
    for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(got[i * cols + c], Bf(table[idx[i] * cols + c])) << i << "," << c;
}

// model.load_format dummy: a shard filled on the device (rows [first, first + count), columns [begin, begin + n)) holds
// exactly the host's values for those coordinates (DecodeRows, rounded to bf16), at odd sizes.
TEST(Kernels, FillRandomRowsEqualsTheHostsValuesOfTheSameShard) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  TensorDesc t;
  t.name = "model.layers.3.mlp.down_proj.weight";
  t.rows = 97;
  t.cols = 1031;
  t.dtype = DType::kBF16;
  t.random_seed = 0x9E3779B97F4A7C15ull;
  t.random_std = 0.03f;
  t.random_mean = 0.5f;
  std::vector<float> host(t.numel());
  ASSERT_TRUE(DecodeRows(t, 0, t.rows, host.data()).ok());
  for (auto [first, count, begin, n] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{0, 97, 0, 1031},
                                        {17, 41, 0, 1031},
                                        {5, 1, 513, 518},
                                        {90, 7, 3, 1}}) {
    Dev<bf16> out(count * n);
    CUDA_OK(kernels::FillRandomRows(out.get(), count, n, first, begin, t.random_seed, t.random_mean, t.random_std,
                                    nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> got = FromBf16(out.Host());
    for (int64_t r = 0; r < count; ++r)
      for (int64_t c = 0; c < n; ++c)
        ASSERT_EQ(got[r * n + c], host[(first + r) * t.cols + begin + c]) << first + r << "," << begin + c;
  }
}

// Ids below zero name rows of the last step's sampled tokens (PendingToken): the embedding reads those.
TEST(Kernels, EmbedTokensReadsPendingIdsFromTheSampledTokens) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(2);
  const int64_t vocab = 53, cols = 131;
  const std::vector<float> table = Random(vocab * cols, rng);
  const std::vector<int32_t> sampled = {9, 52, 0, 31};
  const std::vector<int32_t> ids = {-3, 7, -1, -4, 52, -2, 0};  // rows 2, 0, 3, 1 of `sampled`
  const std::vector<int32_t> want = {0, 7, 9, 31, 52, 52, 0};
  Dev<bf16> embed(ToBf16(table));
  Dev<int32_t> d_ids(ids), d_sampled(sampled);
  Dev<bf16> dst(ids.size() * cols);
  CUDA_OK(kernels::EmbedTokens(embed.get(), d_ids.get(), d_sampled.get(), dst.get(), ids.size(), cols, nullptr));
  const std::vector<float> got = FromBf16(dst.Host());
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(got[i * cols + c], Bf(table[want[i] * cols + c])) << i << "," << c;
}

class AddRmsNormTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

TEST_P(AddRmsNormTest, MatchesReferenceWithinBf16Rounding) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  const auto [rows, n] = GetParam();
  std::mt19937 rng(rows * 31 + n);
  const std::vector<float> x = Random(rows * n, rng), d = Random(rows * n, rng), w = Random(n, rng);
  Dev<bf16> res(ToBf16(x)), delta(ToBf16(d)), weight(ToBf16(w));
  Dev<bf16> out(rows * n);
  CUDA_OK(kernels::AddRmsNorm(res.get(), delta.get(), weight.get(), out.get(), rows, n, 1e-5f, nullptr));
  std::vector<double> ref_out(rows * n), ref_res(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) {
      ref_res[r * n + i] = Bf(Bf(x[r * n + i]) + Bf(d[r * n + i]));
      ss += ref_res[r * n + i] * ref_res[r * n + i];
    }
    const double inv = 1.0 / std::sqrt(ss / n + 1e-5);
    for (int64_t i = 0; i < n; ++i) ref_out[r * n + i] = Bf(w[i]) * ref_res[r * n + i] * inv;
  }
  EXPECT_LT(RelError(FromBf16(res.Host()), ref_res), 1e-6) << "the residual is the rounded sum";
  EXPECT_LT(RelError(FromBf16(out.Host()), ref_out), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(OddSizes, AddRmsNormTest,
                         ::testing::Values(std::make_tuple(1, 1), std::make_tuple(3, 17), std::make_tuple(17, 576),
                                           std::make_tuple(5, 4096), std::make_tuple(2, 5000), std::make_tuple(3, 8192),
                                           std::make_tuple(2, 16384), std::make_tuple(1, 16392)));

TEST(Kernels, SiluMulMatchesReference) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(3);
  for (const int64_t inter : {333, 1032}) {  // odd: one element per thread; a multiple of 8: 16-byte vectors
    const int64_t rows = 7;
    const std::vector<float> gu = Random(rows * 2 * inter, rng, 2.f);
    Dev<bf16> d_gu(ToBf16(gu));
    Dev<bf16> out(rows * inter);
    CUDA_OK(kernels::ActivateMul(d_gu.get(), out.get(), rows, inter, kernels::GatedActivation::kSilu, nullptr));
    std::vector<double> ref(rows * inter);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < inter; ++i) {
        const double g = Bf(gu[r * 2 * inter + i]), u = Bf(gu[r * 2 * inter + inter + i]);
        ref[r * inter + i] = g / (1 + std::exp(-g)) * u;
      }
    EXPECT_LT(RelError(FromBf16(out.Host()), ref), 1e-2) << inter;
  }
}

TEST(Kernels, SiluMulVectorsEqualOneElementPerThreadBitForBit) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(13);
  const int64_t rows = 5, inter = 1032;
  const std::vector<bf16> gu = ToBf16(Random(rows * 2 * inter + 1, rng, 2.f));
  Dev<bf16> d_gu(gu);
  Dev<bf16> vec(rows * inter), scalar(rows * inter + 1);
  CUDA_OK(kernels::ActivateMul(d_gu.get(), vec.get(), rows, inter, kernels::GatedActivation::kSilu, nullptr));
  // The same rows one element further on: misaligned for 16-byte vectors, so one element per thread.
  std::vector<bf16> moved(gu.size() + 1);
  moved[0] = gu[0];
  std::copy(gu.begin(), gu.end() - 1, moved.begin() + 1);
  Dev<bf16> d_moved(moved);
  CUDA_OK(
      kernels::ActivateMul(d_moved.get() + 1, scalar.get() + 1, rows, inter, kernels::GatedActivation::kSilu, nullptr));
  const std::vector<float> a = FromBf16(vec.Host()), b = FromBf16(scalar.Host());
  for (int64_t i = 0; i < rows * inter; ++i) ASSERT_EQ(a[i], b[i + 1]) << i;
}

TEST(Kernels, GeluTanhMulMatchesReference) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(31);
  for (const int64_t inter : {333, 1032}) {
    const int64_t rows = 6;
    const std::vector<float> gu = Random(rows * 2 * inter, rng, 3.f);
    Dev<bf16> d_gu(ToBf16(gu));
    Dev<bf16> out(rows * inter);
    CUDA_OK(kernels::ActivateMul(d_gu.get(), out.get(), rows, inter, kernels::GatedActivation::kGeluTanh, nullptr));
    std::vector<double> ref(rows * inter);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < inter; ++i) {
        const double g = Bf(gu[r * 2 * inter + i]), u = Bf(gu[r * 2 * inter + inter + i]);
        const double gelu = 0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g)));
        ref[r * inter + i] = gelu * u;
      }
    EXPECT_LT(RelError(FromBf16(out.Host()), ref), 1e-2) << inter;
    // Not SiLU: the two activations differ clearly on these inputs.
    Dev<bf16> silu(rows * inter);
    CUDA_OK(kernels::ActivateMul(d_gu.get(), silu.get(), rows, inter, kernels::GatedActivation::kSilu, nullptr));
    EXPECT_GT(RelError(FromBf16(silu.Host()), ref), 5e-2) << inter;
  }
}

// Qwen3's and Gemma 3's per-head norms, in the rotary kernel: with every frequency 0 (no turn) each q and k head
// is its RMSNorm times its weight, V untouched and K's cache rows the normed K.
TEST(Kernels, RopeNormsEveryQAndKHeadFirst) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(32);
  for (const int32_t D : {64, 128, 256}) {
    const int32_t heads = 5, kv_heads = 2, T = 7, num_slots = 9;
    const int64_t row = int64_t{heads + 2 * kv_heads} * D, kv_dim = int64_t{kv_heads} * D;
    const std::vector<float> qkv = Random(T * row, rng, 4.f);
    const std::vector<float> qw = Random(D, rng, 1.f), kw = Random(D, rng, 1.f);
    std::vector<int32_t> pos(T), slots(T);
    for (int32_t t = 0; t < T; ++t) {
      pos[t] = 3 * t + 1;
      slots[t] = (t * 5 + 2) % num_slots;
    }
    Dev<bf16> d_qkv(ToBf16(qkv)), d_qw(ToBf16(qw)), d_kw(ToBf16(kw));
    Dev<int32_t> d_pos(pos), d_slots(slots);
    Dev<float> d_freq(std::vector<float>(D / 2, 0.f));
    Dev<bf16> kc(num_slots * kv_dim), vc(num_slots * kv_dim);
    const float eps = 1e-6f;
    kernels::RotaryOptions options;
    options.q_norm = d_qw.get();
    options.k_norm = d_kw.get();
    options.norm_eps = eps;
    CUDA_OK(kernels::RopeWriteKv(d_qkv.get(), d_pos.get(), d_slots.get(), d_freq.get(), kc.get(), vc.get(), T, heads,
                                 kv_heads, D, 1.f, 1.f, nullptr, options));
    const std::vector<float> got = FromBf16(d_qkv.Host());
    std::vector<double> ref(T * row);
    for (int32_t t = 0; t < T; ++t)
      for (int32_t h = 0; h < heads + 2 * kv_heads; ++h) {
        const float* v = qkv.data() + t * row + h * D;
        double ss = 0;
        for (int i = 0; i < D; ++i) ss += double(Bf(v[i])) * Bf(v[i]);
        const double inv = 1 / std::sqrt(ss / D + eps);
        for (int i = 0; i < D; ++i) {
          const double w = h < heads ? Bf(qw[i]) : Bf(kw[i]);
          ref[t * row + h * D + i] = h < heads + kv_heads ? w * Bf(v[i]) * inv : Bf(v[i]);
        }
      }
    EXPECT_LT(RelError(got, ref), 1e-2) << D;
    const std::vector<float> k = FromBf16(kc.Host()), v = FromBf16(vc.Host());
    for (int32_t t = 0; t < T; ++t) {
      for (int64_t i = int64_t{heads + kv_heads} * D; i < row; ++i) ASSERT_EQ(got[t * row + i], Bf(qkv[t * row + i]));
      for (int64_t i = 0; i < kv_dim; ++i) {
        ASSERT_EQ(k[slots[t] * kv_dim + i], got[t * row + heads * D + i]) << "K of token " << t;
        ASSERT_EQ(v[slots[t] * kv_dim + i], got[t * row + heads * D + kv_dim + i]) << "V of token " << t;
      }
    }
  }
}

// Phi-3's rotary options: only the leading rotary_dim of each head turn (the rest, and V, are written to the cache
// as they are), LongRoPE's long table from long_from on, and cos and sin scaled by mscale.
TEST(Kernels, RopePartialAndLongRopeMatchReference) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(33);
  const int32_t heads = 4, kv_heads = 2, D = 128, R = 96, T = 6, num_slots = 16;
  const int64_t row = int64_t{heads + 2 * kv_heads} * D, kv_dim = int64_t{kv_heads} * D;
  const std::vector<float> qkv = Random(T * row, rng);
  const std::vector<int32_t> pos = {0, 5, 63, 64, 200, 4000}, slots = {3, 1, 7, 0, 12, 5};
  std::vector<float> inv_short(R / 2), inv_long(R / 2);
  for (int i = 0; i < R / 2; ++i) {
    inv_short[i] = std::pow(10000.f, -2.f * i / R) / (1.f + 0.1f * i);
    inv_long[i] = inv_short[i] / (2.f + i);
  }
  Dev<bf16> d_qkv(ToBf16(qkv));
  Dev<int32_t> d_pos(pos), d_slots(slots);
  Dev<float> d_short(inv_short), d_long(inv_long);
  Dev<bf16> kc(num_slots * kv_dim), vc(num_slots * kv_dim);
  kernels::RotaryOptions options;
  options.rotary_dim = R;
  options.inv_freq_long = d_long.get();
  options.long_from = 64;
  options.mscale = 1.19f;
  CUDA_OK(kernels::RopeWriteKv(d_qkv.get(), d_pos.get(), d_slots.get(), d_short.get(), kc.get(), vc.get(), T, heads,
                               kv_heads, D, 1.f, 1.f, nullptr, options));
  std::vector<double> ref(T * row);
  for (int32_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < row; ++i) ref[t * row + i] = Bf(qkv[t * row + i]);
    const std::vector<float>& f = pos[t] >= 64 ? inv_long : inv_short;
    for (int32_t h = 0; h < heads + kv_heads; ++h)
      for (int i = 0; i < R / 2; ++i) {
        const double a = Bf(qkv[t * row + h * D + i]), b = Bf(qkv[t * row + h * D + i + R / 2]);
        const double ang = double(pos[t]) * f[i], c = std::cos(ang) * 1.19, sn = std::sin(ang) * 1.19;
        ref[t * row + h * D + i] = a * c - b * sn;
        ref[t * row + h * D + i + R / 2] = b * c + a * sn;
      }
  }
  const std::vector<float> got = FromBf16(d_qkv.Host());
  EXPECT_LT(RelError(got, ref), 1e-2);
  for (int32_t t = 0; t < T; ++t)
    for (int32_t h = 0; h < heads + kv_heads; ++h)
      for (int i = R; i < D; ++i) ASSERT_EQ(got[t * row + h * D + i], Bf(qkv[t * row + h * D + i])) << "unrotated";
  const std::vector<float> k = FromBf16(kc.Host()), v = FromBf16(vc.Host());
  for (int32_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < kv_dim; ++i) {
      ASSERT_EQ(k[slots[t] * kv_dim + i], got[t * row + heads * D + i]) << "K of token " << t << ", " << i;
      ASSERT_EQ(v[slots[t] * kv_dim + i], got[t * row + heads * D + kv_dim + i]) << "V of token " << t << ", " << i;
    }
  options.rotary_dim = D + 2;
  EXPECT_EQ(kernels::RopeWriteKv(d_qkv.get(), d_pos.get(), d_slots.get(), d_short.get(), kc.get(), vc.get(), T, heads,
                                 kv_heads, D, 1.f, 1.f, nullptr, options),
            cudaErrorInvalidValue);
}

TEST(Kernels, RopeRotatesQAndKAndWritesKvIntoTheirSlots) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(4);
  const int32_t heads = 9, kv_heads = 3, D = 128, T = 9, num_slots = 40;  // 15 heads: blocks of 4 and one of 3
  const int64_t row = int64_t{heads + 2 * kv_heads} * D, kv_dim = int64_t{kv_heads} * D;
  const std::vector<float> qkv = Random(T * row, rng);
  std::vector<int32_t> pos(T), slots(T);
  for (int32_t t = 0; t < T; ++t) {
    pos[t] = t * 131 + 7;  // large positions exercise angle accuracy
    slots[t] = (t * 17 + 3) % num_slots;
  }
  std::vector<float> inv_freq(D / 2);
  for (int i = 0; i < D / 2; ++i) inv_freq[i] = std::pow(10000.f, -2.f * i / D);
  Dev<bf16> d_qkv(ToBf16(qkv));
  Dev<int32_t> d_pos(pos), d_slots(slots);
  Dev<float> d_freq(inv_freq);
  Dev<bf16> kc(num_slots * kv_dim), vc(num_slots * kv_dim);
  CUDA_OK(kernels::RopeWriteKv(d_qkv.get(), d_pos.get(), d_slots.get(), d_freq.get(), kc.get(), vc.get(), T, heads,
                               kv_heads, D, 1.f, 1.f, nullptr));
  std::vector<double> ref(T * row);
  for (int32_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < row; ++i) ref[t * row + i] = Bf(qkv[t * row + i]);
    for (int32_t h = 0; h < heads + kv_heads; ++h)
      for (int i = 0; i < D / 2; ++i) {
        const double a = Bf(qkv[t * row + h * D + i]), b = Bf(qkv[t * row + h * D + i + D / 2]);
        const double ang = double(pos[t]) * inv_freq[i];
        ref[t * row + h * D + i] = a * std::cos(ang) - b * std::sin(ang);
        ref[t * row + h * D + i + D / 2] = b * std::cos(ang) + a * std::sin(ang);
      }
  }
  const std::vector<float> got = FromBf16(d_qkv.Host());
  EXPECT_LT(RelError(got, ref), 1e-2);
  const std::vector<float> k = FromBf16(kc.Host()), v = FromBf16(vc.Host());
  for (int32_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < kv_dim; ++i) {
      ASSERT_EQ(k[slots[t] * kv_dim + i], got[t * row + heads * D + i]) << "K of token " << t;
      ASSERT_EQ(v[slots[t] * kv_dim + i], got[t * row + heads * D + kv_dim + i]) << "V of token " << t;
    }
  // An fp8 cache (engine.kv_cache_dtype: fp8_e4m3): the same rotation, and each K and V value the e4m3 rounding
  // (cuda_fp8.h's, saturating) of the bf16 value above. Values up to 8 reach e4m3's coarser steps.
  std::vector<float> wide = qkv;
  for (float& x : wide) x *= 8.f;
  Dev<bf16> d_wide(ToBf16(wide)), d_wide8(ToBf16(wide));
  Dev<bf16> kc16(num_slots * kv_dim), vc16(num_slots * kv_dim);
  Dev<__nv_fp8_e4m3> kc8(num_slots * kv_dim), vc8(num_slots * kv_dim);
  CUDA_OK(kernels::RopeWriteKv(d_wide.get(), d_pos.get(), d_slots.get(), d_freq.get(), kc16.get(), vc16.get(), T, heads,
                               kv_heads, D, 1.f, 1.f, nullptr));
  CUDA_OK(kernels::RopeWriteKv(d_wide8.get(), d_pos.get(), d_slots.get(), d_freq.get(), kc8.get(), vc8.get(), T, heads,
                               kv_heads, D, 1.f, 1.f, nullptr));
  EXPECT_EQ(FromBf16(d_wide8.Host()), FromBf16(d_wide.Host())) << "q, k and v rotate as with a bf16 cache";
  const std::vector<float> k16 = FromBf16(kc16.Host()), v16 = FromBf16(vc16.Host());
  const std::vector<__nv_fp8_e4m3> k8 = kc8.Host(), v8 = vc8.Host();
  int coarse = 0;
  for (int32_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < kv_dim; ++i) {
      const int64_t at = slots[t] * kv_dim + i;
      ASSERT_EQ(k8[at].__x, __nv_fp8_e4m3(k16[at]).__x) << "K of token " << t;
      ASSERT_EQ(v8[at].__x, __nv_fp8_e4m3(v16[at]).__x) << "V of token " << t;
      coarse += static_cast<float>(k8[at]) != k16[at];
    }
  EXPECT_GT(coarse, T * kv_dim / 2) << "most values are rounded: the fp8 cache is not a bf16 copy";
  // With the checkpoint's scales (not powers of two): each value divided by its scale (fp32) before rounding; K's
  // small scale pushes some past 448, where e4m3 saturates.
  const float k_scale = 0.0137f, v_scale = 3.1f;
  Dev<bf16> d_scaled(ToBf16(wide));
  CUDA_OK(kernels::RopeWriteKv(d_scaled.get(), d_pos.get(), d_slots.get(), d_freq.get(), kc8.get(), vc8.get(), T, heads,
                               kv_heads, D, k_scale, v_scale, nullptr));
  const std::vector<__nv_fp8_e4m3> ks = kc8.Host(), vs = vc8.Host();
  int saturated = 0;
  for (int32_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < kv_dim; ++i) {
      const int64_t at = slots[t] * kv_dim + i;
      ASSERT_EQ(ks[at].__x, __nv_fp8_e4m3(k16[at] / k_scale).__x) << "K of token " << t;
      ASSERT_EQ(vs[at].__x, __nv_fp8_e4m3(v16[at] / v_scale).__x) << "V of token " << t;
      saturated += std::abs(k16[at] / k_scale) > 448.f;
    }
  EXPECT_GT(saturated, 0) << "the case reaches e4m3's saturation";
  // A cache of the activation dtype takes no scale; an fp8 cache's are finite and positive.
  EXPECT_EQ(kernels::RopeWriteKv(d_wide.get(), d_pos.get(), d_slots.get(), d_freq.get(), kc16.get(), vc16.get(), T,
                                 heads, kv_heads, D, 2.f, 1.f, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::RopeWriteKv(d_wide.get(), d_pos.get(), d_slots.get(), d_freq.get(), kc8.get(), vc8.get(), T, heads,
                                 kv_heads, D, 1.f, 0.f, nullptr),
            cudaErrorInvalidValue);
}

TEST(Kernels, SoftCapBendsEachValueTowardsTheCap) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(31);
  const std::vector<float> x = Random(5003, rng, 20.f);
  const float cap = 7.5f;
  Dev<float> d(x);
  CUDA_OK(kernels::SoftCap(d.get(), static_cast<int64_t>(x.size()), cap, nullptr));
  const std::vector<float> y = d.Host();
  int bent = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = cap * std::tanh(double{x[i]} / cap);
    ASSERT_NEAR(y[i], want, 1e-5 * cap) << "value " << i << ": " << x[i];
    bent += std::abs(x[i]) > cap;
  }
  EXPECT_GT(bent, 1000) << "the case reaches past the cap";
  EXPECT_EQ(kernels::SoftCap(d.get(), 4, 0.f, nullptr), cudaErrorInvalidValue);
}

// Sequences given by (context length, query length); queries are the last tokens of the context.
struct AttentionCase {
  int32_t head_dim, heads, kv_heads, block_size;
  std::vector<std::pair<int32_t, int32_t>> seqs;
  bool decode_graph = false;           // the plan a decode CUDA graph replays (rows of one token, a fixed padded grid)
  bool unsplit_kv = false;             // that plan with each sequence's whole KV in one CTA
  bool fp8_kv = false;                 // K and V in fp8 e4m3 (engine.kv_cache_dtype: fp8_e4m3)
  float k_scale = 1.f, v_scale = 1.f;  // the fp8 cache holds K / k_scale and V / v_scale
  int32_t window = 0;                  // > 0: a sliding window of this many tokens (Gemma 3's local layers)
  float soft_cap = 0.f;                // > 0: scores soft-capped (Gemma 2's attn_logit_softcapping)
};

// n decode rows at contexts spread over 1 .. 700.
std::vector<std::pair<int32_t, int32_t>> ManyDecodeRows(int32_t n) {
  std::vector<std::pair<int32_t, int32_t>> seqs;
  for (int32_t i = 0; i < n; ++i) seqs.push_back({1 + (i * 7919) % 700, 1});
  return seqs;
}

class PagedAttentionTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(PagedAttentionTest, MatchesCausalReferenceOnShuffledPages) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  const AttentionCase& c = GetParam();
  std::mt19937 rng(c.head_dim * 7 + c.block_size + c.kv_heads);
  const int32_t D = c.head_dim, bs = c.block_size;
  const int64_t kv_dim = int64_t{c.kv_heads} * D, q_stride = int64_t{c.heads + 2 * c.kv_heads} * D;
  // Pages of all sequences, shuffled across the pool.
  std::vector<int32_t> qo_indptr = {0}, kv_indptr = {0}, last_len, pages;
  int32_t total_pages = 0;
  for (auto [ctx, q] : c.seqs) {
    const int32_t n = (ctx + bs - 1) / bs;
    total_pages += n;
    qo_indptr.push_back(qo_indptr.back() + q);
    kv_indptr.push_back(kv_indptr.back() + n);
    last_len.push_back(ctx - (n - 1) * bs);
  }
  const int32_t num_blocks = total_pages + 5;
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  pages.assign(perm.begin(), perm.begin() + total_pages);
  const int32_t T = qo_indptr.back();
  // Values representable in bf16, so that the reference reads the kernel's inputs.
  auto bf16_values = [&](size_t n) {
    std::vector<float> x = Random(n, rng);
    for (float& e : x) e = Bf(e);
    return x;
  };
  std::vector<float> q = bf16_values(T * q_stride), k = bf16_values(int64_t{num_blocks} * bs * kv_dim),
                     v = bf16_values(int64_t{num_blocks} * bs * kv_dim);
  // An fp8 cache holds e4m3 values: the reference reads the same ones.
  std::vector<__nv_fp8_e4m3> k8, v8;
  auto to_fp8 = [](std::vector<float>& x, float scale, std::vector<__nv_fp8_e4m3>* out) {
    for (float& e : x) {
      out->push_back(__nv_fp8_e4m3(e / scale));
      e = static_cast<float>(out->back()) * scale;
    }
  };
  if (c.fp8_kv) {
    to_fp8(k, c.k_scale, &k8);
    to_fp8(v, c.v_scale, &v8);
  }
  Dev<bf16> dq(ToBf16(q)), dk(ToBf16(k)), dv(ToBf16(v));
  Dev<__nv_fp8_e4m3> dk8(k8), dv8(v8);
  Dev<int32_t> d_qo(qo_indptr), d_kv(kv_indptr), d_pages(pages), d_last(last_len);
  Dev<bf16> out(T * int64_t{c.heads} * D);
  void *fws, *iws, *iws_host;
  CUDA_OK(cudaMalloc(&fws, kernels::kAttentionFloatWorkspaceBytes));
  CUDA_OK(cudaMalloc(&iws, kernels::kAttentionIntWorkspaceBytes));
  CUDA_OK(cudaMallocHost(&iws_host, kernels::kAttentionIntWorkspaceBytes));
  kernels::AttentionPlan plan;
  const int32_t S = static_cast<int32_t>(c.seqs.size());
  CUDA_OK(kernels::PlanPagedAttention(fws, iws, iws_host, qo_indptr.data(), kv_indptr.data(), T, S, c.heads, c.kv_heads,
                                      D, bs, c.decode_graph, c.unsplit_kv, &plan, nullptr, c.window - 1));
  const float scale = 1.f / std::sqrt(float(D));
  if (c.fp8_kv) {
    CUDA_OK((kernels::RunPagedAttention<bf16, __nv_fp8_e4m3>(
        plan, fws, iws, dq.get(), q_stride, dk8.get(), dv8.get(), d_qo.get(), d_kv.get(), d_pages.get(), d_last.get(),
        out.get(), S, c.heads, c.kv_heads, D, bs, scale * c.k_scale, c.v_scale, /*early_launch=*/T <= 3, nullptr)));
  } else {
    CUDA_OK(kernels::RunPagedAttention<bf16>(plan, fws, iws, dq.get(), q_stride, dk.get(), dv.get(), d_qo.get(),
                                             d_kv.get(), d_pages.get(), d_last.get(), out.get(), S, c.heads, c.kv_heads,
                                             D, bs, scale, 1.f, /*early_launch=*/T <= 3, nullptr, c.window - 1,
                                             c.soft_cap));
  }
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<double> ref = testing::PagedAttentionReference(
      q, q_stride, k, v, c.seqs, qo_indptr, kv_indptr, pages, bs, c.heads, c.kv_heads, D, scale, c.window, c.soft_cap);
  EXPECT_LT(RelError(FromBf16(out.Host()), ref), 1e-2);
  // The decode graph's unsplit plan over an fp8 cache runs the tensor-core decode kernel (above); that kernel alone
  // on every case of decode rows over an fp8 cache too.
  EXPECT_EQ(plan.decode_unsplit, c.decode_graph && c.unsplit_kv && T == S);
  if (T == S && c.fp8_kv && kernels::DecodeAttentionFp8Supports(c.heads, c.kv_heads, D)) {
    Dev<bf16> fp8_out(T * int64_t{c.heads} * D);
    CUDA_OK(kernels::RunDecodeAttentionFp8(dq.get(), q_stride, dk8.get(), dv8.get(), d_kv.get(), d_pages.get(),
                                           d_last.get(), fp8_out.get(), S, c.heads, c.kv_heads, D, bs,
                                           scale * c.k_scale, c.v_scale, /*early_launch=*/false, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> got = FromBf16(fp8_out.Host());
    EXPECT_LT(RelError(got, ref), 1e-2) << "the fp8 decode kernel";
    // Row by row too: one row's error (a token left out or counted twice) hides in the whole step's norm.
    const int64_t row = int64_t{c.heads} * D;
    double worst = 0;
    for (int32_t r = 0; r < T; ++r) {
      worst = std::max(worst, RelError(std::vector<float>(got.begin() + r * row, got.begin() + (r + 1) * row),
                                       std::vector<double>(ref.begin() + r * row, ref.begin() + (r + 1) * row)));
    }
    EXPECT_LT(worst, 1e-2) << "the fp8 decode kernel's worst row";
    std::printf("[ fp8 decode ] %d rows, worst row's relative error %.2e\n", T, worst);
  }
  // Rows of one query token over a bf16 cache without a window: the one-launch decode kernel too, in bf16 and fp16.
  const bool decode_rows = T == S && !c.fp8_kv && c.window == 0;
  if (decode_rows && kernels::DecodeAttentionSupports(c.heads, c.kv_heads, D)) {
    Dev<bf16> decode_out(T * int64_t{c.heads} * D);
    CUDA_OK(kernels::RunDecodeAttention<bf16>(dq.get(), q_stride, dk.get(), dv.get(), d_kv.get(), d_pages.get(),
                                              d_last.get(), decode_out.get(), S, c.heads, c.kv_heads, D, bs, scale,
                                              /*early_launch=*/true, nullptr, c.soft_cap));
    auto to_half = [](const std::vector<float>& x) {
      std::vector<__half> h(x.size());
      for (size_t i = 0; i < x.size(); ++i) h[i] = __float2half(x[i]);
      return h;
    };
    // fp16 holds these values exactly where bf16 does (|x| < 4, 8 significant bits).
    Dev<__half> hq(to_half(q)), hk(to_half(k)), hv(to_half(v)), half_out(T * int64_t{c.heads} * D);
    CUDA_OK(kernels::RunDecodeAttention<__half>(hq.get(), q_stride, hk.get(), hv.get(), d_kv.get(), d_pages.get(),
                                                d_last.get(), half_out.get(), S, c.heads, c.kv_heads, D, bs, scale,
                                                /*early_launch=*/false, nullptr, c.soft_cap));
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_LT(RelError(FromBf16(decode_out.Host()), ref), 1e-2) << "the decode kernel, bf16";
    std::vector<float> half_values;
    for (__half e : half_out.Host()) half_values.push_back(__half2float(e));
    EXPECT_LT(RelError(half_values, ref), 2e-3) << "the decode kernel, fp16";
  }
  // Prefill plans over a cache of T without window or soft cap: FlashInfer's Hopper kernel too, where it runs, in
  // bf16 and fp16, whether or not the step's queries fill its tiles (the backend asks HopperPrefillFits for speed).
  if (!c.decode_graph && !c.fp8_kv && c.window == 0 && c.soft_cap == 0.f && kernels::HopperPrefillAvailable(0)) {
    kernels::AttentionPlan hopper;
    CUDA_OK(kernels::PlanPagedAttention(fws, iws, iws_host, qo_indptr.data(), kv_indptr.data(), T, S, c.heads,
                                        c.kv_heads, D, bs, false, false, &hopper, nullptr, -1,
                                        /*hopper_prefill=*/true, last_len.data()));
    ASSERT_EQ(hopper.kernel, kernels::AttentionKernel::kHopper);
    Dev<bf16> hopper_out(T * int64_t{c.heads} * D);
    CUDA_OK(kernels::RunPagedAttention<bf16>(hopper, fws, iws, dq.get(), q_stride, dk.get(), dv.get(), d_qo.get(),
                                             d_kv.get(), d_pages.get(), d_last.get(), hopper_out.get(), S, c.heads,
                                             c.kv_heads, D, bs, scale, 1.f, false, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_LT(RelError(FromBf16(hopper_out.Host()), ref), 1e-2) << "the Hopper kernel, bf16";
    std::vector<__half> hq(q.size()), hk(k.size()), hv(v.size());  // fp16 holds these bf16 values exactly
    for (size_t i = 0; i < q.size(); ++i) hq[i] = __float2half(q[i]);
    for (size_t i = 0; i < k.size(); ++i) hk[i] = __float2half(k[i]);
    for (size_t i = 0; i < v.size(); ++i) hv[i] = __float2half(v[i]);
    Dev<__half> dhq(hq), dhk(hk), dhv(hv), half_out(T * int64_t{c.heads} * D);
    CUDA_OK(kernels::RunPagedAttention<__half>(hopper, fws, iws, dhq.get(), q_stride, dhk.get(), dhv.get(), d_qo.get(),
                                               d_kv.get(), d_pages.get(), d_last.get(), half_out.get(), S, c.heads,
                                               c.kv_heads, D, bs, scale, 1.f, false, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> half_values;
    for (__half e : half_out.Host()) half_values.push_back(__half2float(e));
    EXPECT_LT(RelError(half_values, ref), 2e-3) << "the Hopper kernel, fp16";
  }
  cudaFree(fws);
  cudaFree(iws);
  cudaFreeHost(iws_host);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PagedAttentionTest,
    ::testing::Values(
        // decode rows only, MHA, page size 1
        AttentionCase{64, 4, 4, 1, {{1, 1}, {17, 1}, {97, 1}}},
        // prefill chunks attending to earlier pages next to decodes, GQA group 4
        AttentionCase{128, 8, 2, 16, {{300, 300}, {97, 1}, {120, 17}, {1, 1}}},
        // group 3 (no CUDA-core decode kernel has it), head_dim 128
        AttentionCase{128, 6, 2, 16, {{2048, 5}, {33, 1}}},
        // head_dim 256, group 8, odd page size
        AttentionCase{256, 8, 1, 8, {{97, 97}, {64, 1}, {5, 2}}},
        // prefill steps that fill 128-row tiles (the Hopper kernel's): chunks after earlier context, runs that end
        // mid-tile, pages of 1 at head_dim 64 (192-row tiles), odd pages at head_dim 256
        AttentionCase{128, 8, 2, 16, {{1500, 1000}, {700, 700}, {33, 33}}},
        AttentionCase{64, 4, 1, 1, {{500, 400}, {200, 1}}}, AttentionCase{256, 8, 2, 8, {{600, 300}, {300, 300}}},
        // decode rows under the CUDA-graph plan: GQA 4 and 3, long and short contexts
        AttentionCase{128, 32, 8, 16, {{1, 1}, {300, 1}, {2048, 1}, {17, 1}}, true},
        AttentionCase{128, 6, 2, 16, {{97, 1}, {5, 1}, {1000, 1}}, true},
        // decode rows without a graph: one long context (split KV), GQA 8
        AttentionCase{64, 8, 1, 16, {{3001, 1}}}, AttentionCase{128, 32, 8, 16, {{3001, 1}, {1, 1}, {250, 1}}},
        // one or two decode rows: the 8B shape, MHA on pages of 1, head_dim 256, a
        // single-token context, a context of many KV chunks
        AttentionCase{128, 32, 8, 16, {{256, 1}}, true}, AttentionCase{64, 4, 4, 1, {{17, 1}, {97, 1}}},
        AttentionCase{256, 4, 2, 8, {{1, 1}, {700, 1}}}, AttentionCase{128, 6, 2, 16, {{1, 1}}, true},
        AttentionCase{128, 32, 4, 16, {{5000, 1}, {33, 1}}},
        // one or two decode rows of groups the decode kernel holds two to a warp (7, 8), many KV heads of one query
        // head each, and the 70B shape's group at a long context (all splits of a 16-block cluster busy)
        AttentionCase{128, 14, 2, 16, {{700, 1}, {1, 1}}}, AttentionCase{128, 32, 32, 16, {{1000, 1}}},
        AttentionCase{128, 64, 8, 16, {{20000, 1}}}, AttentionCase{256, 16, 2, 16, {{640, 1}, {1152, 1}}, true},
        // many decode rows, more CTAs than the GPU holds at once, graph and not
        AttentionCase{128, 32, 8, 16, ManyDecodeRows(300), true},
        AttentionCase{128, 16, 4, 16, ManyDecodeRows(200), false},
        // the decode graph's plan with unsplit KV: many rows of the 8B shape; GQA 3 with one context far longer
        // than the rest (slow, but the same result)
        AttentionCase{128, 32, 8, 16, ManyDecodeRows(67), true, true},
        AttentionCase{128, 6, 2, 16, {{3001, 1}, {1, 1}, {250, 1}, {17, 1}, {16, 1}}, true, true},
        // an fp8 KV cache: prefill chunks and decodes, head_dim 256 on odd pages, the decode graph's plans (split
        // and unsplit KV), many rows, one long context
        AttentionCase{128, 8, 2, 16, {{300, 300}, {97, 1}, {120, 17}, {1, 1}}, false, false, true},
        AttentionCase{256, 8, 1, 8, {{97, 97}, {64, 1}, {5, 2}}, false, false, true},
        AttentionCase{128, 32, 8, 16, {{1, 1}, {300, 1}, {2048, 1}, {17, 1}}, true, false, true},
        AttentionCase{128, 32, 8, 16, ManyDecodeRows(67), true, true, true},
        AttentionCase{128, 16, 4, 16, ManyDecodeRows(200), false, false, true},
        AttentionCase{128, 32, 4, 16, {{5000, 1}, {33, 1}}, false, false, true},
        // decode rows over an fp8 cache for the tensor-core decode kernel: groups 1, 7 and 8 (head_dim 256, odd
        // pages), pages of one token, a context of one run's tokens and one past it, many rows under the unsplit plan
        AttentionCase{128, 8, 8, 1, {{1, 1}, {17, 1}, {97, 1}}, false, false, true},
        AttentionCase{128, 14, 2, 16, {{700, 1}, {1, 1}, {16, 1}, {33, 1}}, false, false, true},
        AttentionCase{256, 16, 2, 8, {{640, 1}, {1152, 1}, {5, 1}}, true, true, true},
        AttentionCase{128, 32, 8, 16, ManyDecodeRows(300), true, true, true},
        // an fp8 cache with the checkpoint's scales: prefill chunks and decodes; the decode graph's split and
        // unsplit plans
        AttentionCase{128, 8, 2, 16, {{300, 300}, {97, 1}, {120, 17}, {1, 1}}, false, false, true, 0.05f, 3.f},
        AttentionCase{128, 32, 8, 16, {{1, 1}, {300, 1}, {2048, 1}, {17, 1}}, true, false, true, 2.5f, 0.02f},
        AttentionCase{128, 6, 2, 16, {{3001, 1}, {1, 1}, {250, 1}, {17, 1}, {16, 1}}, true, true, true, 0.05f, 3.f},
        // sliding windows (a cache of bf16), planned with the window: prefill chunks longer than the window and
        // decodes, head_dim 256 with one KV head (Gemma 3 270M), the decode graph's split and unsplit plans, a
        // window of one token, and long contexts whose KV the plan splits in chunks sized by the window (one and two
        // rows, and many, graph and not)
        AttentionCase{256, 4, 1, 16, {{300, 300}, {97, 1}, {120, 17}, {1, 1}}, false, false, false, 1.f, 1.f, 64},
        AttentionCase{128, 8, 2, 16, {{1, 1}, {300, 1}, {2048, 1}, {17, 1}}, true, false, false, 1.f, 1.f, 100},
        AttentionCase{128, 32, 8, 16, ManyDecodeRows(67), true, true, false, 1.f, 1.f, 33},
        AttentionCase{64, 4, 4, 1, {{17, 1}, {97, 5}}, false, false, false, 1.f, 1.f, 1},
        AttentionCase{256, 8, 4, 16, {{5000, 1}}, true, false, false, 1.f, 1.f, 1024},
        AttentionCase{256, 8, 4, 16, {{5000, 1}, {33, 1}}, false, false, false, 1.f, 1.f, 1024},
        AttentionCase{256, 4, 1, 16, {{3001, 1}, {2048, 5}, {700, 1}}, false, false, false, 1.f, 1.f, 200},
        AttentionCase{128, 16, 4, 16, ManyDecodeRows(200), true, false, false, 1.f, 1.f, 100},
        // soft-capped scores (Gemma 2), caps small enough to bend most scores: prefill chunks and decodes, with a
        // window (head_dim 256, Gemma 2's), the decode graph's plan, one and two decode rows (the decode kernel)
        AttentionCase{128, 8, 2, 16, {{300, 300}, {97, 1}, {120, 17}, {1, 1}}, false, false, false, 1.f, 1.f, 0, 0.5f},
        AttentionCase{256, 8, 4, 16, {{300, 300}, {700, 1}, {2048, 5}}, false, false, false, 1.f, 1.f, 64, 1.f},
        AttentionCase{128, 32, 8, 16, {{1, 1}, {300, 1}, {2048, 1}, {17, 1}}, true, false, false, 1.f, 1.f, 0, 0.5f},
        AttentionCase{64, 8, 2, 16, {{700, 1}, {33, 1}}, false, false, false, 1.f, 1.f, 0, 0.75f},
        AttentionCase{256, 8, 4, 16, {{3001, 1}}, true, false, false, 1.f, 1.f, 0, 1.f}));

TEST(PagedAttention, DecodeKvUnsplitWhenTheRowsFillTheGpuAndNoneIsFarLongerThanTheMean) {
  // 132 SMs, 8 KV heads: 17 rows give 136 CTAs, 16 give 128.
  EXPECT_TRUE(kernels::DecodeKvUnsplit(17, 8, 132, 5, 17 * 5));
  EXPECT_FALSE(kernels::DecodeKvUnsplit(16, 8, 132, 5, 16 * 5));
  EXPECT_TRUE(kernels::DecodeKvUnsplit(64, 8, 132, 72, 64 * 36));       // the longest at twice the mean
  EXPECT_FALSE(kernels::DecodeKvUnsplit(64, 8, 132, 73, 64 * 36));      // past it
  EXPECT_FALSE(kernels::DecodeKvUnsplit(64, 8, 132, 2048, 63 + 2048));  // one long context among short ones
  EXPECT_FALSE(kernels::DecodeKvUnsplit(0, 8, 132, 0, 0));
}

}  // namespace
}  // namespace inferd

// GatedMul (engine/backends/cpu/vec_ops.h), the cpu backend's SiLU·mul and GELU(tanh)·mul, against the formulas in
// double on odd lengths (the vector body and its scalar tail), across the range where σ saturates and past the
// exp's clamp. Both are g · σ(z) · up: a float argument z carries a relative error of about a unit in the last
// place, which σ turns into |z| (1 − σ) times as much in its value, so the bound is a few units in the last place
// times (1 + |z|), relative to the output (or 1e-30 where σ has saturated to nothing).
#include "engine/backends/cpu/vec_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace inferd {
namespace {

// σ's argument: out = g · σ(z) · up.
double Argument(Gated act, double g) {
  return act == Gated::kSilu ? g : 2.0 * std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g);
}

// In double; GELU's ½ (1 + tanh(u)) as σ(2u), the same number without the cancellation where tanh(u) nears −1.
double Reference(Gated act, double g, double up) {
  return g / (1.0 + std::exp(-Argument(act, g))) * up;
}

class GatedMulTest : public ::testing::TestWithParam<Gated> {};

TEST_P(GatedMulTest, EqualsTheFormulaWithinAFewUnitsInTheLastPlace) {
  const Gated act = GetParam();
  std::mt19937 rng(5);
  for (const float spread : {0.5f, 4.f, 30.f, 200.f}) {
    std::normal_distribution<float> d(0.f, spread);
    for (const int64_t n : {1, 7, 8, 9, 23, 64, 2051}) {
      std::vector<float> gate(n), up(n), out(n);
      for (float& v : gate) v = d(rng);
      for (float& v : up) v = d(rng) / spread;
      if (n > 4) gate[0] = 0.f, gate[1] = -0.f, gate[2] = 1e-30f, gate[3] = -95.f, gate[4] = 95.f;
      GatedMul(act, gate.data(), up.data(), out.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double want = Reference(act, gate[i], up[i]);
        const double z = Argument(act, gate[i]);
        EXPECT_NEAR(out[i], want, 4e-7 * (1.0 + std::abs(z)) * std::abs(want) + 1e-30)
            << (act == Gated::kSilu ? "silu" : "gelu_tanh") << " n " << n << " gate " << gate[i] << " up " << up[i];
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Activations, GatedMulTest, ::testing::Values(Gated::kSilu, Gated::kGeluTanh),
                         [](const auto& info) {
                           return std::string(info.param == Gated::kSilu ? "silu" : "gelu_tanh");
                         });

}  // namespace
}  // namespace inferd

#include "engine/backends/cpu/vec_ops.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace inferd {
namespace {

constexpr int kLanes = 8;

#if defined(__x86_64__)
bool HasAvx2Fma() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
}

// Two 8-lane sums (i mod 16 < 8 and ≥ 8), added lane by lane, then the lanes pairwise.
__attribute__((target("avx2,fma"))) float DotAvx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + kLanes), _mm256_loadu_ps(b + i + kLanes), s1);
  }
  for (; i + kLanes <= n; i += kLanes) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  const __m256 s = _mm256_add_ps(s0, s1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  float total = _mm_cvtss_f32(h);
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

__attribute__((target("avx2,fma"))) void AxpyAvx2(float alpha, const float* x, float* y, int64_t n) {
  const __m256 a = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += alpha * x[i];
}
#endif

float DotPlain(const float* a, const float* b, int64_t n) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += a[i + l] * b[i + l];
  }
  float total = 0;
  for (int l = 0; l < kLanes; ++l) total += lanes[l];
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

}  // namespace

float Dot(const float* a, const float* b, int64_t n) {
#if defined(__x86_64__)
  if (HasAvx2Fma()) return DotAvx2(a, b, n);
#endif
  return DotPlain(a, b, n);
}

void Axpy(float alpha, const float* x, float* y, int64_t n) {
#if defined(__x86_64__)
  if (HasAvx2Fma()) return AxpyAvx2(alpha, x, y, n);
#endif
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace inferd

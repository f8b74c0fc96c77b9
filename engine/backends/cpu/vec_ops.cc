#include "engine/backends/cpu/vec_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ggml.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace inferd {
namespace {

constexpr int kLanes = 8;

void GatedMulPlain(Gated act, const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    if (act == Gated::kSilu) {
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    } else {
      // ½ (1 + tanh(u)) = σ(2u): no cancellation where tanh(u) nears −1.
      out[i] = g / (1.0f + std::exp(-2.0f * 0.7978845608028654f * (g + 0.044715f * g * g * g))) * up[i];
    }
  }
}

#if defined(__x86_64__)
bool HasAvx2Fma() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
}
bool HasF16c() {
  static const bool has = HasAvx2Fma() && __builtin_cpu_supports("f16c");
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

// e^x for x in [-87.3, 88.7] (clamped to it): x = n ln 2 + r with |r| ≤ ln 2 / 2, e^r by Cephes' degree-6 polynomial
// for expf, times 2^n built in the exponent bits.
__attribute__((target("avx2,fma"))) __m256 Exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln 2 in two parts: the first exact in n·
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // n + 127 lies in [1, 255] for x in the clamped range except at its bottom, where 2^n is taken in two halves.
  const __m256i e = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(e, 1);
  const __m256 s0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 s1 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(e, half), _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s0), s1);
}

__attribute__((target("avx2,fma"))) void GatedMulAvx2(Gated act, const float* gate, const float* up, float* out,
                                                      int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    __m256 z = g;  // out = g · σ(z) · up
    if (act == Gated::kGeluTanh) {
      const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
      z = _mm256_mul_ps(_mm256_set1_ps(2.0f * 0.7978845608028654f), _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), g3, g));
    }
    const __m256 sigmoid = _mm256_div_ps(one, _mm256_add_ps(one, Exp8(_mm256_sub_ps(_mm256_setzero_ps(), z))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid), _mm256_loadu_ps(up + i)));
  }
  GatedMulPlain(act, gate + i, up + i, out + i, n - i);
}

// Eight 16-bit KV values widened to fp32.
template <KvElement kE>
__attribute__((target("avx2,fma,f16c"))) __m256 Widen8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (kE == KvElement::kFloat16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <KvElement kE>
__attribute__((target("avx2,fma,f16c"))) float DotKvAvx2(const float* a, const uint16_t* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), Widen8<kE>(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + kLanes), Widen8<kE>(b + i + kLanes), s1);
  }
  for (; i + kLanes <= n; i += kLanes) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), Widen8<kE>(b + i), s0);
  const __m256 s = _mm256_add_ps(s0, s1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  float total = _mm_cvtss_f32(h);
  for (; i < n; ++i) {
    float w;
    LoadKv(b + i, &w, 1, kE);
    total += a[i] * w;
  }
  return total;
}

template <KvElement kE>
__attribute__((target("avx2,fma,f16c"))) void LoadKvAvx2(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) _mm256_storeu_ps(y + i, Widen8<kE>(x + i));
  if (i < n) LoadKv(x + i, y + i, n - i, kE);
}

template <KvElement kE>
__attribute__((target("avx2,fma,f16c"))) void AxpyKvAvx2(float alpha, const uint16_t* x, float* y, int64_t n) {
  const __m256 a = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, Widen8<kE>(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) {
    float w;
    LoadKv(x + i, &w, 1, kE);
    y[i] += alpha * w;
  }
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

int64_t KvElementBytes(KvElement e) {
  return e == KvElement::kFloat32 ? 4 : 2;
}

const char* KvElementName(KvElement e) {
  switch (e) {
    case KvElement::kFloat32:
      return "float32";
    case KvElement::kFloat16:
      return "float16";
    case KvElement::kBfloat16:
      return "bfloat16";
  }
  return "?";
}

void StoreKv(const float* x, void* row, int64_t n, KvElement e) {
  switch (e) {
    case KvElement::kFloat32:
      std::memcpy(row, x, n * sizeof(float));
      return;
    case KvElement::kFloat16:
      ggml_fp32_to_fp16_row(x, static_cast<ggml_fp16_t*>(row), n);
      return;
    case KvElement::kBfloat16:
      ggml_fp32_to_bf16_row_ref(x, static_cast<ggml_bf16_t*>(row), n);  // nearest-even, as torch rounds
      return;
  }
}

void LoadKv(const void* row, float* y, int64_t n, KvElement e) {
#if defined(__x86_64__)
  if (e != KvElement::kFloat32 && n >= kLanes && HasF16c()) {
    const uint16_t* h = static_cast<const uint16_t*>(row);
    return e == KvElement::kFloat16 ? LoadKvAvx2<KvElement::kFloat16>(h, y, n)
                                    : LoadKvAvx2<KvElement::kBfloat16>(h, y, n);
  }
#endif
  switch (e) {
    case KvElement::kFloat32:
      std::memcpy(y, row, n * sizeof(float));
      return;
    case KvElement::kFloat16:
      ggml_fp16_to_fp32_row(static_cast<const ggml_fp16_t*>(row), y, n);
      return;
    case KvElement::kBfloat16:
      ggml_bf16_to_fp32_row(static_cast<const ggml_bf16_t*>(row), y, n);
      return;
  }
}

float DotKv(const float* q, const void* k, int64_t n, KvElement e) {
  if (e == KvElement::kFloat32) return Dot(q, static_cast<const float*>(k), n);
  const uint16_t* h = static_cast<const uint16_t*>(k);
#if defined(__x86_64__)
  if (HasF16c()) {
    return e == KvElement::kFloat16 ? DotKvAvx2<KvElement::kFloat16>(q, h, n)
                                    : DotKvAvx2<KvElement::kBfloat16>(q, h, n);
  }
#endif
  float lanes[kLanes] = {}, w[kLanes];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    LoadKv(h + i, w, kLanes, e);
    for (int l = 0; l < kLanes; ++l) lanes[l] += q[i + l] * w[l];
  }
  float total = 0;
  for (int l = 0; l < kLanes; ++l) total += lanes[l];
  for (; i < n; ++i) {
    LoadKv(h + i, w, 1, e);
    total += q[i] * w[0];
  }
  return total;
}

void AxpyKv(float alpha, const void* v, float* y, int64_t n, KvElement e) {
  if (e == KvElement::kFloat32) return Axpy(alpha, static_cast<const float*>(v), y, n);
  const uint16_t* h = static_cast<const uint16_t*>(v);
#if defined(__x86_64__)
  if (HasF16c()) {
    return e == KvElement::kFloat16 ? AxpyKvAvx2<KvElement::kFloat16>(alpha, h, y, n)
                                    : AxpyKvAvx2<KvElement::kBfloat16>(alpha, h, y, n);
  }
#endif
  float w[kLanes];
  for (int64_t i = 0; i < n; i += kLanes) {
    const int64_t m = std::min<int64_t>(kLanes, n - i);
    LoadKv(h + i, w, m, e);
    for (int64_t l = 0; l < m; ++l) y[i + l] += alpha * w[l];
  }
}

void GatedMul(Gated act, const float* gate, const float* up, float* out, int64_t n) {
#if defined(__x86_64__)
  if (HasAvx2Fma()) return GatedMulAvx2(act, gate, up, out, n);
#endif
  GatedMulPlain(act, gate, up, out, n);
}

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

// Helpers of the GPU kernel tests: device buffers from host vectors, bf16 and fp16 conversion, relative error.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/fp8.h"

namespace inferd::testing {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

inline bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// The bits of a 2-byte float.
template <typename T>
uint16_t Bits(T v) {
  uint16_t b;
  std::memcpy(&b, &v, 2);
  return b;
}

// Host-side conversions between fp32 and bf16 or fp16.
template <typename T>
T FromFloatHost(float f) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16(f);
  } else {
    return __float2half(f);
  }
}
template <typename T>
float ToFloatHost(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(v);
  } else {
    return __half2float(v);
  }
}

inline float Bf(float v) {
  return __bfloat162float(__float2bfloat16(v));
}  // rounds through bf16

inline std::vector<__nv_bfloat16> ToBf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16(v[i]);
  return out;
}
inline std::vector<float> FromBf16(const std::vector<__nv_bfloat16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __bfloat162float(v[i]);
  return out;
}

inline float Deq(kernels::Fp8 q) {
  return static_cast<float>(q);
}

// The host's quantization of one row to e4m3, as the kernels define it (kernels/fp8.h); returns its scale.
inline float QuantizeRow(const float* v, int64_t n, kernels::Fp8* q) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::abs(v[i]));
  const float scale = amax > 0 ? amax / kernels::kFp8Max : 1.f;
  for (int64_t i = 0; i < n; ++i) q[i].__x = __nv_cvt_float_to_fp8(v[i] / scale, __NV_SATFINITE, __NV_E4M3);
  return scale;
}

inline std::vector<float> Random(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// A device copy of a host vector, freed with the object.
template <typename T>
class Dev {
 public:
  explicit Dev(const std::vector<T>& host) : n_(host.size()) {
    cudaMalloc(&p_, sizeof(T) * (n_ ? n_ : 1));
    cudaMemcpy(p_, host.data(), sizeof(T) * n_, cudaMemcpyHostToDevice);
  }
  // n elements poisoned with 0xFF bytes (NaN for floats), so unwritten outputs show.
  explicit Dev(size_t n) : n_(n) {
    cudaMalloc(&p_, sizeof(T) * (n_ ? n_ : 1));
    cudaMemset(p_, 0xFF, sizeof(T) * n_);
  }
  ~Dev() { cudaFree(p_); }
  Dev(const Dev&) = delete;
  T* get() const { return p_; }
  std::vector<T> Host() const {
    std::vector<T> h(n_);
    cudaMemcpy(h.data(), p_, sizeof(T) * n_, cudaMemcpyDeviceToHost);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// Causal attention over paged K/V in fp64, from the kernel's own inputs (values already representable in its
// dtype). Sequence s has context seqs[s].first, its queries are its last seqs[s].second tokens, rows
// qo_indptr[s]..; its K/V slots are pages[kv_indptr[s] + j / bs] * bs + j % bs. q: [rows, q_stride], head h at
// h * D; k, v: [slots, kv_heads * D]. soft_cap > 0: scores s become soft_cap · tanh(s / soft_cap). Returns [rows,
// heads * D].
inline std::vector<double> PagedAttentionReference(
    const std::vector<float>& q, int64_t q_stride, const std::vector<float>& k, const std::vector<float>& v,
    const std::vector<std::pair<int32_t, int32_t>>& seqs, const std::vector<int32_t>& qo_indptr,
    const std::vector<int32_t>& kv_indptr, const std::vector<int32_t>& pages, int32_t bs, int32_t heads,
    int32_t kv_heads, int32_t D, double scale, int32_t window = 0, double soft_cap = 0) {
  const int64_t kv_dim = int64_t{kv_heads} * D;
  const int32_t group = heads / kv_heads;
  std::vector<double> ref(int64_t{qo_indptr.back()} * heads * D, 0.0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto [ctx, qlen] = seqs[s];
    for (int32_t i = 0; i < qlen; ++i) {
      const int64_t t = qo_indptr[s] + i;
      const int32_t visible = ctx - qlen + i + 1;
      const int32_t first = window > 0 ? std::max(0, visible - window) : 0;  // a sliding window of `window` tokens
      for (int32_t h = 0; h < heads; ++h) {
        const int32_t kvh = h / group;
        std::vector<double> p(visible, -1e300);
        double mx = -1e300;
        for (int32_t j = first; j < visible; ++j) {
          const int64_t slot = int64_t{pages[kv_indptr[s] + j / bs]} * bs + j % bs;
          double dot = 0;
          for (int32_t d = 0; d < D; ++d) dot += double{q[t * q_stride + h * D + d]} * k[slot * kv_dim + kvh * D + d];
          p[j] = soft_cap > 0 ? soft_cap * std::tanh(dot * scale / soft_cap) : dot * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (double& x : p) sum += (x = std::exp(x - mx));
        for (int32_t j = first; j < visible; ++j) {
          const int64_t slot = int64_t{pages[kv_indptr[s] + j / bs]} * bs + j % bs;
          for (int32_t d = 0; d < D; ++d) ref[(t * heads + h) * D + d] += p[j] / sum * v[slot * kv_dim + kvh * D + d];
        }
      }
    }
  }
  return ref;
}

// ‖a − b‖ / ‖b‖; infinite when a holds a NaN.
inline double RelError(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

}  // namespace inferd::testing

// Helpers of the GPU kernel tests: device buffers from host vectors, bf16 conversion, relative error.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace inferd::testing {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

inline bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
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

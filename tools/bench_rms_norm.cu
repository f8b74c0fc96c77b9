// Bandwidth of the bf16 RMSNorm kernel against the device-to-device copy ceiling (METHOD: bytes first).
// RMSNorm moves rows*n*2 bytes in and rows*n*2 out (+ the weight, once); it is bandwidth bound.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/rms_norm.h"

#define CHECK_CUDA(expr)                                                                          \
  do {                                                                                            \
    cudaError_t e_ = (expr);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

template <typename F>
float MedianMs(F&& run, int reps) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) run();  // warm-up
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(a));
    run();
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float t;
    CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int main() {
  const size_t copy_bytes = size_t{1} << 30;
  void *src, *dst;
  CHECK_CUDA(cudaMalloc(&src, copy_bytes));
  CHECK_CUDA(cudaMalloc(&dst, copy_bytes));
  CHECK_CUDA(cudaMemset(src, 1, copy_bytes));
  const float copy_ms =
      MedianMs([&] { CHECK_CUDA(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice)); }, 20);
  const double ceiling = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e9;  // read + write
  std::printf("copy ceiling: %.0f GB/s (1 GiB device-to-device, read+write)\n", ceiling);
  std::printf("%8s %8s %10s %10s %8s\n", "rows", "n", "time_us", "GB/s", "ratio");
  const int shapes[][2] = {{1, 576}, {64, 4096}, {2048, 4096}, {16384, 4096}, {16384, 8192}};
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (const auto& s : shapes) {
    const int64_t rows = s[0], n = s[1];
    std::vector<__nv_bfloat16> h(rows * n), w(n);
    for (auto& v : h) v = __float2bfloat16(dist(rng));
    for (auto& v : w) v = __float2bfloat16(1.f + 0.1f * dist(rng));
    __nv_bfloat16 *x, *wd, *out;
    CHECK_CUDA(cudaMalloc(&x, h.size() * 2));
    CHECK_CUDA(cudaMalloc(&wd, w.size() * 2));
    CHECK_CUDA(cudaMalloc(&out, h.size() * 2));
    CHECK_CUDA(cudaMemcpy(x, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(wd, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
    const float ms =
        MedianMs([&] { CHECK_CUDA(inferd::kernels::RmsNormBf16(x, wd, out, rows, n, 1e-5f, nullptr)); }, 50);
    const double bytes = 2.0 * rows * n * 2 + n * 2;
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    std::printf("%8ld %8ld %10.1f %10.0f %8.2f\n", rows, n, ms * 1e3, gbs, gbs / ceiling);
    CHECK_CUDA(cudaFree(x));
    CHECK_CUDA(cudaFree(wd));
    CHECK_CUDA(cudaFree(out));
  }
  return 0;
}

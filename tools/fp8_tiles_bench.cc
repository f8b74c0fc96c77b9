#include "tools/fp8_tiles_bench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "engine/backends/cuda/cuda_check.h"
#include "engine/backends/cuda/run_timer.h"
#include "kernels/fp8_gemm.h"

namespace inferd {
namespace {

void Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

template <typename T>
T* Alloc(int64_t count) {
  void* p = nullptr;
  Check(cudaMalloc(&p, count * sizeof(T)), "cudaMalloc");
  return static_cast<T*>(p);
}

// Finite e4m3 bytes (exponents 3..13, either sign), as the layers' quantized operands look.
void FillFp8(void* dst, int64_t bytes, std::mt19937& rng) {
  std::vector<uint8_t> host(std::min<int64_t>(bytes, int64_t{1} << 24));
  for (uint8_t& b : host) b = static_cast<uint8_t>(0x18 + rng() % 0x50) | (rng() & 0x80);
  for (int64_t off = 0; off < bytes; off += host.size()) {
    const int64_t n = std::min<int64_t>(host.size(), bytes - off);
    Check(cudaMemcpy(static_cast<char*>(dst) + off, host.data(), n, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
}

}  // namespace

nlohmann::json Fp8TileProducts(const ModelConfig& c, double read_tbs, double fp8_tflops) {
  nlohmann::json out = nlohmann::json::array();
  int device = 0;
  Check(cudaGetDevice(&device), "cudaGetDevice");
  if (!kernels::Fp8ScaledGemmAvailable(device)) {
    std::printf("fp8 CUTLASS tiles: this GPU does not run them\n");
    return out;
  }
  struct Shape {
    const char* name;
    int64_t n, k;
  };
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const std::vector<Shape> shapes = {
      {"qkv", c.qkv_width(), H}, {"o", H, c.q_width()}, {"gate_up", 2 * I, H}, {"down", H, I}};
  constexpr int64_t kMaxRows = 8192;
  const int64_t max_k = std::max({H, I, c.q_width()}), max_n = std::max({2 * I, c.qkv_width(), H});
  // Weights cycled through a 2 GiB pool, so that a decode-sized product reads them from memory, not L2.
  const int64_t pool_bytes = int64_t{2} << 30;
  auto* pool = Alloc<kernels::Fp8>(pool_bytes);
  auto* x = Alloc<kernels::Fp8>(kMaxRows * max_k);
  auto* y = Alloc<__nv_bfloat16>(kMaxRows * max_n);
  auto* scales = Alloc<float>(std::max(kMaxRows, max_n));
  std::mt19937 rng(5);
  FillFp8(pool, pool_bytes, rng);
  FillFp8(x, kMaxRows * max_k, rng);
  const std::vector<float> ones(std::max(kMaxRows, max_n), 1.f / 64);
  Check(cudaMemcpy(scales, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  cudaStream_t stream;
  Check(cudaStreamCreate(&stream), "cudaStreamCreate");
  std::printf(
      "fp8 CUTLASS tiles: microseconds, %% of the read ceiling up to 128 rows, of the fp8 GEMM ceiling beyond"
      " (* the tile by the rows)\n%5s %-8s",
      "m", "product");
  for (kernels::Fp8GemmTile t : kernels::kFp8GemmTiles) std::printf(" %20s", kernels::Fp8GemmTileName(t));
  std::printf("\n");
  for (int64_t m : {16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192}) {
    for (const Shape& sh : shapes) {
      const int64_t regions = std::max<int64_t>(1, pool_bytes / (sh.n * sh.k));
      std::printf("%5lld %-8s", static_cast<long long>(m), sh.name);
      for (kernels::Fp8GemmTile tile : kernels::kFp8GemmTiles) {
        int64_t i = 0;
        auto run = [&] {
          const kernels::Fp8* w = pool + (i++ % regions) * sh.n * sh.k;
          return cuda::FromCuda(kernels::Fp8ScaledGemm(x, scales, w, scales, nullptr, y, m, sh.n, sh.k, stream, tile),
                                "kernels::Fp8ScaledGemm");
        };
        absl::StatusOr<std::vector<float>> ms = cuda::TimeRuns(run, 3, stream);
        if (ms.ok()) ms = cuda::TimeRuns(run, 11, stream);
        if (!ms.ok()) {
          std::fprintf(stderr, "%s\n", ms.status().ToString().c_str());
          std::exit(1);
        }
        const double t = cuda::Median(*std::move(ms));
        const double share = m <= 128 ? double(sh.n) * sh.k / (t * 1e-3) / (read_tbs * 1e12)
                                      : 2.0 * m * sh.n * sh.k / (t * 1e-3) / (fp8_tflops * 1e12);
        std::printf(" %9.1f us %5.1f%%%c", 1e3 * t, 100 * share, tile == kernels::Fp8GemmTileFor(m) ? '*' : ' ');
        out.push_back({{"m", m}, {"product", sh.name}, {"tile", kernels::Fp8GemmTileName(tile)}, {"ms", t}});
      }
      std::printf("\n");
    }
  }
  cudaStreamDestroy(stream);
  cudaFree(pool);
  cudaFree(x);
  cudaFree(y);
  cudaFree(scales);
  return out;
}

}  // namespace inferd

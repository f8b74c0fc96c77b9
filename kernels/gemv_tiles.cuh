// The tensor-core form of the weight-streaming product, for decode steps of 2–8 rows (3–8 with e4m3 weights; device
// code only). The CUDA-core loop of gemv_rows.cuh converts and multiplies every weight once per row of X, so past
// one row or two its instructions, not the memory, set the pace; here a warp's tile of kTileRows rows of W meets all
// of X's rows (up to 8) in mma.sync m16n8k16 — W as the 16×16 A operand, X as the 16×8 B operand, fp32
// accumulation.
//
// The sum over k does not care in which order its terms come, so the operands are loaded the way the memory
// wants, not the way the mma fragments are laid out: lane (g, t) = (lane / 4, lane % 4) loads one 16-byte chunk
// (8 consecutive k) of W rows g and g + 8 and of X row g, and those 8 values become the k it holds in two mma
// steps (its 2t, 2t + 1, 2t + 8, 2t + 9 of each) — the same k of W and X, since both come from lane t's chunk.
// A block's warps split k (warp w takes the 32-k pieces w, w + warps, …) and meet in shared memory in warp order,
// so every product of a row sums in one order whatever the tile's other rows are: the fused kernels built on this
// equal the plain one bit for bit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/dependent_launch.cuh"
#include "kernels/row_access.cuh"

namespace inferd::kernels {

inline constexpr int kTileRows = 16;  // rows of W a tile: the mma's M
// Warps a block (one tile), splitting k, and the 32-k pieces a lane loads before it uses any (2 W + 1 X loads
// each; two batches in flight). On the 8B model's decode chain at 1–8 rows (H100, `inferd-bench --sections
// products`): 16 × 2 5.39–5.56 ms, as 8 × 4 and 16 × 4 do; 4 × 4 5.53–5.65; 4 × 2 and 2 × 4 6.05–6.25; 8 × 8
// (184 registers) 6.34–6.48; 32 × 1 5.69–5.96.
inline constexpr int kTileWarps = 16;
inline constexpr int kTileBatch = 2;

// d += A · B, m16n8k16, fp32 accumulation. a: A's fragment (rows g, g + 8; k 2t..2t+1, 2t+8..2t+9), b: B's.
template <typename T>
__device__ __forceinline__ void Mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
#endif
}

// One lane's 32-k piece: its chunk of W rows g (wa) and g + 8 (wb) and of X row g (xv, zero past X's rows).
template <typename T>
__device__ __forceinline__ void MmaPiece(const uint4& wa, const uint4& wb, const uint4 (&xv)[1], float (&acc)[4]) {
  Mma16816<T>(acc, wa.x, wb.x, wa.y, wb.y, xv[0].x, xv[0].y);
  Mma16816<T>(acc, wa.z, wb.z, wa.w, wb.w, xv[0].z, xv[0].w);
}

// e4m3 weights (kernels/fp8.h) run as f16 in the mma: each pair converts exactly (one instruction), and X's rows
// follow as f16. A bf16 row is scaled by kFp8TileXScale on the way (exact, a power of two): f16 holds every bf16
// value of magnitude 2^-13 to 2^20 exactly (smaller ones round to multiples of 2^-20, larger ones saturate to
// 2^20: far past the activations of the models tested here); the product's sum is scaled back after.
template <typename T>
inline constexpr float kFp8TileXScale = std::is_same_v<T, __nv_bfloat16> ? 0.0625f : 1.f;

// An e4m3 pair (half 0 or 1 of a word) as an f16 pair: exact, one conversion instruction. (The same done in integer
// operations — the pair's bits shifted into f16's, 2^-8 times the value — measured slower: kernels/NOTES.md.)
__device__ __forceinline__ uint32_t Fp8PairToHalf2(uint32_t word, int half) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> (16 * half)), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// Two of X's values (one 32-bit word of T) as an f16 pair, scaled by kFp8TileXScale<T>.
template <typename T>
__device__ __forceinline__ uint32_t XPairToHalf2(uint32_t word) {
  if constexpr (std::is_same_v<T, __half>) {
    return word;
  } else {
    const float lo = __uint_as_float(word << 16) * kFp8TileXScale<T>;
    const float hi = __uint_as_float(word & 0xffff0000u) * kFp8TileXScale<T>;
    uint32_t out;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
#else
    out = 0;
#endif
    return out;
  }
}

// The e4m3 piece: a lane's 16-byte chunk of a W row is 16 weights, and X's 16 values of them two 16-byte chunks;
// mma i takes bytes 4i..4i+3 of each W chunk (pairs to k slots 2t, 2t + 1 and 2t + 8, 2t + 9) and X's words 2i,
// 2i + 1 (the same k).
template <typename T>
__device__ __forceinline__ void MmaPieceFp8(const uint4& wa, const uint4& wb, const uint4 (&xv)[2], float (&acc)[4]) {
  const uint32_t a[4] = {wa.x, wa.y, wa.z, wa.w}, b[4] = {wb.x, wb.y, wb.z, wb.w};
  const uint32_t xw[8] = {xv[0].x, xv[0].y, xv[0].z, xv[0].w, xv[1].x, xv[1].y, xv[1].z, xv[1].w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    Mma16816<__half>(acc, Fp8PairToHalf2(a[i], 0), Fp8PairToHalf2(b[i], 0), Fp8PairToHalf2(a[i], 1),
                     Fp8PairToHalf2(b[i], 1), XPairToHalf2<T>(xw[2 * i]), XPairToHalf2<T>(xw[2 * i + 1]));
  }
}

// A warp's share of one tile against X's M rows (k apart): wa, wb the lane's W rows g and g + 8 (16-byte chunks of
// W: T, or Fp8 for e4m3 weights), k a multiple of 16 / sizeof(W). acc ends as the warp's partial sums: (tile row g,
// X rows 2t, 2t + 1), (g + 8, 2t, 2t + 1). W streams before the kernel that writes X has ended (dependent launch);
// X is read after.
template <typename T, int M, typename W = T, int kWarps = kTileWarps, int kBatch = kTileBatch>
__device__ __forceinline__ void TileDot(const uint4* __restrict__ wa, const uint4* __restrict__ wb,
                                        const T* __restrict__ x, int64_t k, int warp, int lane, bool next_starts_early,
                                        float (&acc)[4]) {
  constexpr int kXChunks = 16 / sizeof(W) / 8;  // X's 16-byte chunks a W chunk meets
  const int g = lane / 4, t = lane % 4;
  const int64_t chunks = k / (16 / sizeof(W)), pieces = (chunks + 3) / 4;
  const uint4* xr = reinterpret_cast<const uint4*>(x + int64_t{g < M ? g : 0} * k);
  constexpr int64_t kStride = int64_t{kWarps} * kBatch;
  // Two batches of W in flight: the next one's loads go out before this one's products wait for theirs.
  uint4 va[kBatch], vb[kBatch], na[kBatch], nb[kBatch];
  auto load_w = [&](int64_t p0, uint4(&a)[kBatch], uint4(&b)[kBatch]) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t c = (p0 + u * kWarps) * 4 + t;
      if (c < chunks) {
        a[u] = LoadOnce(wa + c);
        b[u] = LoadOnce(wb + c);
      } else {
        a[u] = b[u] = make_uint4(0, 0, 0, 0);
      }
    }
  };
  int64_t p0 = warp;
  if (p0 < pieces) load_w(p0, va, vb);
  WaitForPrerequisites();
  if (next_starts_early) AllowDependentsToLaunch();
  for (; p0 < pieces; p0 += kStride) {
    uint4 xv[kBatch][kXChunks];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t c = (p0 + u * kWarps) * 4 + t;
#pragma unroll
      for (int h = 0; h < kXChunks; ++h) {
        xv[u][h] = g < M && c < chunks ? __ldg(xr + c * kXChunks + h) : make_uint4(0, 0, 0, 0);
      }
    }
    const bool more = p0 + kStride < pieces;
    if (more) load_w(p0 + kStride, na, nb);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if constexpr (std::is_same_v<W, T>) {
        MmaPiece<T>(va[u], vb[u], xv[u], acc);
      } else {
        MmaPieceFp8<T>(va[u], vb[u], xv[u], acc);
      }
    }
    if (more) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        va[u] = na[u];
        vb[u] = nb[u];
      }
    }
  }
}

// The block's warps' sums, in warp order, in warp 0's acc (every warp must call it). part: kWarps · 4 · 32.
template <int kWarps = kTileWarps>
__device__ __forceinline__ void TileSum(float* part, int warp, int lane, float (&acc)[4]) {
  if (warp > 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) part[(warp * 4 + i) * 32 + lane] = acc[i];
  }
  __syncthreads();
  if (warp == 0) {
    for (int w = 1; w < kWarps; ++w) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i] += part[(w * 4 + i) * 32 + lane];
    }
  }
}

}  // namespace inferd::kernels

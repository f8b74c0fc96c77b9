// Matrix products of a few rows, as decode steps run them: Y[m, n] = X[m, k] · W[n, k]ᵀ (+ bias[n]) for
// m ≤ kGemvMaxRows. Such products read all of W and almost nothing else, so they are bound by how fast W streams
// from memory; these kernels read each weight once with 16-byte loads, several in flight per thread, and keep
// every row of X beside it. T = __nv_bfloat16 or __half, fp32 accumulation, Y in T (rounded once) or fp32.
// Launched as a programmatic dependent (kernels/dependent_launch.cuh): it starts streaming W while the kernel
// before it on the stream finishes, and reads X only once that kernel is done.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/elementwise.h"

namespace inferd::kernels {

inline constexpr int kGemvMaxRows = 8;

// How a product runs: on CUDA cores (each weight converted and multiplied once per row of X: what one row wants)
// or on tensor cores (tiles of 16 weight rows against every row of X in mma.sync: two rows and more). kAuto picks
// by the rows; benchmarks force one to compare them.
enum class GemvForm { kAuto, kCudaCores, kTensorCores };
inline constexpr int kGemvTensorCoreRows = 2;  // kAuto: tensor cores from this many rows

// True when Gemv can run this shape: 1 ≤ m ≤ kGemvMaxRows, k a multiple of 8 and x, w 16-byte aligned.
bool GemvSupports(const void* x, const void* w, int64_t m, int64_t k);

// x: [m, k], w: [n, k], bias: [n] or null, y: [m, n] with rows ldy ≥ n elements apart (0: n). Returns
// cudaErrorInvalidValue where GemvSupports is false.
template <typename T, typename Out>
cudaError_t Gemv(const T* x, const T* w, const T* bias, Out* y, int64_t m, int64_t n, int64_t k, cudaStream_t stream,
                 int64_t ldy = 0, GemvForm form = GemvForm::kAuto);

// True when GemvQkvRope can run this shape: GemvSupports, head_dim even, and a multiple of 16 where the rows run on
// tensor cores.
bool GemvQkvRopeSupports(const void* x, const void* w, int64_t m, int64_t k, int32_t head_dim);

// The q/k/v product of a decode step of m ≤ kGemvMaxRows tokens with RoPE and the K/V cache write fused into it: qkv =
// x · wᵀ (+ bias), q and k heads rotated, K and V written to each token's slot — the same values, bit for bit,
// as Gemv then RopeWriteKv (kernels/elementwise.h, whose layouts these arguments follow). w: [(num_heads +
// 2 num_kv_heads) · head_dim, k]. attention_starts_early: the kernel after it (the decode attention of
// kernels/decode_attention.h, which reads only earlier K/V before it waits) may launch once this one's blocks run.
template <typename T>
cudaError_t GemvQkvRope(const T* x, const T* w, const T* bias, T* qkv, int64_t m, int64_t k, const int32_t* positions,
                        const int32_t* slots, const float* inv_freq, T* k_cache, T* v_cache, int32_t num_heads,
                        int32_t num_kv_heads, int32_t head_dim, cudaStream_t stream,
                        bool attention_starts_early = false);

// The gate/up product of a decode step of m ≤ kGemvMaxRows tokens with the gated activation fused into it: out[r, i] =
// act(x·w_gateᵢ) · x·w_upᵢ, the same values, bit for bit, as Gemv into gate_up then ActivateMul
// (kernels/elementwise.h). w: [2 · inter, k] (the gate's rows, then the up rows), out: [m, inter].
template <typename T>
cudaError_t GemvGatedAct(const T* x, const T* w, T* out, int64_t m, int64_t inter, int64_t k, GatedActivation act,
                         cudaStream_t stream);

}  // namespace inferd::kernels

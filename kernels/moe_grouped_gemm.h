// The experts' products for steps of many rows (prefill) on Hopper: CUTLASS's grouped ("pointer array") GEMM, a
// group per expert, warp-specialised with TMA loads and wgmma, from the CUTLASS headers the FlashInfer wheel ships.
// The groups' shapes and pointers are made on the device from the routing's offsets (a kernel before the GEMM), so
// nothing goes back to the host. Y[i] = X[i] · W_eᵀ for i in expert e's run [offsets[e], offsets[e + 1]), as
// MoeExpertGemm (kernels/moe_products.h), fp32 accumulation (e4m3: the tensor cores' own), Y rounded once to T.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/fp8.h"

namespace inferd::kernels {

// True where the running device can take it: compute capability 9.0 and this build carries sm_90a code.
bool MoeGroupedGemmAvailable(int device);

// Device scratch a call with `experts` groups needs (the groups' shapes, pointers and strides, and CUTLASS's own
// workspace for `sm_count` multiprocessors), enough for bf16, fp16 and e4m3 calls.
size_t MoeGroupedGemmWorkspaceBytes(int32_t experts, int sm_count);

// x: [slots, k] grouped by expert, w: [experts, n, k], y: [slots, n]; offsets: [experts + 1] on the device. n and
// k multiples of 8, x, w and y 16-byte aligned; workspace of MoeGroupedGemmWorkspaceBytes(experts, sm_count), 256-byte
// aligned. cudaErrorNotSupported where MoeGroupedGemmAvailable is false.
// slots: the rows of all runs (the step's rows × k), which picks the tiles by the runs' average length: under 32
// rows an expert, 128 x 128 tiles stored from registers; else (and 0) 128 x 256 tiles stored by TMA.
template <typename T>
cudaError_t MoeGroupedGemm(const T* x, const T* w, const int32_t* offsets, int32_t experts, T* y, int64_t n, int64_t k,
                           void* workspace, size_t workspace_bytes, int sm_count, cudaStream_t stream,
                           int64_t slots = 0);

// The same with e4m3 rows and weights (`engine.quantization: fp8`), y the unscaled sums (the tensor cores' fast
// accumulation, as the dense fp8 products) rounded to bf16, whose range holds any sum of e4m3 products
// (kernels/moe_fp8.h scales them): n a multiple of 8, k of 16.
cudaError_t MoeGroupedGemmFp8(const Fp8* x, const Fp8* w, const int32_t* offsets, int32_t experts, __nv_bfloat16* y,
                              int64_t n, int64_t k, void* workspace, size_t workspace_bytes, int sm_count,
                              cudaStream_t stream, int64_t slots = 0);

}  // namespace inferd::kernels

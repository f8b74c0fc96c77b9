// Attention of a step's decode rows (one query token per sequence, the last of its context) over the paged KV
// cache, for steps of a few rows. FlashInfer's kernels spend ~10 µs a layer of fixed cost on such rows (a tensor-core
// tile for a handful of query heads, then a second launch to merge the split KV); here one launch does it: a
// thread-block cluster per (row, KV head), each block of it streams a run of the row's tokens through shared memory
// for all the query heads that read that KV head, and the blocks merge their partial softmax sums through
// distributed shared memory. No plan and no workspace: the lengths are read on the device, so a CUDA graph replays
// it for any context. Layouts and result as RunPagedAttention (kernels/paged_attention.h) on such rows, for a cache
// of T (not fp8) and no sliding window.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace inferd::kernels {

// The most query heads per KV head (the group) the kernel holds.
inline constexpr int32_t kDecodeAttentionMaxGroup = 8;

// Whether RunDecodeAttention serves this shape on the current device: thread-block clusters (compute capability
// 9.0 or later, with code compiled for it), head_dim 64, 128 or 256, a group of at most kDecodeAttentionMaxGroup.
bool DecodeAttentionSupports(int32_t num_qo_heads, int32_t num_kv_heads, int32_t head_dim);

// out[r, h · head_dim + d] = softmax(q_r,h · Kᵀ · sm_scale) · V over row r's whole context, for num_rows rows each
// the only query of its sequence (sequence r's pages kv_indices[kv_indptr[r] .. kv_indptr[r + 1]), its last page
// holding kv_last_page_len[r] tokens). q rows are q_row_stride elements apart. A row with no context gets zeros.
// early_launch: a programmatic dependent of the kernel before it (which writes q and the newest K/V). soft_cap > 0:
// scores s become soft_cap · tanh(s / soft_cap) (RunPagedAttention's logits_soft_cap).
// cudaErrorInvalidValue where DecodeAttentionSupports is false.
template <typename T>
cudaError_t RunDecodeAttention(const T* q, int64_t q_row_stride, const T* k_cache, const T* v_cache,
                               const int32_t* kv_indptr, const int32_t* kv_indices, const int32_t* kv_last_page_len,
                               T* out, int32_t num_rows, int32_t num_qo_heads, int32_t num_kv_heads, int32_t head_dim,
                               int32_t page_size, float sm_scale, bool early_launch, cudaStream_t stream,
                               float soft_cap = 0.f);

// The same result for decode rows over an fp8 e4m3 cache (bf16 queries; K / k_scale and V / v_scale as the cache
// holds them, read with sm_scale = k_scale / √head_dim and v_scale, as RunPagedAttention), for steps of many rows:
// a block per (row, KV head) whose four warps share the row's tokens and score them on the tensor cores, K and V
// converted to f16 exactly (kernels/decode_attention_fp8.cu). No plan, no workspace, no split of a row's tokens
// over blocks, so it suits steps whose (row, KV head) pairs fill the GPU (DecodeKvUnsplit).
bool DecodeAttentionFp8Supports(int32_t num_qo_heads, int32_t num_kv_heads, int32_t head_dim);
cudaError_t RunDecodeAttentionFp8(const __nv_bfloat16* q, int64_t q_row_stride, const __nv_fp8_e4m3* k_cache,
                                  const __nv_fp8_e4m3* v_cache, const int32_t* kv_indptr, const int32_t* kv_indices,
                                  const int32_t* kv_last_page_len, __nv_bfloat16* out, int32_t num_rows,
                                  int32_t num_qo_heads, int32_t num_kv_heads, int32_t head_dim, int32_t page_size,
                                  float sm_scale, float v_scale, bool early_launch, cudaStream_t stream);

}  // namespace inferd::kernels

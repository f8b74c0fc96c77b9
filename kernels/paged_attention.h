// Paged causal attention over the KV pool through FlashInfer's batch prefill kernel, which serves prefill
// chunks (attending to earlier cached pages) and decode rows (query length 1) for any GQA group size.
// Plan on the host, then run on the device. Raw pointers + sizes + stream in, cudaError_t out.
//
// KV layout (one place): per layer, K and V each [num_blocks, block_size, num_kv_heads, head_dim] (FlashInfer's
// NHD). The page table is CSR: sequence s owns pages kv_indices[kv_indptr[s] .. kv_indptr[s + 1]), its last
// page holding kv_last_page_len[s] tokens. Queries of sequence s are rows qo_indptr[s] .. qo_indptr[s + 1] and
// are the last tokens of its context (causal).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/sizes.h"

namespace inferd::kernels {

// Head dims with compiled kernels: AttentionHeadDimSupported, AttentionFp8KvHeadDimSupported (kernels/sizes.h).

// Workspace sizes (kAttentionFloatWorkspaceBytes, kAttentionIntWorkspaceBytes): kernels/sizes.h.

// The kernel a plan runs: FlashInfer's batch prefill kernel of the Ampere generation (any GPU; every decode plan),
// or its Hopper kernel (FA3: TMA and wgmma, warp-specialised; sm_90a code on a 9.0 GPU, caches of T, no window or
// soft cap), for prefill steps whose queries fill its 128-row tiles.
enum class AttentionKernel : int32_t { kAmpere = 0, kHopper = 1 };

// FlashInfer's plan, opaque to callers.
struct AttentionPlan {
  int64_t words[15] = {};
  AttentionKernel kernel = AttentionKernel::kAmpere;
  // A decode graph's plan with unsplit KV (one query row a sequence): over an fp8 cache RunPagedAttention runs
  // RunDecodeAttentionFp8 (kernels/decode_attention.h) instead, where it serves the shape.
  bool decode_unsplit = false;
};

// Whether the Hopper prefill kernel can run on `device` from this build (sm_90a code on a 9.0 GPU).
bool HopperPrefillAvailable(int device);

// Whether a prefill step's queries fill the Hopper kernel's query tiles (128 rows, 192 at head dim 64; a tile per
// run of a sequence's queries and head): at least three quarters of the tiles' rows hold queries, so decode rows
// and short chunks mixed into a step leave it on the Ampere kernel, whose 16-row tiles fit them.
// qo_indptr_host: [num_seqs + 1].
bool HopperPrefillFits(const int32_t* qo_indptr_host, int32_t num_seqs, int32_t head_dim);

// Plans one step. qo_indptr_host, kv_indptr_host: [num_seqs + 1] on the host. Copies the schedule into
// int_workspace through int_workspace_pinned on `stream`; keep the pinned buffer untouched until the copy ran.
// decode_graph: the run is (or will be) replayed from a CUDA graph captured for this num_tokens and num_seqs (a
// decode step of one query token a sequence, or a verify step of a few) — the plan's layout then depends on them
// and unsplit_kv alone: FlashInfer pads the grid to a fixed size (its query tiles sized for the longest run the
// rows allow, or for one row where num_tokens == num_seqs) and splits every sequence's KV into chunks merged
// afterwards, writing each step's split into the workspace the graph reads; or, with unsplit_kv (one row a
// sequence only), gives each (sequence, KV head) its whole KV in one CTA and runs no merge.
// window_left ≥ 0: the plan serves runs with this sliding window (RunPagedAttention's window_left), whose KV chunks
// FlashInfer sizes by the window; -1: runs without one. A split plan serves only runs of its own window, so a model
// mixing sliding-window and global layers plans each step twice, each schedule in its own int workspace.
// hopper_prefill: the Hopper kernel's plan, given kv_last_page_len_host ([num_seqs], the tokens on each sequence's
// last page), for a plan that is not decode_graph's and has no window; the caller passes it only where the build
// and GPU run the kernel (HopperPrefillAvailable), for runs over a cache of T without soft caps, and (for speed)
// where the step's queries fill its tiles (HopperPrefillFits). Otherwise, or where its schedule does not fit the
// workspace, the plan is the Ampere kernel's.
cudaError_t PlanPagedAttention(void* float_workspace, void* int_workspace, void* int_workspace_pinned,
                               const int32_t* qo_indptr_host, const int32_t* kv_indptr_host, int32_t num_tokens,
                               int32_t num_seqs, int32_t num_qo_heads, int32_t num_kv_heads, int32_t head_dim,
                               int32_t page_size, bool decode_graph, bool unsplit_kv, AttentionPlan* plan,
                               cudaStream_t stream, int32_t window_left = -1, bool hopper_prefill = false,
                               const int32_t* kv_last_page_len_host = nullptr);

// Whether a decode step (one query row per sequence) is better run with unsplit KV: when its (sequence, KV
// head) pairs alone give every SM a CTA, and no sequence's KV is more than twice the mean, since one much longer
// than the rest would keep its CTAs running after the others finish (split KV balances it). Without the split
// the merge of partial outputs goes (on the H100 at batch 64, 5.7 us per layer). kv_pages: the step's pages per
// sequence.
inline bool DecodeKvUnsplit(int64_t num_seqs, int64_t num_kv_heads, int64_t num_sms, int64_t max_kv_pages,
                            int64_t total_kv_pages) {
  return num_seqs > 0 && num_seqs * num_kv_heads >= num_sms && max_kv_pages * num_seqs <= 2 * total_kv_pages;
}

// out[t, h * head_dim + d] = v_scale · softmax(q·Kᵀ · sm_scale) · V over the causal context of row t, K and V as
// the cache holds them. q rows are q_row_stride elements apart (q may sit inside a fused qkv row). Device arrays as
// in the header comment. C, the cache's element type: T, or __nv_fp8_e4m3 with T = __nv_bfloat16 (head_dim 128 or
// 256). A cache holding K / k_scale and V / v_scale (RopeWriteKv) is read with sm_scale = k_scale / √head_dim and
// this v_scale; a cache of T with v_scale 1.
// early_launch: launch the kernels as programmatic dependents (sm_90): attention starts while the kernel before
// it finishes and waits for it before reading q or the cache; the merge of split-KV partials the same way.
// window_left ≥ 0: a sliding window, row t (at position p) attends to positions p − window_left .. p only
// (FlashInfer's window option; a cache of T only; a plan made with the same window_left); −1: the whole causal
// context.
// logits_soft_cap > 0: each score s = q·k · sm_scale becomes cap · tanh(s / cap) before the softmax (Gemma 2's
// attn_logit_softcapping; FlashInfer's soft-cap variant, a cache of T only); 0: none.
template <typename T, typename C = T>
cudaError_t RunPagedAttention(const AttentionPlan& plan, void* float_workspace, void* int_workspace, const T* q,
                              int64_t q_row_stride, const C* k_cache, const C* v_cache, const int32_t* qo_indptr,
                              const int32_t* kv_indptr, const int32_t* kv_indices, const int32_t* kv_last_page_len,
                              T* out, int32_t num_seqs, int32_t num_qo_heads, int32_t num_kv_heads, int32_t head_dim,
                              int32_t page_size, float sm_scale, float v_scale, bool early_launch, cudaStream_t stream,
                              int32_t window_left = -1, float logits_soft_cap = 0.f);

// A Hopper plan's words: FlashInfer's PrefillPlanSM90Info (9), then the step's query rows.
inline constexpr int kHopperPlanRowsWord = 9;

// RunPagedAttention's run of a Hopper plan (paged_attention_hopper_*.cu): num_rows, the step's query rows.
#define INFERD_DECLARE_HOPPER_PREFILL(T)                                                                         \
  cudaError_t RunHopperPrefill(const AttentionPlan& plan, void* int_workspace, const T* q, int64_t q_row_stride, \
                               const T* k_cache, const T* v_cache, const int32_t* kv_indices, T* out,            \
                               int32_t num_rows, int32_t num_qo_heads, int32_t num_kv_heads, int32_t head_dim,   \
                               int32_t page_size, float sm_scale, cudaStream_t stream)
INFERD_DECLARE_HOPPER_PREFILL(__nv_bfloat16);
INFERD_DECLARE_HOPPER_PREFILL(__half);

}  // namespace inferd::kernels

// What host code needs to plan the kernels' buffers without CUDA: workspace sizes, the sampler's per-row
// parameters and its output widths. Plain C++ (no CUDA headers), so the memory layout that `inferd plan` prints
// and the cuda backend allocates from is one piece of arithmetic.
#pragma once

#include <cstddef>
#include <cstdint>

namespace inferd::kernels {

// FlashInfer's paged attention (paged_attention.h).
// Head dims with compiled kernels, in increasing order (FlashInfer's shared-memory layout wants whole 128-byte rows
// of a head; paged_attention_run.cuh instantiates these).
inline constexpr int32_t kAttentionHeadDims[] = {64, 128, 256};
constexpr bool AttentionHeadDimSupported(int32_t head_dim) {
  for (int32_t d : kAttentionHeadDims) {
    if (d == head_dim) return true;
  }
  return false;
}
// With an fp8 e4m3 KV cache (bf16 queries): FlashInfer's one-byte KV loads do not serve head_dim 64.
constexpr bool AttentionFp8KvHeadDimSupported(int32_t head_dim) {
  return head_dim == 128 || head_dim == 256;
}
// The head dim attention runs a model's heads of head_dim at: itself where compiled, else the next compiled one
// above (each head padded with zeros; engine/model/head_padding.h), 0 above every one.
constexpr int32_t AttentionRunHeadDim(int32_t head_dim) {
  for (int32_t d : kAttentionHeadDims) {
    if (head_dim <= d) return head_dim % 2 == 0 ? d : 0;
  }
  return 0;
}
constexpr size_t kAttentionFloatWorkspaceBytes = size_t{128} << 20;  // device: split-KV partial outputs
constexpr size_t kAttentionIntWorkspaceBytes = size_t{8} << 20;      // device and pinned host: schedule

// The one-shot peer collectives (all_reduce.h): each rank's inboxes, two slots of one message from every rank,
// and its counters (two of its calls, one per rank of joins with rank 0).
constexpr int kPeerMaxRanks = 8;
constexpr int64_t PeerInboxBytes(int64_t capacity_bytes, int ranks) {
  return 2 * int64_t{ranks} * capacity_bytes;
}
constexpr int64_t kPeerCallBytes = (2 + kPeerMaxRanks) * sizeof(uint32_t);
// What NCCL took on each GPU for two ranks with NVLink multicast off (NCCL 2.28, two H200s joined by NVLink,
// 2026-11-26: 867 MiB beyond everything else start-up allocates), counted once per peer.
constexpr int64_t kNcclBytesPerPeer = int64_t{867} << 20;

// The experts' grouped GEMM (moe_grouped_gemm.h): its groups' shapes, pointers and strides and CUTLASS's own
// workspace, a bound (the real size, MoeGroupedGemmWorkspaceBytes, is 86–140 KB for 8–512 experts on 132–170
// multiprocessors; the backend checks it at start-up and leaves the grouped GEMM unused where it would not fit).
constexpr int64_t kMoeGroupedGemmWorkspaceBytes = int64_t{1} << 20;

// Sampling (sampling.h): alternatives reported per row at most.
constexpr int kMaxTopLogprobs = 20;

// Per logits row.
struct SamplingRowParams {
  float temperature;  // 0 = greedy (argmax; ties pick the lowest id)
  int32_t top_k;      // 0 = off
  float top_p;        // 1 = off
  float min_p;        // 0 = off
  float repetition_penalty;
  float presence_penalty;
  float frequency_penalty;
  int32_t top_logprobs;  // > 0: report the chosen token's logprob and this many alternatives (≤ kMaxTopLogprobs)
  int32_t target;        // >= 0: a prompt row: the token is this id (nothing sampled), its logprob reported
  double uniform;        // in [0, 1)
  int32_t masked = 0;    // 1: structured output, the row's bitmask in `allowed` (SampleRows) masks its logits
};

// Penalty entries of row r: [penalty_indptr[r], penalty_indptr[r + 1]), one per distinct token id.
constexpr uint8_t kPenaltySeen = 1;    // in the prompt or output: repetition penalty applies
constexpr uint8_t kPenaltyBanned = 2;  // may not be sampled now
constexpr uint8_t kPenaltyBias = 4;    // penalty_bias is added to its logit (after the penalties)

}  // namespace inferd::kernels

// The cuda backend's device memory, described on the host from the model, the step limits and the dtype: every
// activation and workspace region, the step-input and output arenas, the graph buckets and the KV block
// geometry. The backend allocates from it and `inferd plan` reports from it, so the two cannot disagree. No CUDA
// here: it builds and is tested everywhere.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model/kv_groups.h"
#include "engine/model/model.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/graph_buckets.h"

namespace inferd {

// A piece of an arena: `offset` bytes from its start, `bytes` long. Offsets are 256-byte aligned.
struct Region {
  int64_t offset = 0;
  int64_t bytes = 0;
};

// Carves regions out of one allocation in the order they are added.
class ArenaBuilder {
 public:
  Region Add(int64_t bytes);
  int64_t size() const { return size_; }

 private:
  int64_t size_ = 0;
};

// T = max_num_batched_tokens, R = max_num_seqs, L = 2R logits rows (sampled and prompt rows), e = element bytes (2
// for bf16 and fp16).
struct ActivationRegions {
  Region x, xn, tmp;     // [T, hidden] e: residual stream, normed input, a layer's output
  Region tmp_normed;     // [T, hidden] e: a half's output normed before the residual add (sandwich norms), else 0
  Region qkv;            // [T, qkv_width] e
  Region attn;           // [T, q_width] e: attention output
  Region gate_up;        // [T, 2 * intermediate] e: gate rows then up rows
  Region act;            // [T, intermediate] e: SiLU(gate) * up
  Region act_fp8;        // fp8 weights: [T, max(hidden, q_width, intermediate)] e4m3, a product's input
  Region act_scale;      // fp8 weights: [T] fp32, its per-token scales
  Region last_n;         // [L, hidden] e: the logits rows, normed
  Region logits;         // [L, vocab] fp32
  Region inv_freq;       // [3, head_dim / 2] fp32 rotary inverse frequencies: global, sliding-window, LongRoPE's long
  Region attn_float_ws;  // FlashInfer's float workspace (split-KV partial outputs)
  Region attn_int_ws;    // FlashInfer's schedule (mirrored in pinned host memory)
  // The sliding-window layers' own schedule (models with windows only): they are planned apart from the global
  // layers, whose KV may then be split (kernels/paged_attention.h).
  Region attn_int_ws_window;
  Region outputs;      // the OutputRegions arena
  Region penalty_raw;  // [max penalty entries] fp32: raw logits of penalized ids
  // A mixture of experts (0 bytes without): the router's logits [T, experts] fp32; MoeRoute's top k [T * k] ids
  // and fp32 weights, its counts [experts] (zero between calls), offsets [experts + 1], slots in expert order and
  // their places [T * k]; then the rows gathered in that order [T * k, hidden] e, their gate/up [T * k, 2 *
  // expert intermediate] e, SiLU·mul [T * k, expert intermediate] e and outputs [T * k, hidden] e.
  Region moe_logits, moe_ids, moe_weights, moe_counts, moe_offsets, moe_sorted, moe_positions;
  Region moe_x, moe_gate_up, moe_act, moe_y;
  Region moe_x_scale, moe_act_scale;  // fp8 experts: the grouped products' input rows' scales
  Region moe_gemm_ws;                 // the experts' grouped GEMM's workspace (kernels::kMoeGroupedGemmWorkspaceBytes)
};

// What a step samples, one arena copied back to pinned host memory.
struct OutputRegions {
  Region tokens;        // [L] int32
  Region logprobs;      // [L] fp32, the chosen token's
  Region top_ids;       // [L, kMaxTopLogprobs] int32
  Region top_logprobs;  // [L, kMaxTopLogprobs] fp32
  // [1] int32, a mixture of experts' (else empty): experts a step of several rows routed rows to, summed over its
  // sparse layers (kernels::MoeRoute counts them).
  Region experts_touched;
};

// Step inputs: packed into pinned host memory, copied to a device mirror of the same layout. kv_indices is the
// last of the sections that every step copies, so a step copies [0, kv_indices.offset + its pages * 4). Per KV
// group (engine/model/kv_groups.h) the slots and kv_indptr at a fixed stride, and the pages one group after the
// other: KV group g's page table is kv_indptr's g-th row (the step's pages counted before it added) into kv_indices.
struct InputRegions {
  Region token_ids, positions;  // [T] int32: token ids (or pending rows), positions
  Region slots;                 // [KV groups, T] int32: the KV slot of each token in the group's blocks
  Region qo_indptr;             // [R + 1] int32
  Region kv_indptr;             // [KV groups, R + 1] int32
  Region kv_last_page_len;      // [R] int32
  Region logits_indices;        // [L] int32: token rows whose logits are computed
  Region params;                // [L] kernels::SamplingRowParams
  Region penalty_indptr;        // [L + 1] int32
  // [1] uint32: 1 once the masks of the rows that have one are on the device; 0 while the host still fills those
  // of a step planned ahead (SamplingRow::allowed_later), which its sampling waits for.
  Region masks_ready;
  Region kv_indices;       // [KV groups * max_pages] int32 block ids
  Region penalty_tokens;   // [max_penalties] int32
  Region penalty_counts;   // [max_penalties] int32: times in the output
  Region penalty_bias;     // [max_penalties] fp32: logit bias, where the flags say kPenaltyBias
  Region penalty_flags;    // [max_penalties] uint8 kernels::kPenalty*
  Region allowed;          // [R, mask_words] uint32: structured output's masks of the sampled rows
  int64_t mask_words = 0;  // ⌈vocab / 32⌉
  // Elements from one KV group's row to the next: of slots (T) and of kv_indptr (R + 1).
  int64_t slots_stride = 0, indptr_stride = 0;
  int64_t max_pages = 0;      // every sequence at the model's longest context (at most 2^22)
  int64_t max_penalties = 0;  // every sequence's distinct ids: context, stop, eos and biased ids
};

struct DeviceLayout {
  StepLimits limits;  // the largest step it holds
  int64_t element_bytes = 0;
  bool fp8_weights = false;      // the layers' linear weights are fp8 e4m3 with a fp32 scale per output row
  int64_t kv_element_bytes = 0;  // 1: an fp8 e4m3 KV cache (engine.kv_cache_dtype); else element_bytes
  int64_t weight_bytes = 0;      // every present tensor at element_bytes (linear weights as fp8 + scales if so)
  ActivationRegions activations;
  int64_t activation_arena_bytes = 0;
  int64_t gemm_workspace_bytes = 0;  // cuBLASLt's, allocated by the product wrapper
  OutputRegions outputs;
  int64_t output_arena_bytes = 0;
  InputRegions inputs;
  int64_t input_arena_bytes = 0;
  int64_t kv_block_bytes = 0;      // K or V of one layer for one block: [block_size, kv_heads, head_dim] kv e
  int64_t kv_bytes_per_block = 0;  // K and V of KvGroups::slots layers for one block
  KvGroups kv_groups;              // which layers' K and V a block holds, in which group's blocks
  // The step shapes with a captured graph (graph_buckets.h): decode ones, and speculative decoding's verify ones.
  std::vector<GraphBucket> graph_buckets;
  std::vector<int32_t> decode_buckets;  // the decode buckets' batch sizes: 1, 2, 4, ... max_num_seqs
  int32_t tensor_parallel_size = 1;
  int64_t peer_message_bytes = 0;  // tensor_parallel_size > 1: the largest sum the one-shot peer kernels take

  // The plan's activation bytes: the activation arena and the GEMM workspace.
  int64_t activation_bytes() const { return activation_arena_bytes + gemm_workspace_bytes; }
  // Step inputs on the device and the one reserved block padded decode rows write: part of the plan's "other".
  int64_t step_input_bytes() const { return input_arena_bytes + kv_bytes_per_block; }
  // tensor_parallel_size > 1: the peer kernels' inboxes and counters, and NCCL's buffers; part of "other".
  int64_t collective_bytes() const;
};

inline constexpr int64_t kGemmWorkspaceBytes = int64_t{32} << 20;

// kv_element_bytes: 1 for an fp8 KV cache; 0 = element_bytes. tensor_parallel_size > 1: the layout of one device
// of that many (engine/model/tensor_parallel.h): its shard of the layers' weights, its KV heads, the activations
// of its heads and columns; CheckTensorParallel must have passed.
DeviceLayout PlanDeviceLayout(const Model& model, const StepLimits& limits, int64_t element_bytes,
                              bool fp8_weights = false, int64_t kv_element_bytes = 0, int32_t tensor_parallel_size = 1);

}  // namespace inferd

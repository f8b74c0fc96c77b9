#include "engine/runtime/device_memory.h"

#include <algorithm>

#include "engine/request.h"

namespace inferd {
namespace {

int64_t Aligned(int64_t bytes) {
  return (bytes + 255) / 256 * 256;
}

}  // namespace

int64_t DeviceWeightBytes(const ModelTensors& t, int64_t e) {
  int64_t n = t.embed.numel() + t.final_norm.numel() + (t.lm_head.present() ? t.lm_head.numel() : 0);
  for (const LayerTensors& L : t.layers) {
    for (const TensorDesc* d : {&L.input_norm, &L.q_proj, &L.k_proj, &L.v_proj, &L.q_bias, &L.k_bias, &L.v_bias,
                                &L.o_proj, &L.post_norm, &L.gate_proj, &L.up_proj, &L.down_proj}) {
      if (d->present()) n += d->numel();
    }
  }
  return n * e;
}

int64_t DeviceActivationBytes(const ModelConfig& c, const StepLimits& limits, int64_t e) {
  const int64_t Tn = limits.max_num_batched_tokens, R = limits.max_num_seqs;
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  const int64_t q_dim = int64_t{c.num_heads} * D, qkv_dim = q_dim + 2 * int64_t{c.num_kv_heads} * D;
  int64_t bytes = e * Tn * (3 * H + qkv_dim + q_dim + 2 * I + I)  // x, xn, tmp; qkv; attention out; gate/up; act
                  + e * 3 * R * H                                 // the rows that sample: last, its delta, normed
                  + 4 * R * int64_t{c.vocab_size}                 // fp32 logits
                  + kPlanAttentionWorkspaceBytes + 4 * (D / 2)    // FlashInfer workspaces; rotary frequencies
                  + kPlanGemmWorkspaceBytes;
  // Sampled ids, logprobs and the top alternatives, each section 256-byte aligned.
  bytes += Aligned(4 * R) + Aligned(4 * R) + 2 * Aligned(4 * R * kPlanMaxTopLogprobs);
  return bytes;
}

int64_t DeviceStepInputBytes(const ModelConfig& c, const StepLimits& limits, int32_t num_eos_ids, int64_t e) {
  const int64_t Tn = limits.max_num_batched_tokens, R = limits.max_num_seqs, bs = limits.block_size;
  const int64_t max_context = c.max_position_embeddings;
  const int64_t max_pages = std::min<int64_t>(R * ((max_context + bs - 1) / bs), int64_t{1} << 22);
  const int64_t max_penalties = R * std::min<int64_t>(max_context + kMaxStopTokenIds + num_eos_ids, c.vocab_size);
  constexpr int64_t kRowParams = 40;  // the device sampler's per-row parameters
  const int64_t bytes = 3 * Aligned(Tn * 4) + 2 * Aligned((R + 1) * 4) + 2 * Aligned(R * 4) + Aligned(R * kRowParams) +
                        Aligned((R + 1) * 4) + Aligned(max_pages * 4) + 2 * Aligned(max_penalties * 4) +
                        Aligned(max_penalties) + max_penalties * 4;  // arena, and the raw logits of penalized ids
  return bytes + KvBytesPerBlock(c, limits.block_size, e);
}

int64_t KvBytesPerBlock(const ModelConfig& c, int32_t block_size, int64_t e) {
  return 2 * int64_t{c.num_layers} * block_size * c.num_kv_heads * c.head_dim * e;
}

}  // namespace inferd

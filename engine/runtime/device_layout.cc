#include "engine/runtime/device_layout.h"

#include <algorithm>

#include "engine/request.h"
#include "kernels/sizes.h"

namespace inferd {

Region ArenaBuilder::Add(int64_t bytes) {
  const Region r{size_, bytes};
  size_ += (bytes + 255) / 256 * 256;
  return r;
}

namespace {

int64_t WeightBytes(const ModelTensors& t, int64_t e, bool fp8) {
  int64_t n = 0;
  for (const TensorDesc* d : AllTensors(t)) n += d->numel() * e;  // numel() is 0 for an absent tensor
  if (!fp8) return n;
  for (const LayerTensors& L : t.layers) {
    for (const TensorDesc* d : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj, &L.down_proj}) {
      n += d->numel() * (1 - e) + d->rows * 4;  // one byte an element and a fp32 scale per row
    }
  }
  return n;
}

}  // namespace

DeviceLayout PlanDeviceLayout(const Model& model, const StepLimits& limits, int64_t e, bool fp8_weights,
                              int64_t kv_element_bytes) {
  const ModelConfig& c = model.config;
  const int64_t T = limits.max_num_batched_tokens, R = limits.max_num_seqs, bs = limits.block_size;
  const int64_t L = limits.max_logits_rows();  // sampled rows and prompt rows
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  DeviceLayout l;
  l.limits = limits;
  l.element_bytes = e;
  l.fp8_weights = fp8_weights;
  l.kv_element_bytes = kv_element_bytes > 0 ? kv_element_bytes : e;
  l.weight_bytes = WeightBytes(model.tensors, e, fp8_weights);

  // Step inputs sized for the worst case: every sequence at the model's longest context, and one penalty entry
  // per distinct id a row can hold, ban or bias (its context, at most kMaxStopTokenIds stop ids, the eos ids and
  // kMaxLogitBias biased ids).
  const int64_t max_context = c.max_position_embeddings;
  const int64_t max_banned = kMaxStopTokenIds + static_cast<int64_t>(model.eos_token_ids.size()) + kMaxLogitBias;
  InputRegions& in = l.inputs;
  in.max_pages = std::min<int64_t>(R * ((max_context + bs - 1) / bs), int64_t{1} << 22);
  in.max_penalties = R * std::min<int64_t>(max_context + max_banned, c.vocab_size);
  ArenaBuilder inputs;
  in.token_ids = inputs.Add(T * 4);
  in.positions = inputs.Add(T * 4);
  in.slots = inputs.Add(T * 4);
  in.qo_indptr = inputs.Add((R + 1) * 4);
  in.kv_indptr = inputs.Add((R + 1) * 4);
  in.kv_last_page_len = inputs.Add(R * 4);
  in.logits_indices = inputs.Add(L * 4);
  in.params = inputs.Add(L * int64_t{sizeof(kernels::SamplingRowParams)});
  in.penalty_indptr = inputs.Add((L + 1) * 4);
  in.kv_indices = inputs.Add(in.max_pages * 4);
  in.penalty_tokens = inputs.Add(in.max_penalties * 4);
  in.penalty_counts = inputs.Add(in.max_penalties * 4);
  in.penalty_bias = inputs.Add(in.max_penalties * 4);
  in.penalty_flags = inputs.Add(in.max_penalties);
  l.input_arena_bytes = inputs.size();

  OutputRegions& out = l.outputs;
  ArenaBuilder outputs;
  out.tokens = outputs.Add(L * 4);
  out.logprobs = outputs.Add(L * 4);
  out.top_ids = outputs.Add(L * kernels::kMaxTopLogprobs * 4);
  out.top_logprobs = outputs.Add(L * kernels::kMaxTopLogprobs * 4);
  l.output_arena_bytes = outputs.size();

  ActivationRegions& a = l.activations;
  ArenaBuilder act;
  a.x = act.Add(T * H * e);
  a.xn = act.Add(T * H * e);
  a.tmp = act.Add(T * H * e);
  a.qkv = act.Add(T * c.qkv_width() * e);
  a.attn = act.Add(T * c.q_width() * e);
  a.gate_up = act.Add(T * 2 * I * e);
  a.act = act.Add(T * I * e);
  const int64_t widest_input = std::max<int64_t>({H, c.q_width(), I});
  a.act_fp8 = act.Add(fp8_weights ? T * widest_input : 0);
  a.act_scale = act.Add(fp8_weights ? T * 4 : 0);
  a.last = act.Add(L * H * e);
  a.last_delta = act.Add(L * H * e);
  a.last_n = act.Add(L * H * e);
  a.logits = act.Add(L * int64_t{c.vocab_size} * 4);
  a.inv_freq = act.Add(int64_t{c.head_dim} / 2 * 4);
  a.attn_float_ws = act.Add(static_cast<int64_t>(kernels::kAttentionFloatWorkspaceBytes));
  a.attn_int_ws = act.Add(static_cast<int64_t>(kernels::kAttentionIntWorkspaceBytes));
  a.outputs = act.Add(l.output_arena_bytes);
  a.penalty_raw = act.Add(in.max_penalties * 4);
  l.activation_arena_bytes = act.size();
  l.gemm_workspace_bytes = kGemmWorkspaceBytes;

  l.kv_block_bytes = bs * c.kv_width() * l.kv_element_bytes;
  l.kv_bytes_per_block = 2 * int64_t{c.num_layers} * l.kv_block_bytes;
  for (int32_t b = 1; b < limits.max_num_seqs; b *= 2) l.decode_buckets.push_back(b);
  l.decode_buckets.push_back(limits.max_num_seqs);
  return l;
}

}  // namespace inferd

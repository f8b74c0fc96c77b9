#include "engine/runtime/device_layout.h"

#include <algorithm>

#include "engine/model/tensor_parallel.h"
#include "engine/request.h"
#include "kernels/sizes.h"

namespace inferd {

Region ArenaBuilder::Add(int64_t bytes) {
  const Region r{size_, bytes};
  size_ += (bytes + 255) / 256 * 256;
  return r;
}

namespace {

// One device's weight bytes: the layers' products sharded (output rows of q/k/v and gate/up, input columns of o and
// down), everything else whole (rank 0's, the largest: the other ranks hold only their vocabulary run of the LM
// head). fp8: one byte an element and a fp32 scale per output row of each product.
int64_t WeightBytes(const Model& model, int64_t e, bool fp8, const TensorParallelShard& shard) {
  const ModelConfig& c = model.config;
  const ModelTensors& t = model.tensors;
  const double q = static_cast<double>(shard.q_heads.size()) / c.num_heads;
  const double kv = static_cast<double>(shard.kv_heads.size()) / c.num_kv_heads;
  const double cols = static_cast<double>(shard.intermediate.size()) / c.intermediate_size;
  const double expert_cols =
      c.has_experts() ? static_cast<double>(shard.expert_intermediate.size()) / c.moe_intermediate_size : 1.0;
  int64_t n = 0;
  for (const TensorDesc* d : AllTensors(t)) n += d->numel() * e;  // numel() is 0 for an absent tensor
  for (const LayerTensors& L : t.layers) {
    // Each expert's intermediate columns split as the dense MLP's (the router whole on every rank, in the compute
    // dtype); fp8 experts as the dense products: a byte an element and a scale per output row.
    for (const LayerTensors::Expert& x : L.experts) {
      for (const TensorDesc* d : {&x.gate, &x.up, &x.down}) {
        const int64_t elements = static_cast<int64_t>(d->numel() * expert_cols);
        n -= (d->numel() - elements) * e;
        const double rows_share = d == &x.down ? 1.0 : expert_cols;
        if (fp8) n += elements * (1 - e) + static_cast<int64_t>(d->rows * rows_share) * 4;
      }
    }
    struct Part {
      const TensorDesc* d;
      double share;       // of its elements on this device
      double rows_share;  // of its output rows (fp8 scales)
    };
    for (const Part& p :
         {Part{&L.q_proj, q, q}, Part{&L.k_proj, kv, kv}, Part{&L.v_proj, kv, kv}, Part{&L.o_proj, q, 1},
          Part{&L.gate_proj, cols, cols}, Part{&L.up_proj, cols, cols}, Part{&L.down_proj, cols, 1},
          Part{&L.q_bias, q, q}, Part{&L.k_bias, kv, kv}, Part{&L.v_bias, kv, kv}}) {
      const int64_t elements = static_cast<int64_t>(p.d->numel() * p.share);
      n -= (p.d->numel() - elements) * e;
      const bool product = p.d != &L.q_bias && p.d != &L.k_bias && p.d != &L.v_bias;
      if (fp8 && product) n += elements * (1 - e) + static_cast<int64_t>(p.d->rows * p.rows_share) * 4;
    }
  }
  return n;
}

}  // namespace

DeviceLayout PlanDeviceLayout(const Model& model, const StepLimits& limits, int64_t e, bool fp8_weights,
                              int64_t kv_element_bytes, int32_t tensor_parallel_size) {
  const ModelConfig& c = model.config;
  const TensorParallelShard shard = ShardOf(c, tensor_parallel_size, 0);  // every device's share is the same size
  const int64_t D = c.head_dim;
  const int64_t q_width = shard.q_heads.size() * D, kv_width = shard.kv_heads.size() * D;
  const int64_t T = limits.max_num_batched_tokens, R = limits.max_num_seqs, bs = limits.block_size;
  const int64_t L = limits.max_logits_rows();  // sampled rows and prompt rows
  const int64_t H = c.hidden_size, I = shard.intermediate.size();
  DeviceLayout l;
  l.limits = limits;
  l.element_bytes = e;
  l.fp8_weights = fp8_weights;
  l.kv_element_bytes = kv_element_bytes > 0 ? kv_element_bytes : e;
  l.weight_bytes = WeightBytes(model, e, fp8_weights, shard);

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
  l.kv_groups = KvGroupsOf(c);
  const int64_t G = l.kv_groups.num_groups();
  in.slots_stride = T;
  in.indptr_stride = R + 1;
  in.slots = inputs.Add(G * in.slots_stride * 4);
  in.qo_indptr = inputs.Add((R + 1) * 4);
  in.kv_indptr = inputs.Add(G * in.indptr_stride * 4);
  in.kv_last_page_len = inputs.Add(R * 4);
  in.logits_indices = inputs.Add(L * 4);
  in.params = inputs.Add(L * int64_t{sizeof(kernels::SamplingRowParams)});
  in.penalty_indptr = inputs.Add((L + 1) * 4);
  in.masks_ready = inputs.Add(4);
  in.kv_indices = inputs.Add(G * in.max_pages * 4);
  in.penalty_tokens = inputs.Add(in.max_penalties * 4);
  in.penalty_counts = inputs.Add(in.max_penalties * 4);
  in.penalty_bias = inputs.Add(in.max_penalties * 4);
  in.penalty_flags = inputs.Add(in.max_penalties);
  in.mask_words = (int64_t{c.vocab_size} + 31) / 32;
  in.allowed = inputs.Add(R * in.mask_words * 4);
  l.input_arena_bytes = inputs.size();

  OutputRegions& out = l.outputs;
  ArenaBuilder outputs;
  out.tokens = outputs.Add(L * 4);
  out.logprobs = outputs.Add(L * 4);
  out.top_ids = outputs.Add(L * kernels::kMaxTopLogprobs * 4);
  out.top_logprobs = outputs.Add(L * kernels::kMaxTopLogprobs * 4);
  out.experts_touched = outputs.Add(c.num_experts > 0 ? 4 : 0);
  l.output_arena_bytes = outputs.size();

  ActivationRegions& a = l.activations;
  ArenaBuilder act;
  a.x = act.Add(T * H * e);
  a.xn = act.Add(T * H * e);
  a.tmp = act.Add(T * H * e);
  a.tmp_normed = act.Add(c.arch->sandwich_norms() ? T * H * e : 0);
  a.qkv = act.Add(T * (q_width + 2 * kv_width) * e);
  a.attn = act.Add(T * q_width * e);
  a.gate_up = act.Add(T * 2 * I * e);
  a.act = act.Add(T * I * e);
  const int64_t widest_input = std::max<int64_t>({H, q_width, I});
  a.act_fp8 = act.Add(fp8_weights ? T * widest_input : 0);
  a.act_scale = act.Add(fp8_weights ? T * 4 : 0);
  a.last_n = act.Add(L * H * e);
  a.logits = act.Add(L * int64_t{c.vocab_size} * 4);
  a.inv_freq = act.Add(3 * int64_t{c.head_dim} / 2 * 4);
  a.attn_float_ws = act.Add(static_cast<int64_t>(kernels::kAttentionFloatWorkspaceBytes));
  a.attn_int_ws = act.Add(static_cast<int64_t>(kernels::kAttentionIntWorkspaceBytes));
  a.attn_int_ws_window = act.Add(!c.has_windows() ? 0 : static_cast<int64_t>(kernels::kAttentionIntWorkspaceBytes));
  a.outputs = act.Add(l.output_arena_bytes);
  a.penalty_raw = act.Add(in.max_penalties * 4);
  if (c.has_experts()) {
    const int64_t E = c.num_experts, S = T * c.experts_per_token, Ie = shard.expert_intermediate.size();
    a.moe_logits = act.Add(T * E * 4);
    a.moe_ids = act.Add(S * 4);
    a.moe_weights = act.Add(S * 4);
    a.moe_counts = act.Add(E * 4);
    a.moe_offsets = act.Add((E + 1) * 4);
    a.moe_sorted = act.Add(S * 4);
    a.moe_positions = act.Add(S * 4);
    // With fp8 experts the grouped products' inputs are e4m3 rows with a scale each, their outputs the unscaled
    // sums in bf16 (kernels/moe_fp8.h): the same regions.
    a.moe_x = act.Add(S * H * e);
    a.moe_gate_up = act.Add(S * 2 * Ie * e);
    a.moe_act = act.Add(S * Ie * e);
    a.moe_y = act.Add(S * H * e);
    a.moe_x_scale = act.Add(fp8_weights ? S * 4 : 0);
    a.moe_act_scale = act.Add(fp8_weights ? S * 4 : 0);
    a.moe_gemm_ws = act.Add(kernels::kMoeGroupedGemmWorkspaceBytes);
  }
  l.activation_arena_bytes = act.size();
  l.gemm_workspace_bytes = kGemmWorkspaceBytes;

  l.kv_block_bytes = bs * kv_width * l.kv_element_bytes;
  l.kv_bytes_per_block = 2 * int64_t{l.kv_groups.slots} * l.kv_block_bytes;
  l.graph_buckets = GraphBucketsFor(limits);
  for (GraphBucket b : l.graph_buckets)
    if (b.decode()) l.decode_buckets.push_back(b.seqs);
  // The sums of a decode step of the largest bucket go through the one-shot peer kernels; larger ones through NCCL.
  l.tensor_parallel_size = tensor_parallel_size;
  l.peer_message_bytes = tensor_parallel_size > 1 ? int64_t{l.decode_buckets.back()} * H * e : 0;
  return l;
}

int64_t DeviceLayout::collective_bytes() const {
  if (tensor_parallel_size <= 1) return 0;
  return kernels::PeerInboxBytes(peer_message_bytes, tensor_parallel_size) + kernels::kPeerCallBytes +
         (tensor_parallel_size - 1) * kernels::kNcclBytesPerPeer;
}

}  // namespace inferd

// The cuda backend's memory layout, computed on the host: every region inside its arena, aligned, apart from the
// others and as large as its documented shape; the KV geometry; the graph buckets.
#include "engine/runtime/device_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

#include "kernels/sizes.h"

namespace inferd {
namespace {

Model Llama3_8bShape() {
  Model m;
  m.config.vocab_size = 128256;
  m.config.hidden_size = 4096;
  m.config.intermediate_size = 14336;
  m.config.num_layers = 32;
  m.config.num_heads = 32;
  m.config.num_kv_heads = 8;
  m.config.head_dim = 128;
  m.config.max_position_embeddings = 8192;
  m.eos_token_ids = {128001, 128009};
  return m;
}

// Each region aligned to 256 bytes, inside [0, size), and overlapping none of the others (an empty one overlaps
// nothing).
void ExpectDisjoint(std::vector<std::pair<const char*, Region>> regions, int64_t size) {
  std::erase_if(regions, [](const auto& r) { return r.second.bytes == 0; });
  std::sort(regions.begin(), regions.end(), [](auto& a, auto& b) { return a.second.offset < b.second.offset; });
  int64_t end = 0;
  for (const auto& [name, r] : regions) {
    EXPECT_EQ(r.offset % 256, 0) << name;
    EXPECT_GE(r.offset, end) << name << " overlaps the region before it";
    EXPECT_LE(r.offset + r.bytes, size) << name << " ends past its arena";
    end = r.offset + r.bytes;
  }
}

// A model with sliding-window layers plans its window layers apart from its global ones: a second schedule, in a
// region of its own; a config that lists every layer global has none.
TEST(DeviceLayout, SlidingWindowLayersGetASchedulesRegionOfTheirOwn) {
  Model m = Llama3_8bShape();
  m.config.layer_window.assign(m.config.num_layers, 0);
  EXPECT_EQ(PlanDeviceLayout(m, StepLimits{256, 8192, 16}, 2).activations.attn_int_ws_window.bytes, 0);
  m.config.layer_window[3] = 1024;
  const DeviceLayout l = PlanDeviceLayout(m, StepLimits{256, 8192, 16}, 2);
  EXPECT_EQ(l.activations.attn_int_ws_window.bytes, static_cast<int64_t>(kernels::kAttentionIntWorkspaceBytes));
  ExpectDisjoint({{"attn_int_ws", l.activations.attn_int_ws},
                  {"attn_int_ws_window", l.activations.attn_int_ws_window},
                  {"attn_float_ws", l.activations.attn_float_ws}},
                 l.activation_arena_bytes);
}

TEST(DeviceLayout, RegionsHoldTheirShapesApartInsideTheirArenas) {
  const Model m = Llama3_8bShape();
  // L: a sampled row per sequence and as many prompt rows (prompt_logprobs).
  const int64_t T = 8192, R = 256, L = 2 * R, e = 2;
  const DeviceLayout l = PlanDeviceLayout(m, StepLimits{256, 8192, 16}, e, /*fp8_weights=*/true);
  const ActivationRegions& a = l.activations;
  ExpectDisjoint({{"x", a.x},
                  {"xn", a.xn},
                  {"tmp", a.tmp},
                  {"tmp_normed", a.tmp_normed},
                  {"qkv", a.qkv},
                  {"attn", a.attn},
                  {"gate_up", a.gate_up},
                  {"act", a.act},
                  {"act_fp8", a.act_fp8},
                  {"act_scale", a.act_scale},
                  {"last_n", a.last_n},
                  {"logits", a.logits},
                  {"inv_freq", a.inv_freq},
                  {"attn_float_ws", a.attn_float_ws},
                  {"attn_int_ws", a.attn_int_ws},
                  {"attn_int_ws_window", a.attn_int_ws_window},
                  {"outputs", a.outputs},
                  {"penalty_raw", a.penalty_raw}},
                 l.activation_arena_bytes);
  // Shapes as the forward pass indexes them: 32 heads and 8 KV heads of 128 make a q/k/v row of 6144.
  EXPECT_EQ(a.qkv.bytes, T * 6144 * e);
  EXPECT_EQ(a.attn.bytes, T * 4096 * e);
  EXPECT_EQ(a.gate_up.bytes, T * 2 * 14336 * e);
  EXPECT_EQ(a.logits.bytes, L * 128256 * 4);
  EXPECT_EQ(a.last_n.bytes, L * 4096 * e);
  EXPECT_EQ(a.inv_freq.bytes, 3 * 64 * 4);  // the global, sliding-window and LongRoPE-long tables
  EXPECT_EQ(a.tmp_normed.bytes, 0) << "Llama has no sandwich norms";
  EXPECT_EQ(a.attn_int_ws_window.bytes, 0) << "nor sliding windows";
  EXPECT_EQ(a.outputs.bytes, l.output_arena_bytes);
  const InputRegions& in = l.inputs;
  ExpectDisjoint({{"token_ids", in.token_ids},
                  {"positions", in.positions},
                  {"slots", in.slots},
                  {"qo_indptr", in.qo_indptr},
                  {"kv_indptr", in.kv_indptr},
                  {"kv_last_page_len", in.kv_last_page_len},
                  {"logits_indices", in.logits_indices},
                  {"params", in.params},
                  {"penalty_indptr", in.penalty_indptr},
                  {"kv_indices", in.kv_indices},
                  {"penalty_tokens", in.penalty_tokens},
                  {"penalty_counts", in.penalty_counts},
                  {"penalty_bias", in.penalty_bias},
                  {"penalty_flags", in.penalty_flags}},
                 l.input_arena_bytes);
  // The page table comes after every fixed-size section: a step's head copy ends inside it.
  for (const Region* r : {&in.token_ids, &in.positions, &in.slots, &in.qo_indptr, &in.kv_indptr, &in.kv_last_page_len,
                          &in.logits_indices, &in.params, &in.penalty_indptr}) {
    EXPECT_LT(r->offset, in.kv_indices.offset);
  }
  EXPECT_EQ(in.max_pages, 256 * 8192 / 16);
  EXPECT_EQ(in.max_penalties, 256 * (8192 + kMaxStopTokenIds + 2 + kMaxLogitBias));
  EXPECT_EQ(in.params.bytes, L * int64_t{sizeof(kernels::SamplingRowParams)});
  EXPECT_EQ(in.logits_indices.bytes, L * 4);
  EXPECT_EQ(in.qo_indptr.bytes, (R + 1) * 4);
  const OutputRegions& o = l.outputs;
  ExpectDisjoint(
      {{"tokens", o.tokens}, {"logprobs", o.logprobs}, {"top_ids", o.top_ids}, {"top_logprobs", o.top_logprobs}},
      l.output_arena_bytes);
  EXPECT_EQ(o.top_ids.bytes, L * kernels::kMaxTopLogprobs * 4);
  // K or V of one layer for a block of 16 tokens: 16 x 8 heads x 128 x 2 bytes; K and V of 32 layers.
  EXPECT_EQ(l.kv_block_bytes, 16 * 8 * 128 * 2);
  EXPECT_EQ(l.kv_bytes_per_block, 2 * 32 * l.kv_block_bytes);
  EXPECT_EQ(l.activation_bytes(), l.activation_arena_bytes + kGemmWorkspaceBytes);
  EXPECT_EQ(l.step_input_bytes(), l.input_arena_bytes + l.kv_bytes_per_block);
  // An fp8 KV cache (engine.kv_cache_dtype: fp8_e4m3): one byte an element, so a block is half as large and the
  // rest of the layout is unchanged.
  const DeviceLayout kv8 = PlanDeviceLayout(m, StepLimits{256, 8192, 16}, e, /*fp8_weights=*/true, 1);
  EXPECT_EQ(kv8.kv_block_bytes, 16 * 8 * 128 * 1);
  EXPECT_EQ(kv8.kv_bytes_per_block * 2, l.kv_bytes_per_block);
  EXPECT_EQ(kv8.activation_arena_bytes, l.activation_arena_bytes);
  EXPECT_EQ(kv8.weight_bytes, l.weight_bytes);
}

// fp8 weights: the layers' seven linear weights take one byte an element and a fp32 scale per output row; every
// other tensor keeps the activation dtype. The products' fp8 input is as wide as the widest of their inputs.
TEST(DeviceLayout, Fp8WeightsTakeOneByteAndAScalePerRow) {
  Model m = Llama3_8bShape();
  const ModelConfig& c = m.config;
  auto set = [](TensorDesc& t, int64_t rows, int64_t cols) {
    t.rows = rows;
    t.cols = cols;
  };
  set(m.tensors.embed, c.vocab_size, c.hidden_size);
  set(m.tensors.final_norm, 1, c.hidden_size);
  for (int i = 0; i < 2; ++i) {
    LayerTensors& L = m.tensors.layers.emplace_back();
    set(L.input_norm, 1, c.hidden_size);
    set(L.post_norm, 1, c.hidden_size);
    set(L.q_proj, 4096, 4096);
    set(L.k_proj, 1024, 4096);
    set(L.v_proj, 1024, 4096);
    set(L.o_proj, 4096, 4096);
    set(L.gate_proj, 14336, 4096);
    set(L.up_proj, 14336, 4096);
    set(L.down_proj, 4096, 14336);
  }
  const StepLimits limits{256, 8192, 16};
  const DeviceLayout bf16 = PlanDeviceLayout(m, limits, 2);
  const DeviceLayout fp8 = PlanDeviceLayout(m, limits, 2, /*fp8_weights=*/true);
  const int64_t linear_numel = 4096 * 4096 * 2 + 1024 * 4096 * 2 + 14336 * 4096 * 3;
  const int64_t linear_rows = 4096 + 1024 * 2 + 4096 + 14336 * 2 + 4096;
  const int64_t embed_and_norms = int64_t{c.vocab_size} * c.hidden_size + c.hidden_size + 2 * 2 * c.hidden_size;
  EXPECT_EQ(bf16.weight_bytes, (embed_and_norms + 2 * linear_numel) * 2);
  EXPECT_EQ(fp8.weight_bytes, bf16.weight_bytes - 2 * linear_numel + 2 * linear_rows * 4);
  EXPECT_FALSE(bf16.fp8_weights);
  EXPECT_TRUE(fp8.fp8_weights);
  EXPECT_EQ(bf16.activations.act_fp8.bytes, 0);
  EXPECT_EQ(fp8.activations.act_fp8.bytes, int64_t{8192} * 14336);
  EXPECT_EQ(fp8.activations.act_scale.bytes, int64_t{8192} * 4);
  EXPECT_EQ(fp8.activation_arena_bytes, bf16.activation_arena_bytes + 8192 * 14336 + 8192 * 4);
}

TEST(DeviceLayout, DecodeBucketsDoubleUpToTheLargestBatch) {
  const Model m = Llama3_8bShape();
  EXPECT_EQ(PlanDeviceLayout(m, StepLimits{256, 8192, 16}, 2).decode_buckets,
            (std::vector<int32_t>{1, 2, 4, 8, 16, 32, 64, 128, 256}));
  EXPECT_EQ(PlanDeviceLayout(m, StepLimits{24, 2048, 16}, 2).decode_buckets,
            (std::vector<int32_t>{1, 2, 4, 8, 16, 24}));
  EXPECT_EQ(PlanDeviceLayout(m, StepLimits{1, 2048, 16}, 2).decode_buckets, (std::vector<int32_t>{1}));
}

// At tensor_parallel_size > 1 each GPU holds the peer kernels' inboxes for the largest decode bucket's sum (two
// slots, one message from every rank) and NCCL's buffers, one share per peer; on one GPU, nothing.
TEST(DeviceLayout, CollectiveBuffersGrowWithTheRanksAndTheLargestDecodeBatch) {
  const Model m = Llama3_8bShape();
  const StepLimits limits{24, 2048, 16};
  EXPECT_EQ(PlanDeviceLayout(m, limits, 2).collective_bytes(), 0);
  const int64_t message = int64_t{24} * m.config.hidden_size * 2;
  for (int32_t tp : {2, 4}) {
    const DeviceLayout l = PlanDeviceLayout(m, limits, 2, false, 0, tp);
    EXPECT_EQ(l.peer_message_bytes, message);
    // Two inbox slots per rank, the counters (two calls, one join count per rank), NCCL's share per peer.
    EXPECT_EQ(l.collective_bytes(), 2 * tp * message + (2 + 8) * 4 + (tp - 1) * kernels::kNcclBytesPerPeer) << tp;
  }
}

TEST(DeviceLayout, ThePageTableIsCappedForVeryLongContexts) {
  Model m = Llama3_8bShape();
  m.config.max_position_embeddings = 1 << 20;  // 2^20 tokens x 256 sequences / 16 = 2^24 pages: capped at 2^22
  EXPECT_EQ(PlanDeviceLayout(m, StepLimits{256, 8192, 16}, 2).inputs.max_pages, int64_t{1} << 22);
  // Penalty entries are bounded by the vocabulary.
  EXPECT_EQ(PlanDeviceLayout(m, StepLimits{256, 8192, 16}, 2).inputs.max_penalties, int64_t{256} * 128256);
}

}  // namespace
}  // namespace inferd

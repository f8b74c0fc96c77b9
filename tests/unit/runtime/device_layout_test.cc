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

// Each region aligned to 256 bytes, inside [0, size), and overlapping none of the others.
void ExpectDisjoint(std::vector<std::pair<const char*, Region>> regions, int64_t size) {
  std::sort(regions.begin(), regions.end(), [](auto& a, auto& b) { return a.second.offset < b.second.offset; });
  int64_t end = 0;
  for (const auto& [name, r] : regions) {
    EXPECT_EQ(r.offset % 256, 0) << name;
    EXPECT_GE(r.offset, end) << name << " overlaps the region before it";
    EXPECT_LE(r.offset + r.bytes, size) << name << " ends past its arena";
    end = r.offset + r.bytes;
  }
}

TEST(DeviceLayout, RegionsHoldTheirShapesApartInsideTheirArenas) {
  const Model m = Llama3_8bShape();
  const int64_t T = 8192, R = 256, e = 2;
  const DeviceLayout l = PlanDeviceLayout(m, StepLimits{256, 8192, 16}, e);
  const ActivationRegions& a = l.activations;
  ExpectDisjoint({{"x", a.x},
                  {"xn", a.xn},
                  {"tmp", a.tmp},
                  {"qkv", a.qkv},
                  {"attn", a.attn},
                  {"gate_up", a.gate_up},
                  {"act", a.act},
                  {"last", a.last},
                  {"last_delta", a.last_delta},
                  {"last_n", a.last_n},
                  {"logits", a.logits},
                  {"inv_freq", a.inv_freq},
                  {"attn_float_ws", a.attn_float_ws},
                  {"attn_int_ws", a.attn_int_ws},
                  {"outputs", a.outputs},
                  {"penalty_raw", a.penalty_raw}},
                 l.activation_arena_bytes);
  // Shapes as the forward pass indexes them: 32 heads and 8 KV heads of 128 make a q/k/v row of 6144.
  EXPECT_EQ(a.qkv.bytes, T * 6144 * e);
  EXPECT_EQ(a.attn.bytes, T * 4096 * e);
  EXPECT_EQ(a.gate_up.bytes, T * 2 * 14336 * e);
  EXPECT_EQ(a.logits.bytes, R * 128256 * 4);
  EXPECT_EQ(a.inv_freq.bytes, 64 * 4);
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
  EXPECT_EQ(in.params.bytes, R * int64_t{sizeof(kernels::SamplingRowParams)});
  const OutputRegions& o = l.outputs;
  ExpectDisjoint(
      {{"tokens", o.tokens}, {"logprobs", o.logprobs}, {"top_ids", o.top_ids}, {"top_logprobs", o.top_logprobs}},
      l.output_arena_bytes);
  EXPECT_EQ(o.top_ids.bytes, R * kernels::kMaxTopLogprobs * 4);
  // K or V of one layer for a block of 16 tokens: 16 x 8 heads x 128 x 2 bytes; K and V of 32 layers.
  EXPECT_EQ(l.kv_block_bytes, 16 * 8 * 128 * 2);
  EXPECT_EQ(l.kv_bytes_per_block, 2 * 32 * l.kv_block_bytes);
  EXPECT_EQ(l.activation_bytes(), l.activation_arena_bytes + kGemmWorkspaceBytes);
  EXPECT_EQ(l.step_input_bytes(), l.input_arena_bytes + l.kv_bytes_per_block);
}

TEST(DeviceLayout, DecodeBucketsDoubleUpToTheLargestBatch) {
  const Model m = Llama3_8bShape();
  EXPECT_EQ(PlanDeviceLayout(m, StepLimits{256, 8192, 16}, 2).decode_buckets,
            (std::vector<int32_t>{1, 2, 4, 8, 16, 32, 64, 128, 256}));
  EXPECT_EQ(PlanDeviceLayout(m, StepLimits{24, 2048, 16}, 2).decode_buckets,
            (std::vector<int32_t>{1, 2, 4, 8, 16, 24}));
  EXPECT_EQ(PlanDeviceLayout(m, StepLimits{1, 2048, 16}, 2).decode_buckets, (std::vector<int32_t>{1}));
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

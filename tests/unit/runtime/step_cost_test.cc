// The bytes and FLOPs a step must move and compute, against counts made by hand and Llama-3-8B's published
// parameter count.
#include "engine/runtime/step_cost.h"

#include <gtest/gtest.h>

namespace inferd {
namespace {

ModelConfig Shape(int32_t vocab, int32_t hidden, int32_t intermediate, int32_t layers, int32_t heads, int32_t kv_heads,
                  int32_t head_dim) {
  ModelConfig c;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  return c;
}

ModelConfig Llama3_8B() {
  return Shape(128256, 4096, 14336, 32, 32, 8, 128);
}

// Meta-Llama-3-8B has 8,030,261,248 parameters: 2 x 525,336,576 in the embedding table and the LM head,
// 266,240 in the norms, the rest in the layers' products.
constexpr double kParams = 8030261248.0, kTable = 525336576.0, kNorms = 266240.0;
constexpr double kLinear = kParams - 2 * kTable - kNorms;

TEST(StepCost, Llama3_8BDecodeReadsEveryWeightButTheTableOnceAndTheContext) {
  MemoryPlan plan;
  plan.weight_bytes = static_cast<int64_t>(2 * kParams);  // bf16
  plan.kv_bytes_per_block = 16 * 32 * 2 * 8 * 128 * 2;    // 16 tokens x layers x K,V x heads x dim x bf16
  const StepCostModel model(Llama3_8B(), plan, 16);
  EXPECT_DOUBLE_EQ(model.element_bytes(), 2.0);
  const StepCost one = model.Of(/*tokens=*/1, /*sampled_rows=*/1, /*context_tokens=*/256, /*attended_keys=*/256);
  EXPECT_DOUBLE_EQ(one.bytes, 2 * (kParams - kTable) + 2 * 4096 + 256 * 131072.0);
  EXPECT_DOUBLE_EQ(one.flops, 2 * kLinear + 2 * kTable + 4.0 * 32 * 4096 * 256);
  // 64 sequences at 576 tokens each: the weights once, 64 contexts.
  const StepCost b64 = model.Of(64, 64, 64 * 576, 64 * 576);
  EXPECT_DOUBLE_EQ(b64.bytes, 2 * (kParams - kTable) + 64 * 2 * 4096 + 64 * 576 * 131072.0);
  // A 4096-token prompt sampled once: the LM head runs for one row, causal attention over n (n + 1) / 2 keys.
  const StepCost prefill = model.Of(4096, 1, 4096, 4096 * 4097 / 2);
  EXPECT_DOUBLE_EQ(prefill.flops, 2 * kLinear * 4096 + 2 * kTable + 4.0 * 32 * 4096 * (4096.0 * 4097 / 2));
  // A chunk that samples nothing does not read the LM head.
  EXPECT_DOUBLE_EQ(model.Of(512, 0, 512, 512 * 513 / 2).bytes,
                   2 * (kParams - 2 * kTable) + 512 * 2 * 4096 + 512 * 131072.0);
}

// Split over two devices: the plan's weight bytes are one device's (half), so a step reads half per device, and each
// device does half the FLOPs: both utilisations are against one device's ceilings.
TEST(StepCost, TensorParallelCountsOneDevicesShare) {
  MemoryPlan plan;
  plan.weight_bytes = static_cast<int64_t>(kParams);    // bf16, half of it on each of 2 devices
  plan.kv_bytes_per_block = 16 * 32 * 2 * 4 * 128 * 2;  // each device holds 4 of the 8 KV heads
  const StepCostModel model(Llama3_8B(), plan, 16, /*devices=*/2);
  const StepCost prefill = model.Of(4096, 1, 4096, 4096 * 4097 / 2);
  EXPECT_DOUBLE_EQ(prefill.flops, (2 * kLinear * 4096 + 2 * kTable + 4.0 * 32 * 4096 * (4096.0 * 4097 / 2)) / 2);
  const StepCost one = model.Of(1, 1, 256, 256);
  EXPECT_DOUBLE_EQ(one.bytes, (kParams - kTable) + 4096 + 256 * 65536.0);
}

TEST(StepCost, TiedTinyModelCountedByHand) {
  ModelConfig c = Shape(/*vocab=*/10, /*hidden=*/4, /*intermediate=*/8, /*layers=*/1, /*heads=*/2, /*kv_heads=*/1,
                        /*head_dim=*/2);
  c.tie_word_embeddings = true;
  // Products: q 4x4, k and v 4x2 each, o 4x4, gate/up/down 4x8 each = 144; norms 2x4 + 4 = 12; table 40.
  MemoryPlan plan;
  plan.weight_bytes = (144 + 12 + 40) * 4;           // fp32
  plan.kv_bytes_per_block = 16 * 1 * 2 * 1 * 2 * 4;  // 16 tokens x layer x K,V x kv head x dim x fp32
  const StepCostModel model(c, plan, 16);
  EXPECT_DOUBLE_EQ(model.element_bytes(), 4.0);
  // One decode token at context 3: all weights (the LM head is the table), its embedding row, 3 tokens of K/V.
  const StepCost cost = model.Of(1, 1, 3, 3);
  EXPECT_DOUBLE_EQ(cost.bytes, 4.0 * (144 + 12 + 40 + 4) + 16.0 * 3);
  EXPECT_DOUBLE_EQ(cost.flops, 2.0 * 144 + 2.0 * 40 + 4.0 * 1 * 4 * 3);
}

// A mixture of experts, counted by hand: every token multiplies the attention, the router and k experts of each
// sparse layer; a step reads the experts its tokens are expected to touch, E (1 − (1 − k/E)^tokens).
// Two layers, the first a mixture of 4 experts (2 a token), the second dense. Attention 48 a layer (q 16, k and v 8
// each, o 16); layer 1's MLP 96; layer 0's router 16 and 4 experts of 3 x 4 x 2 = 24; norms 2 x 2 x 4 + 4 = 20;
// table 40.
ModelConfig TinyMixture() {
  ModelConfig c = Shape(/*vocab=*/10, /*hidden=*/4, /*intermediate=*/8, /*layers=*/2, /*heads=*/2, /*kv_heads=*/1,
                        /*head_dim=*/2);
  c.tie_word_embeddings = true;
  c.num_experts = 4;
  c.experts_per_token = 2;
  c.moe_intermediate_size = 2;
  c.sparse_layers = {true, false};  // layer 1 keeps its dense MLP
  return c;
}

TEST(StepCost, AMixtureOfExpertsReadsTheExpertsItsTokensTouch) {
  const ModelConfig c = TinyMixture();
  const double attention = 2 * 48, dense = 96, router = 16, expert = 24;
  MemoryPlan plan;
  plan.weight_bytes = static_cast<int64_t>((attention + dense + router + 4 * expert + 20 + 40) * 4);  // fp32
  plan.kv_bytes_per_block = 16 * 2 * 2 * 1 * 2 * 4;
  const StepCostModel model(c, plan, 16);
  EXPECT_DOUBLE_EQ(model.element_bytes(), 4.0);
  const StepCost one = model.Of(1, 1, 3, 3);  // one token touches its 2 experts
  EXPECT_DOUBLE_EQ(one.bytes, 4.0 * (attention + dense + router + 2 * expert + 20 + 40 + 4) + 32.0 * 3);
  EXPECT_DOUBLE_EQ(one.flops, 2.0 * (attention + dense + router + 2 * expert) + 2.0 * 40 + 4.0 * 2 * 4 * 3);
  const StepCost many = model.Of(64, 0, 64, 64);  // 64 tokens: nearly every expert
  EXPECT_NEAR(many.bytes, 4.0 * (attention + dense + router + 4 * expert + 20 + 64 * 4) + 32.0 * 64, 1e-6);
}

// The backend's count of the experts a step touched (StepOutput::experts_touched) replaces the expectation: 64
// tokens that all went to the same 2 experts read 2 of them, not nearly all 4; the FLOPs are the same either way.
TEST(StepCost, AMixtureOfExpertsCountedByTheBackendReadsTheExpertsCounted) {
  const ModelConfig c = TinyMixture();
  const double attention = 2 * 48, dense = 96, router = 16, expert = 24;
  MemoryPlan plan;
  plan.weight_bytes = static_cast<int64_t>((attention + dense + router + 4 * expert + 20 + 40) * 4);
  plan.kv_bytes_per_block = 16 * 2 * 2 * 1 * 2 * 4;
  const StepCostModel model(c, plan, 16);
  StepInput in;
  in.token_ids.assign(64, 1);
  in.query_start = {0, 64};
  in.context_lens = {64};
  in.logits_indices = {63};
  const double fixed = 4.0 * (attention + dense + router + 20 + 40 + 64 * 4);
  const StepCost two = model.Of(in, /*experts_touched=*/2);
  EXPECT_NEAR(two.bytes - model.Of(in, 3).bytes, -4.0 * expert, 1e-6);
  EXPECT_NEAR(two.bytes, fixed + 4.0 * 2 * expert + 32.0 * 64, 1e-6);
  const StepCost expected = model.Of(in);  // not counted: 4 (1 − 0.5^64), every expert
  EXPECT_NEAR(expected.bytes, fixed + 4.0 * 4 * expert + 32.0 * 64, 1e-6);
  EXPECT_DOUBLE_EQ(two.flops, expected.flops);
}

// fp8 products (cuda, engine.quantization fp8): the products and experts one byte a weight plus a 4-byte scale a
// row, the routers, norms and table in 2 bytes; a step counts each part at its own size.
TEST(StepCost, Fp8ProductsAreCountedAtTheirOwnSizeBesideTheWideTensors) {
  const ModelConfig c = TinyMixture();
  // Output rows: attention 4 + 2 + 2 + 4 = 12 a layer, the MLP 8 + 8 + 4, an expert 2 + 2 + 4.
  const double attention = 2 * 48, dense = 96, router = 16, expert = 24;
  const double products = attention + dense + 4 * expert, rows = 2 * 12 + 20 + 4 * 8;
  MemoryPlan plan;
  plan.weight_bytes = static_cast<int64_t>(products + 4 * rows + 2 * (router + 20 + 40));
  plan.fp8_weights = true;
  plan.kv_bytes_per_block = 16 * 2 * 2 * 1 * 2 * 2;
  const StepCostModel model(c, plan, 16);
  const double product_bytes = (products + 4 * rows) / products;  // a byte a weight and the scales spread over them
  const StepCost one = model.Of(1, 1, 3, 3);
  EXPECT_DOUBLE_EQ(one.bytes,
                   product_bytes * (attention + dense + 2 * expert) + 2.0 * (router + 20 + 40 + 4) + 16.0 * 3);
  // Without the flag the same bytes are spread evenly over every weight, as for a model of one dtype.
  plan.fp8_weights = false;
  const double average = plan.weight_bytes / (products + router + 20 + 40);
  EXPECT_DOUBLE_EQ(StepCostModel(c, plan, 16).Of(1, 1, 3, 3).bytes,
                   average * (attention + dense + router + 2 * expert + 20 + 40 + 4) + 16.0 * 3);
}

TEST(StepCost, StepInputSumsContextsAndCausalKeys) {
  ModelConfig c = Llama3_8B();
  MemoryPlan plan;
  plan.weight_bytes = static_cast<int64_t>(2 * kParams);
  plan.kv_bytes_per_block = 16 * 131072;
  const StepCostModel model(c, plan, 16);
  // Sequence A: a 3-token prompt chunk at positions 7..9 (context 10 after it); B: one decode token at context 5.
  StepInput in;
  in.token_ids = {1, 2, 3, 4};
  in.query_start = {0, 3, 4};
  in.context_lens = {10, 5};
  in.logits_indices = {2, 3};
  const StepCost got = model.Of(in);
  const StepCost want = model.Of(4, 2, 15, (8 + 9 + 10) + 5);
  EXPECT_DOUBLE_EQ(got.bytes, want.bytes);
  EXPECT_DOUBLE_EQ(got.flops, want.flops);
}

// Sliding-window layers read and attend to at most their window: with 3 of 4 layers windowed at 4 tokens, a
// sequence at context 10 reads (10 + 3 × 4) / 4 tokens of K/V per layer on average, and its 3 newest tokens
// (contexts 8, 9, 10) attend to (8 + 9 + 10 + 3 × (4 + 4 + 4)) / 4 keys per layer.
TEST(StepCost, SlidingWindowLayersReadTheirWindowAlone) {
  ModelConfig c = Llama3_8B();
  c.num_layers = 4;
  c.layer_window = {4, 4, 4, 0};
  ModelConfig global = c;
  global.layer_window.clear();
  MemoryPlan plan;
  plan.weight_bytes = 1 << 30;
  plan.kv_bytes_per_block = 16 * 4096;
  const StepCostModel windowed(c, plan, 16), full(global, plan, 16);
  StepInput in;
  in.token_ids = {1, 2, 3};
  in.query_start = {0, 3};
  in.context_lens = {10};
  in.logits_indices = {2};
  const StepCost got = windowed.Of(in);
  EXPECT_DOUBLE_EQ(got.bytes - full.Of(3, 1, 0, 0).bytes, 4096.0 * (10 + 3 * 4) / 4);
  EXPECT_DOUBLE_EQ(got.flops - full.Of(3, 1, 0, 0).flops, 4.0 * 4 * 4096 * (8 + 9 + 10 + 3 * 12) / 4);
  // Alike sequences count the same way; without windows as the totals do.
  EXPECT_DOUBLE_EQ(windowed.OfUniform(1, 3, 10, 1).bytes, got.bytes);
  EXPECT_DOUBLE_EQ(full.OfUniform(2, 3, 10, 2).flops, full.Of(6, 2, 20, 2 * (8 + 9 + 10)).flops);
  // A window longer than the context reads all of it.
  EXPECT_DOUBLE_EQ(windowed.OfUniform(1, 3, 3, 1).bytes, full.OfUniform(1, 3, 3, 1).bytes);
}

}  // namespace
}  // namespace inferd

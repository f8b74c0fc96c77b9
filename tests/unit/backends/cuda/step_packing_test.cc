// The cuda backend's step packing, on the host: what lands in the input arena for the device sampler and the
// attention kernels (penalty entries, bans before min_tokens, seeds, logprob rows, structured output's masks and
// the word the sampler waits on for masks that come after the launch), at the layout's offsets.
#include "engine/backends/cuda/step_packing.h"

#include <gtest/gtest.h>

#include <vector>

#include "engine/runtime/step_input.h"
#include "kernels/sizes.h"

namespace inferd {
namespace {

Model TinyModel() {
  Model m;
  m.config.vocab_size = 100;
  m.config.hidden_size = 64;
  m.config.intermediate_size = 128;
  m.config.num_layers = 2;
  m.config.num_heads = 4;
  m.config.num_kv_heads = 2;
  m.config.head_dim = 16;
  m.config.max_position_embeddings = 64;
  m.eos_token_ids = {2};
  return m;
}

template <typename T>
const T* At(const std::vector<char>& arena, const Region& r) {
  return reinterpret_cast<const T*>(arena.data() + r.offset);
}

TEST(StepPacking, PenaltiesBansSeedsAndLogprobRowsLandWhereTheKernelsReadThem) {
  const Model model = TinyModel();
  const DeviceLayout layout = PlanDeviceLayout(model, StepLimits{4, 32, 4}, 2);
  std::vector<char> arena(layout.input_arena_bytes, '\x7f');
  // Sequence 0: a 6-token prompt computed in full; sequence 1: one decode token at position 9.
  const std::vector<int32_t> prompt = {5, 7, 5, 9, 300, 7}, pages0 = {3, 1};
  const std::vector<int32_t> history = {11, 12, 11, 13, 11, 12, 12, 40, 40, 41}, pages1 = {0, 2, 6};
  StepInput in = EmptyStepInput(4);
  AddSequence(&in, prompt, 0, 6, pages0, true);
  AddSequence(&in, history, 9, 10, pages1, true);
  const std::vector<int32_t> banned = {2, 41, -1};
  // Row 0: repetition penalty over the prompt (300 is past the vocabulary), a seed's uniform, 50 alternatives asked.
  SamplingRow r0;
  r0.params.temperature = 0.7f;
  r0.params.repetition_penalty = 1.3f;
  r0.uniform = 0.25;
  r0.tokens = prompt;
  r0.num_prompt_tokens = 6;
  r0.top_logprobs = 50;
  // Row 1: frequency and presence penalties count the output only (from index 7); eos and 41 banned (min_tokens).
  SamplingRow r1;
  r1.params.temperature = 0;
  r1.params.frequency_penalty = 0.5f;
  r1.params.presence_penalty = 0.25f;
  r1.uniform = 0.75;
  r1.tokens = history;
  r1.num_prompt_tokens = 7;
  r1.banned = banned;
  r1.params.logit_bias = {{40, 1.5f}, {50, -2.f}};  // 40 is also in the output; 50 only biased
  in.sampling = {r0, r1};

  const cuda::PackedStep packed =
      cuda::PackStepInputs(in, layout.inputs, model.config.vocab_size, /*no_block=*/99, arena.data());
  const InputRegions& ir = layout.inputs;
  EXPECT_EQ(packed.head_bytes, ir.kv_indices.offset + 5 * 4) << "the head copy ends after the step's 5 pages";
  EXPECT_EQ(std::vector<int32_t>(At<int32_t>(arena, ir.token_ids), At<int32_t>(arena, ir.token_ids) + 7),
            (std::vector<int32_t>{5, 7, 5, 9, 300, 7, 41}));
  EXPECT_EQ(At<int32_t>(arena, ir.positions)[6], 9);
  EXPECT_EQ(At<int32_t>(arena, ir.slots)[5], 1 * 4 + 1) << "position 5 of sequence 0: page 1 is block 1";
  EXPECT_EQ(At<int32_t>(arena, ir.slots)[6], 6 * 4 + 1) << "position 9 of sequence 1: page 2 is block 6";
  EXPECT_EQ(At<int32_t>(arena, ir.logits_indices)[0], 5);
  EXPECT_EQ(At<int32_t>(arena, ir.logits_indices)[1], 6);
  EXPECT_EQ(At<int32_t>(arena, ir.kv_indices)[4], 6);
  EXPECT_EQ(At<int32_t>(arena, ir.kv_last_page_len)[0], 2);
  EXPECT_EQ(At<int32_t>(arena, ir.kv_last_page_len)[1], 2);

  const auto* params = At<kernels::SamplingRowParams>(arena, ir.params);
  EXPECT_FLOAT_EQ(params[0].temperature, 0.7f);
  EXPECT_FLOAT_EQ(params[0].repetition_penalty, 1.3f);
  EXPECT_EQ(params[0].top_logprobs, kernels::kMaxTopLogprobs) << "alternatives are capped";
  EXPECT_DOUBLE_EQ(params[0].uniform, 0.25);
  EXPECT_FLOAT_EQ(params[1].frequency_penalty, 0.5f);
  EXPECT_EQ(params[1].top_logprobs, 0);
  EXPECT_DOUBLE_EQ(params[1].uniform, 0.75);

  // Row 0: distinct prompt ids 5, 7, 9 seen (counts from the output: none); 300 dropped.
  // Row 1: output ids 40 (twice, biased) and 41 seen, 41 also banned, eos 2 banned, 50 biased; -1 dropped.
  const int32_t* indptr = At<int32_t>(arena, ir.penalty_indptr);
  EXPECT_EQ(indptr[0], 0);
  EXPECT_EQ(indptr[1], 3);
  EXPECT_EQ(indptr[2], 7);
  EXPECT_EQ(packed.penalty_entries, 7);
  const int32_t* ids = At<int32_t>(arena, ir.penalty_tokens);
  const int32_t* counts = At<int32_t>(arena, ir.penalty_counts);
  const float* bias = At<float>(arena, ir.penalty_bias);
  const uint8_t* flags = At<uint8_t>(arena, ir.penalty_flags);
  EXPECT_EQ(std::vector<int32_t>(ids, ids + 7), (std::vector<int32_t>{5, 7, 9, 2, 40, 41, 50}));
  EXPECT_EQ(std::vector<int32_t>(counts, counts + 7), (std::vector<int32_t>{0, 0, 0, 0, 2, 1, 0}));
  EXPECT_EQ(std::vector<float>(bias, bias + 7), (std::vector<float>{0, 0, 0, 0, 1.5f, 0, -2.f}));
  EXPECT_EQ(flags[0], kernels::kPenaltySeen);
  // Without a repetition penalty only bans and biases are flags; frequency and presence read the counts.
  EXPECT_EQ(flags[3], kernels::kPenaltyBanned);
  EXPECT_EQ(flags[4], kernels::kPenaltyBias);
  EXPECT_EQ(flags[5], kernels::kPenaltyBanned);
  EXPECT_EQ(flags[6], kernels::kPenaltyBias);
}

// A model with sliding windows: each KV group's slots and page-table row at their stride, its pages one group after
// the other, a page the window group let go pointing at the backend's own block.
TEST(StepPacking, KvGroupsEachGetSlotsAnIndptrRowAndTheirPages) {
  Model model = TinyModel();
  model.config.num_layers = 3;
  model.config.layer_window = {8, 0, 8};  // one global layer, two of window 8: 3 groups of one layer
  const DeviceLayout layout = PlanDeviceLayout(model, StepLimits{4, 32, 4}, 2);
  ASSERT_EQ(layout.kv_groups.num_groups(), 3);
  ASSERT_EQ(layout.kv_groups.slots, 1);
  EXPECT_EQ(layout.kv_bytes_per_block, 2 * layout.kv_block_bytes) << "a block holds one layer's K and V";
  std::vector<char> arena(layout.input_arena_bytes, '\x7f');
  const std::vector<int32_t> tokens(13, 1);
  StepInput in = EmptyStepInput(4, 3);
  AddSequence(&in, tokens, 12, 13,
              std::vector<std::vector<int32_t>>{{0, 1, 2, 3}, {kNoBlock, 5, 6, 7}, {kNoBlock, 9, 10, 11}}, true);
  AddSequence(&in, tokens, 0, 2, std::vector<std::vector<int32_t>>{{20}, {21}, {22}}, true);
  in.sampling.resize(2);
  const cuda::PackedStep packed = cuda::PackStepInputs(in, layout.inputs, model.config.vocab_size, 99, arena.data());
  const InputRegions& ir = layout.inputs;
  EXPECT_EQ(packed.head_bytes, ir.kv_indices.offset + 3 * 5 * 4) << "three groups of 5 pages";
  const int32_t* slots = At<int32_t>(arena, ir.slots);
  EXPECT_EQ(std::vector<int32_t>(slots, slots + 3), (std::vector<int32_t>{3 * 4, 20 * 4, 20 * 4 + 1}));
  EXPECT_EQ(slots[32], 7 * 4) << "group 1's slots, a row of max_num_batched_tokens on";
  EXPECT_EQ(slots[64 + 2], 22 * 4 + 1);
  const int32_t* indptr = At<int32_t>(arena, ir.kv_indptr);
  EXPECT_EQ(std::vector<int32_t>(indptr, indptr + 3), (std::vector<int32_t>{0, 4, 5}));
  EXPECT_EQ(std::vector<int32_t>(indptr + 5, indptr + 8), (std::vector<int32_t>{5, 9, 10})) << "row 1: 5 pages on";
  EXPECT_EQ(std::vector<int32_t>(indptr + 10, indptr + 13), (std::vector<int32_t>{10, 14, 15}));
  const int32_t* pages = At<int32_t>(arena, ir.kv_indices);
  EXPECT_EQ(std::vector<int32_t>(pages, pages + 15),
            (std::vector<int32_t>{0, 1, 2, 3, 20, 99, 5, 6, 7, 21, 99, 9, 10, 11, 22}));
}

TEST(StepPacking, RowsWithoutPenaltiesOrBansAddNoEntries) {
  const Model model = TinyModel();
  const DeviceLayout layout = PlanDeviceLayout(model, StepLimits{4, 32, 4}, 2);
  std::vector<char> arena(layout.input_arena_bytes);
  const std::vector<int32_t> tokens = {1, 2, 3}, pages = {0};
  StepInput in = EmptyStepInput(4);
  AddSequence(&in, tokens, 0, 3, pages, true);
  SamplingRow row;
  row.tokens = tokens;
  row.num_prompt_tokens = 3;
  in.sampling = {row};
  const cuda::PackedStep packed =
      cuda::PackStepInputs(in, layout.inputs, model.config.vocab_size, /*no_block=*/99, arena.data());
  EXPECT_EQ(packed.penalty_entries, 0);
  EXPECT_EQ(At<int32_t>(arena, layout.inputs.penalty_indptr)[1], 0);
}

// A mask known at launch goes up with the inputs and the ready word says so; rows whose masks come later
// (SupplyMasks) are marked masked, nothing of theirs is copied, and the ready word is 0 until the masks arrive.
TEST(StepPacking, MasksNowAreReadyAndMasksLaterAreWaitedFor) {
  const Model model = TinyModel();
  const DeviceLayout layout = PlanDeviceLayout(model, StepLimits{4, 32, 4}, 2);
  const std::vector<int32_t> tokens = {1, 2, 3}, pages = {0}, pages1 = {1};
  const std::vector<uint32_t> mask(layout.inputs.mask_words, 0x5u);
  for (bool later : {false, true}) {
    std::vector<char> arena(layout.input_arena_bytes, '\x7f');
    StepInput in = EmptyStepInput(4);
    AddSequence(&in, tokens, 0, 3, pages, true);
    AddSequence(&in, tokens, 0, 3, pages1, true);
    in.sampling.resize(2);
    in.sampling[0].tokens = in.sampling[1].tokens = tokens;
    if (later) {
      in.sampling[1].allowed_later = true;
    } else {
      in.sampling[1].allowed = mask;
    }
    const cuda::PackedStep packed =
        cuda::PackStepInputs(in, layout.inputs, model.config.vocab_size, /*no_block=*/99, arena.data());
    const auto* params = At<kernels::SamplingRowParams>(arena, layout.inputs.params);
    EXPECT_EQ(params[0].masked, 0) << later;
    EXPECT_EQ(params[1].masked, 1) << later;
    EXPECT_EQ(*At<uint32_t>(arena, layout.inputs.masks_ready), later ? 0u : 1u);
    EXPECT_EQ(packed.masked_rows, later ? 0 : 2) << "rows [0, masked_rows) are copied at launch";
    EXPECT_LE(layout.inputs.masks_ready.offset + 4, packed.head_bytes) << "the ready word goes up with every step";
    if (!later) {
      EXPECT_EQ(At<uint32_t>(arena, layout.inputs.allowed)[layout.inputs.mask_words], 0x5u);
    }
  }
}

}  // namespace
}  // namespace inferd

// Constrained requests (structured output) through the engine's step loop with a fake backend that samples only
// what each row's mask allows, with each step planned after the last one's tokens are in and with steps planned
// ahead (engine.plan_ahead). Planned ahead, a constrained row's mask follows from a token the device has not
// handed back yet: the step launches without it and the engine supplies it once the step before is collected
// (Backend::SupplyMasks). The answers must satisfy their constraints and be the same either way.
#include <gtest/gtest.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <regex>

#include "engine/engine.h"
#include "tests/unit/collecting_sink.h"
#include "tests/unit/fixtures.h"
#include "tests/unit/host_only_backend.h"

namespace inferd {
namespace {

using testing::CollectingSink;

// Samples, in a row with a mask, one of the allowed tokens picked by its position and the request's seed (the
// end-of-text token once it is allowed and the row is past its sixth output token); elsewhere token 100.
class MaskFollowingBackend : public testing::HostOnlyBackend {
 public:
  struct Control {
    std::atomic<int> masks_later_steps{0};  // steps launched whose masks came with SupplyMasks
    std::atomic<int> unmasked_rows{0};      // rows of constrained requests sampled without a mask
  };
  MaskFollowingBackend(Control* c, int32_t eos) : HostOnlyBackend("fake"), c_(c), eos_(eos) {}
  absl::Status SupplyMasks(std::span<const std::span<const uint32_t>> masks) override {
    c_->masks_later_steps++;
    return Backend::SupplyMasks(masks);
  }
  absl::Status Step(const StepInput& in, StepOutput* out) override {
    out->tokens.clear();
    out->logprobs.assign(in.num_logits(), {});
    for (const SamplingRow& row : in.sampling) {
      if (row.allowed.empty()) {
        c_->unmasked_rows += row.params.seed.has_value();  // every constrained request here has a seed
        out->tokens.push_back(100);
        continue;
      }
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < static_cast<int32_t>(row.allowed.size()) * 32; ++t) {
        if (row.allowed[t / 32] >> (t % 32) & 1u) allowed.push_back(t);
      }
      const bool may_end = std::find(allowed.begin(), allowed.end(), eos_) != allowed.end();
      const int32_t outputs = row.position - row.num_prompt_tokens;
      if (allowed.empty()) {
        out->tokens.push_back(0);
      } else if (may_end && outputs > 6) {
        out->tokens.push_back(eos_);
      } else {
        // Leave the end for later where there is anything else.
        if (may_end && allowed.size() > 1) std::erase(allowed, eos_);
        const uint64_t pick = (static_cast<uint64_t>(row.position) * 2654435761u + *row.params.seed) >> 7;
        out->tokens.push_back(allowed[pick % allowed.size()]);
      }
    }
    return absl::OkStatus();
  }

 private:
  Control* c_;
  int32_t eos_;
};

// The parameter is engine.plan_ahead.
class ConstrainedRequests : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    tokenizer_ = *Tokenizer::FromFile(testing::SourcePath("tests/fixtures/models/qwen2-tiny/tokenizer.json"));
    eos_ = *tokenizer_->TokenToId("<|endoftext|>");
    Config config;
    config.model.path = testing::ModelDir("qwen2-tiny");
    config.engine.num_blocks = 256;
    config.engine.block_size = 4;
    config.scheduler.max_num_seqs = 16;
    config.engine.plan_ahead = GetParam();
    auto e = Engine::Create(config, [this](const Config&, const Model&) -> absl::StatusOr<std::unique_ptr<Backend>> {
      return std::make_unique<MaskFollowingBackend>(&control_, eos_);
    });
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
  }

  std::shared_ptr<CollectingSink> Submit(const std::string& id, const OutputConstraint& c, uint64_t seed) {
    auto compiled = engine_->constraint_compiler().Compile(c);
    EXPECT_TRUE(compiled.ok()) << compiled.status();
    Request r;
    r.id = id;
    r.prompt = {1, 2, 3, 4, 5, 6};
    r.sampling.seed = seed;
    r.stopping.max_tokens = 200;
    r.constraint = *compiled;
    auto sink = std::make_shared<CollectingSink>();
    r.sink = sink;
    EXPECT_TRUE(engine_->Submit(std::move(r)).ok());
    return sink;
  }

  std::string Text(const CollectingSink& sink) const {
    return tokenizer_->Decode(sink.tokens, /*skip_special_tokens=*/true);  // the stop token it ended with
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  int32_t eos_ = 0;
  MaskFollowingBackend::Control control_;
  std::unique_ptr<Engine> engine_;
};

TEST_P(ConstrainedRequests, EveryAnswerSatisfiesItsConstraintAloneAndInACrowd) {
  const OutputConstraint regex{OutputConstraint::Kind::kRegex, "[a-f]{3}-[0-9]{2,4}", {}, "structured_outputs.regex"};
  const OutputConstraint schema{OutputConstraint::Kind::kJsonSchema,
                                R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                    "maximum": 999}, "tag": {"enum": ["x", "yy"]}}, "required": ["n", "tag"],
                                    "additionalProperties": false})",
                                {},
                                "response_format.json_schema.schema"};
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (int i = 0; i < 12; ++i) sinks.push_back(Submit("r" + std::to_string(i), i % 2 ? schema : regex, 7 + i));
  for (int i = 0; i < 12; ++i) {
    CollectingSink& sink = *sinks[i];
    ASSERT_TRUE(sink.WaitFor(absl::Seconds(30))) << i;
    ASSERT_TRUE(sink.error.ok()) << i << ": " << sink.error;
    EXPECT_EQ(sink.finish, FinishReason::kEos) << i;
    const std::string text = Text(sink);
    if (i % 2) {
      const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      ASSERT_TRUE(j.is_object()) << i << ": " << text;
      EXPECT_TRUE(j["n"].is_number_integer() && j["n"] >= 0 && j["n"] <= 999) << text;
      EXPECT_TRUE(j["tag"] == "x" || j["tag"] == "yy") << text;
      EXPECT_EQ(j.size(), 2u) << text;
    } else {
      EXPECT_TRUE(std::regex_match(text, std::regex("[a-f]{3}-[0-9]{2,4}"))) << i << ": " << text;
    }
  }
  EXPECT_EQ(control_.unmasked_rows, 0);
  EXPECT_EQ(engine_->Stats().free_blocks, 256);
  if (GetParam() == "on") {
    EXPECT_GT(control_.masks_later_steps, 0) << "planned ahead, constrained steps take their masks after launch";
  } else {
    EXPECT_EQ(control_.masks_later_steps, 0);
  }
}

// The same requests give the same answers whether their steps are planned ahead or not, and whether they draft
// their next tokens and check them in one step (speculative decoding: a drafted row's mask is the constraint's
// after the drafts before it; a draft the constraint refuses is cut).
TEST(ConstrainedRequestsAhead, AnswersEqualThoseOfStepsPlannedAfterTheTokensWithAndWithoutDrafts) {
  struct Mode {
    const char* plan_ahead;
    const char* speculative;
  };
  const Mode modes[] = {{"off", "off"}, {"on", "off"}, {"off", "ngram"}, {"on", "suffix"}};
  std::vector<std::vector<int32_t>> answers[std::size(modes)];
  for (size_t m = 0; m < std::size(modes); ++m) {
    auto tokenizer = *Tokenizer::FromFile(testing::SourcePath("tests/fixtures/models/qwen2-tiny/tokenizer.json"));
    const int32_t eos = *tokenizer->TokenToId("<|endoftext|>");
    MaskFollowingBackend::Control control;
    Config config;
    config.model.path = testing::ModelDir("qwen2-tiny");
    config.engine.num_blocks = 256;
    config.engine.block_size = 4;
    config.engine.plan_ahead = modes[m].plan_ahead;
    config.speculative.method = modes[m].speculative;
    config.speculative.ngram_min = 1;
    config.speculative.adaptive = false;
    auto engine = Engine::Create(config, [&](const Config&, const Model&) -> absl::StatusOr<std::unique_ptr<Backend>> {
      return std::make_unique<MaskFollowingBackend>(&control, eos);
    });
    ASSERT_TRUE(engine.ok()) << engine.status();
    const OutputConstraint choice{OutputConstraint::Kind::kChoice,
                                  "",
                                  {"alpha beta", "gamma", "delta epsilon zeta"},
                                  "structured_outputs.choice"};
    // Text that repeats itself (drafts find it earlier) with a choice at each turn (drafts are rejected there).
    const OutputConstraint loop{OutputConstraint::Kind::kRegex, "(ab-cd-(ef|gh)-){5}", {}, "structured_outputs.regex"};
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (int i = 0; i < 6; ++i) {
      auto compiled = (*engine)->constraint_compiler().Compile(i % 2 ? loop : choice);
      ASSERT_TRUE(compiled.ok()) << compiled.status();
      Request r;
      r.id = "c" + std::to_string(i);
      r.prompt = {1, 2, 3, 4, 5, 6, 7};
      r.sampling.seed = 100 + i;
      r.stopping.max_tokens = 50;
      r.constraint = *compiled;
      sinks.push_back(std::make_shared<CollectingSink>());
      r.sink = sinks.back();
      ASSERT_TRUE((*engine)->Submit(std::move(r)).ok());
    }
    for (auto& sink : sinks) {
      sink->Wait();
      ASSERT_TRUE(sink->error.ok()) << sink->error;
      answers[m].push_back(sink->tokens);
    }
    const EngineStats stats = (*engine)->Stats();
    if (std::string(modes[m].speculative) != "off") {
      EXPECT_GT(stats.spec_accepted_tokens, 0) << modes[m].speculative;
      EXPECT_LE(stats.spec_accepted_tokens, stats.spec_draft_tokens) << modes[m].speculative;
    }
    EXPECT_EQ(control.unmasked_rows, 0);
    EXPECT_EQ(stats.free_blocks, stats.total_blocks);
  }
  for (size_t m = 1; m < std::size(modes); ++m) {
    EXPECT_EQ(answers[0], answers[m]) << modes[m].plan_ahead << " " << modes[m].speculative;
  }
}

INSTANTIATE_TEST_SUITE_P(PlanAhead, ConstrainedRequests, ::testing::Values("off", "on"));

}  // namespace
}  // namespace inferd

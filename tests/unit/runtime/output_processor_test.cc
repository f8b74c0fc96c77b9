#include "engine/runtime/output_processor.h"

#include <gtest/gtest.h>

#include "engine/tokenizer/utf8.h"
#include "tests/unit/fixtures.h"

namespace inferd {
namespace {

class OutputProcessorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = Tokenizer::FromFile(testing::ModelDir("llama3-tiny") + "/tokenizer.json");
    ASSERT_TRUE(t.ok());
    tok_ = std::move(*t);
  }
  // Feeds the tokens of text one by one; returns the released text and the finish reason.
  std::pair<std::string, FinishReason> Run(const std::string& text, Request& r) {
    const std::vector<int32_t> eos = {999999};
    OutputProcessor p(tok_.get(), &r, eos);
    std::string out;
    FinishReason f = FinishReason::kNone;
    int n = 0;
    for (int32_t id : tok_->Encode(text, false)) {
      out += p.Add(id, ++n, &f);
      if (f != FinishReason::kNone) return {out, f};
    }
    return {out + p.Flush(), f};
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(OutputProcessorTest, ReleasesWholeCharactersOnly) {
  Request r;
  r.stopping.max_tokens = 1000;
  const std::string text = "emoji 😀 and 日本語";
  const std::vector<int32_t> eos = {999999};
  OutputProcessor p(tok_.get(), &r, eos);
  std::string out;
  FinishReason f;
  int n = 0;
  for (int32_t id : tok_->Encode(text, false)) {
    const std::string piece = p.Add(id, ++n, &f);
    EXPECT_TRUE(IsValidUtf8(piece)) << "piece of token " << id;
    out += piece;
  }
  EXPECT_EQ(out + p.Flush(), text);
}

TEST_F(OutputProcessorTest, StopStringIsNeverHalfEmitted) {
  Request r;
  r.stopping.max_tokens = 1000;
  r.stopping.stop = {"cache of"};
  auto [out, f] = Run("the model serves a paged cache of blocks", r);
  EXPECT_EQ(f, FinishReason::kStopString);
  EXPECT_EQ(out, "the model serves a paged ");
  r.stopping.include_stop_str_in_output = true;
  auto [with, f2] = Run("the model serves a paged cache of blocks", r);
  EXPECT_EQ(with, "the model serves a paged cache of");
}

TEST_F(OutputProcessorTest, HeldPrefixIsReleasedWhenTheStopStringDoesNotFollow) {
  Request r;
  r.stopping.max_tokens = 1000;
  r.stopping.stop = {"cache hit"};
  auto [out, f] = Run("a cache of blocks", r);
  EXPECT_EQ(f, FinishReason::kNone);
  EXPECT_EQ(out, "a cache of blocks");
}

TEST_F(OutputProcessorTest, MaxTokensAndMinTokens) {
  Request r;
  r.stopping.max_tokens = 2;
  auto [out, f] = Run("hello world it is", r);
  EXPECT_EQ(f, FinishReason::kLength);
  const std::vector<int32_t> ids = tok_->Encode("hello world it is", false);
  ASSERT_GT(ids.size(), 2u);
  EXPECT_EQ(out, tok_->Decode(std::vector<int32_t>(ids.begin(), ids.begin() + 2), true));
  Request m;
  m.stopping.max_tokens = 100;
  m.stopping.min_tokens = 3;
  m.stopping.stop = {"hello"};
  auto [out2, f2] = Run("hello hello hello hello", m);
  EXPECT_EQ(f2, FinishReason::kStopString) << "the stop string counts once min_tokens are out";
  EXPECT_NE(out2.find("hello"), std::string::npos);
}

}  // namespace
}  // namespace inferd

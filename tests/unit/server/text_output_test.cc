#include "server/text_output.h"

#include <gtest/gtest.h>

#include "engine/tokenizer/utf8.h"
#include "tests/unit/fixtures.h"

namespace inferd {
namespace {

class TextOutputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = Tokenizer::FromFile(testing::ModelDir("llama3-tiny") + "/tokenizer.json");
    ASSERT_TRUE(t.ok());
    tok_ = std::move(*t);
  }
  // The engine's output carrying the num_output-th generated token, as the engine sends it.
  static RequestOutput Output(int32_t token, int32_t num_output, FinishReason finish = FinishReason::kNone) {
    RequestOutput out;
    out.token_ids = {token};
    out.usage.completion_tokens = num_output;
    out.finish = finish;
    return out;
  }
  struct Result {
    std::string text;
    FinishReason finish = FinishReason::kNone;
    std::vector<int32_t> tokens;  // the client's
    int32_t completion_tokens = 0;
  };
  // Sends the tokens of `text` one output each, the engine ending the request at max_tokens (if any).
  Result Run(const std::string& text, TextOptions options, int32_t max_tokens = 1000) {
    TextOutput t(tok_.get(), std::move(options));
    Result r;
    const std::vector<int32_t> ids = tok_->Encode(text, false);
    for (int32_t i = 0; i < static_cast<int32_t>(ids.size()); ++i) {
      const bool last = i + 1 == max_tokens || i + 1 == static_cast<int32_t>(ids.size());
      RequestOutput out = Output(ids[i], i + 1, last ? FinishReason::kLength : FinishReason::kNone);
      r.text += t.Take(&out);
      r.tokens.insert(r.tokens.end(), out.token_ids.begin(), out.token_ids.end());
      r.completion_tokens = out.usage.completion_tokens;
      if (out.finish != FinishReason::kNone || t.stopped_at()) {
        r.finish = t.stopped_at() ? FinishReason::kStopString : out.finish;
        break;
      }
    }
    return r;
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(TextOutputTest, ReleasesWholeCharactersOnly) {
  const std::string text = "emoji 😀 and 日本語";
  TextOutput t(tok_.get(), {});
  const std::vector<int32_t> ids = tok_->Encode(text, false);
  ASSERT_GT(ids.size(), 6u);
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    RequestOutput o =
        Output(ids[i], static_cast<int32_t>(i + 1), i + 1 == ids.size() ? FinishReason::kLength : FinishReason::kNone);
    const std::string piece = t.Take(&o);
    EXPECT_TRUE(IsValidUtf8(piece)) << "piece of token " << ids[i];
    out += piece;
  }
  EXPECT_EQ(out, text);
}

TEST_F(TextOutputTest, StopStringIsNeverHalfEmitted) {
  const std::string text = "the model serves a paged cache of blocks";
  Result r = Run(text, {.stop = {"cache of"}});
  EXPECT_EQ(r.finish, FinishReason::kStopString);
  EXPECT_EQ(r.text, "the model serves a paged ");
  // The request ends with the token that completed the stop string, and usage counts up to it.
  const std::vector<int32_t> ids = tok_->Encode(text, false);
  EXPECT_EQ(r.completion_tokens, static_cast<int32_t>(r.tokens.size()));
  EXPECT_EQ(r.tokens, std::vector<int32_t>(ids.begin(), ids.begin() + r.tokens.size()));
  EXPECT_NE(tok_->Decode(r.tokens, true).find("cache of"), std::string::npos);
  EXPECT_EQ(tok_->Decode(std::vector<int32_t>(r.tokens.begin(), r.tokens.end() - 1), true).find("cache of"),
            std::string::npos);

  Result with = Run(text, {.stop = {"cache of"}, .include_stop_str_in_output = true});
  EXPECT_EQ(with.text, "the model serves a paged cache of");
}

TEST_F(TextOutputTest, HeldPrefixIsReleasedWhenTheStopStringDoesNotFollow) {
  Result r = Run("a cache of blocks", {.stop = {"cache hit"}});
  EXPECT_EQ(r.finish, FinishReason::kLength);
  EXPECT_EQ(r.text, "a cache of blocks");
}

TEST_F(TextOutputTest, MaxTokensFlushesAndMinTokensDelaysStopStrings) {
  Result r = Run("hello world it is", {}, /*max_tokens=*/2);
  EXPECT_EQ(r.finish, FinishReason::kLength);
  const std::vector<int32_t> ids = tok_->Encode("hello world it is", false);
  EXPECT_EQ(r.text, tok_->Decode(std::vector<int32_t>(ids.begin(), ids.begin() + 2), true));

  Result m = Run("hello hello hello hello", {.stop = {"hello"}, .min_tokens = 3});
  EXPECT_EQ(m.finish, FinishReason::kStopString) << "the stop string counts once min_tokens are out";
  EXPECT_EQ(m.completion_tokens, 3);
  EXPECT_NE(m.text.find("hello"), std::string::npos);
}

// Several tokens in one output: the tokens after the one that completed the stop string are not the client's;
// what the engine sends until it takes the stop carries nothing, and its last output becomes the stop's.
TEST_F(TextOutputTest, TokensAfterTheStopAreDroppedAndTheEnginesLastOutputBecomesTheStops) {
  TextOutput t(tok_.get(), {.stop = {" world"}});
  const std::vector<int32_t> ids = tok_->Encode("hello world it is", false);
  ASSERT_GE(ids.size(), 4u);
  RequestOutput out;
  out.token_ids = ids;
  out.logprobs.resize(ids.size());
  out.usage = {.prompt_tokens = 7, .completion_tokens = static_cast<int32_t>(ids.size())};
  EXPECT_EQ(t.Take(&out), "hello");
  ASSERT_TRUE(t.stopped_at());
  EXPECT_EQ(*t.stopped_at(), 2);
  EXPECT_EQ(out.token_ids, std::vector<int32_t>(ids.begin(), ids.begin() + 2));
  EXPECT_EQ(out.logprobs.size(), 2u);
  EXPECT_EQ(out.usage.completion_tokens, 2);
  EXPECT_EQ(out.finish, FinishReason::kNone) << "the engine has not ended it yet";

  RequestOutput later = Output(ids[0], 5);
  EXPECT_EQ(t.Take(&later), "");
  EXPECT_TRUE(later.token_ids.empty());
  RequestOutput last = Output(ids[1], 6, FinishReason::kLength);
  last.error = absl::UnavailableError("the server is stopping");
  EXPECT_EQ(t.Take(&last), "");
  EXPECT_TRUE(last.token_ids.empty());
  EXPECT_EQ(last.finish, FinishReason::kStopString);
  EXPECT_TRUE(last.error.ok()) << "the client has its whole answer";
  EXPECT_EQ(last.usage.completion_tokens, 2);
}

TEST_F(TextOutputTest, AnEosTokenAddsNoTextAndReleasesWhatWasHeld) {
  TextOutput t(tok_.get(), {.stop = {"hello there"}});
  const std::vector<int32_t> ids = tok_->Encode("say hello", false);
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    RequestOutput o = Output(ids[i], static_cast<int32_t>(i + 1));
    text += t.Take(&o);
  }
  EXPECT_EQ(text, "say ") << "'hello' may begin the stop string";
  RequestOutput eos = Output(ids[0], static_cast<int32_t>(ids.size() + 1), FinishReason::kEos);
  EXPECT_EQ(t.Take(&eos), "hello");
  EXPECT_EQ(eos.finish, FinishReason::kEos);
  EXPECT_EQ(eos.token_ids.size(), 1u);
}

TEST_F(TextOutputTest, AFailedRequestReleasesNothingMore) {
  TextOutput t(tok_.get(), {.stop = {"hello there"}});
  const std::vector<int32_t> ids = tok_->Encode("hello", false);
  RequestOutput o = Output(ids[0], 1);
  EXPECT_EQ(t.Take(&o), "");
  RequestOutput failed;
  failed.finish = FinishReason::kAborted;
  failed.error = absl::DeadlineExceededError("the request's deadline expired");
  EXPECT_EQ(t.Take(&failed), "");
  EXPECT_EQ(failed.error.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(t.stopped_at());
}

}  // namespace
}  // namespace inferd

namespace inferd {
namespace {

// Streamed one token at a time, runs of byte-fallback tokens give the text Hugging Face's decode gives the whole
// sequence (tools/make_tokenizer_fixtures.py): a run is resolved only once it ends.
TEST(TextOutputByteRuns, StreamedTextEqualsHuggingFacesDecode) {
  for (const char* name : {"llama2-tiny", "mistral-tiny"}) {
    auto tok = Tokenizer::FromFile(testing::ModelDir(name) + "/tokenizer.json");
    ASSERT_TRUE(tok.ok()) << tok.status();
    const nlohmann::json fixture =
        testing::ReadJson(testing::SourcePath(std::string("tests/fixtures/tokenizer/") + name + ".json"));
    ASSERT_TRUE(fixture.contains("byte_runs")) << name;
    for (const auto& c : fixture["byte_runs"]) {
      const std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
      TextOutput t(tok->get(), {});
      std::string streamed;
      for (size_t i = 0; i < ids.size(); ++i) {
        RequestOutput out;
        out.token_ids = {ids[i]};
        out.usage.completion_tokens = static_cast<int32_t>(i + 1);
        out.finish = i + 1 == ids.size() ? FinishReason::kLength : FinishReason::kNone;
        const std::string piece = t.Take(&out);
        EXPECT_TRUE(IsValidUtf8(piece));
        streamed += piece;
      }
      // The decode drops the first token's leading space (SentencePiece's Strip); a continuation keeps it.
      const std::string first = (*tok)->TokenBytes(ids[0], true);
      const std::string want = (first.starts_with(" ") ? " " : "") + c["decoded"].get<std::string>();
      EXPECT_EQ(streamed, want) << name << " " << c["ids"].dump();
    }
  }
}

}  // namespace
}  // namespace inferd

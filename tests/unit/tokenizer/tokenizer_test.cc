// Our tokenizer against ids and decodes recorded with Hugging Face tokenizers
// (tools/make_tokenizer_fixtures.py) on a corpus of hard strings.
#include "engine/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include "tests/unit/fixtures.h"

namespace inferd {
namespace {

using testing::kTestModels;

class TokenizerFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(TokenizerFixture, IdsAndDecodesEqualHuggingFace) {
  const std::string name = GetParam();
  auto tok = Tokenizer::FromFile(testing::ModelDir(name) + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const nlohmann::json fixture = testing::ReadJson(testing::SourcePath("tests/fixtures/tokenizer/" + name + ".json"));
  ASSERT_GT(fixture["cases"].size(), 40u);
  for (const auto& c : fixture["cases"]) {
    const std::string text = c["text"].get<std::string>();
    SCOPED_TRACE(name + ": " + c["text"].dump());
    const std::vector<int32_t> ids = (*tok)->Encode(text, true);
    EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>());
    EXPECT_EQ((*tok)->Encode(text, false), c["ids_no_special"].get<std::vector<int32_t>>());
    const std::vector<int32_t> ref_ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ((*tok)->Decode(ref_ids, true), c["decoded"].get<std::string>());
    EXPECT_EQ((*tok)->Decode(ref_ids, false), c["decoded_with_special"].get<std::string>());
  }
}

// Byte-fallback tokenizers: consecutive byte tokens decode as one run (valid UTF-8 as a whole, else one U+FFFD
// per byte token), as Hugging Face's ByteFallback decoder does.
TEST_P(TokenizerFixture, ByteTokenRunsDecodeAsHuggingFaceDoes) {
  const std::string name = GetParam();
  auto tok = Tokenizer::FromFile(testing::ModelDir(name) + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const nlohmann::json fixture = testing::ReadJson(testing::SourcePath("tests/fixtures/tokenizer/" + name + ".json"));
  if (!fixture.contains("byte_runs")) {
    EXPECT_EQ((*tok)->FallbackByte(0, false), -1);
    GTEST_SKIP() << name << " has no byte-fallback tokens";
  }
  ASSERT_GT(fixture["byte_runs"].size(), 20u);
  for (const auto& c : fixture["byte_runs"]) {
    const std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ((*tok)->Decode(ids, true), c["decoded"].get<std::string>()) << c["ids"].dump();
  }
}

INSTANTIATE_TEST_SUITE_P(AllModels, TokenizerFixture, ::testing::ValuesIn(kTestModels), [](const auto& info) {
  return std::string(info.param).substr(0, std::string(info.param).find('-'));
});

TEST(Tokenizer, RejectsUnsupportedModelType) {
  auto tok = Tokenizer::FromJson(R"({"model": {"type": "Unigram", "vocab": []}})");
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("Unigram"), std::string::npos);
}

TEST(Tokenizer, RejectsMalformedJson) {
  EXPECT_FALSE(Tokenizer::FromJson("{\"model\": ").ok());
  EXPECT_FALSE(Tokenizer::FromJson(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [7]}})").ok());
}

// A byte-fallback piece that the file also lists as a special added token decodes to its byte, as Hugging Face
// tokenizers 0.23.3 gives for this very document: decode([2, 1, 3]) = "a\x17b", and "ab" skipping specials.
TEST(Tokenizer, ByteFallbackPiecesRegisteredAsAddedTokensDecodeToTheirByte) {
  const char* spec = R"({"added_tokens": [
      {"id": 0, "content": "<unk>", "special": true}, {"id": 1, "content": "<0x17>", "special": true}],
    "normalizer": null, "pre_tokenizer": null, "post_processor": null,
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                                                {"type": "ByteFallback"}, {"type": "Fuse"}]},
    "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true,
              "vocab": {"<unk>": 0, "<0x17>": 1, "a": 2, "b": 3}, "merges": []}})";
  auto tok = Tokenizer::FromJson(spec);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::vector<int32_t> ids = {2, 1, 3};
  EXPECT_EQ((*tok)->Decode(ids, /*skip_special_tokens=*/false), std::string("a\x17") + "b");
  EXPECT_EQ((*tok)->Decode(ids, /*skip_special_tokens=*/true), "ab");
}

}  // namespace
}  // namespace inferd

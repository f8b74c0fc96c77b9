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

}  // namespace
}  // namespace inferd

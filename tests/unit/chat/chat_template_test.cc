// Chat templates render exactly what Hugging Face's apply_chat_template renders
// (tools/make_chat_fixtures.py), for every test model, the bundled SmolLM2 and the feature templates.
#include "engine/chat/chat_template.h"

#include <gtest/gtest.h>

#include "engine/model/model.h"
#include "tests/unit/fixtures.h"

namespace inferd {
namespace {

std::vector<ChatMessage> Messages(const nlohmann::json& j) {
  std::vector<ChatMessage> out;
  for (const auto& m : j) out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  return out;
}

TEST(ChatTemplate, RendersEqualHuggingFace) {
  const nlohmann::json fixture = testing::ReadJson(testing::SourcePath("tests/fixtures/chat/renders.json"));
  ASSERT_GE(fixture["templates"].size(), 9u);
  int rendered = 0, refused = 0;
  for (const auto& t : fixture["templates"]) {
    const std::string name = t["name"].get<std::string>();
    SCOPED_TRACE(name);
    std::unique_ptr<Model> model;
    std::unique_ptr<ChatTemplate> own;
    const ChatTemplate* tmpl = nullptr;
    if (!t["model"].get<std::string>().empty()) {  // the template as the model's files carry it
      auto m = LoadModel(testing::SourcePath(t["model"].get<std::string>()));
      ASSERT_TRUE(m.ok()) << m.status();
      model = std::move(*m);
      ASSERT_NE(model->chat_template, nullptr);
      EXPECT_EQ(model->chat_template->source(), t["template"].get<std::string>());
      tmpl = model->chat_template.get();
    } else {
      auto c = ChatTemplate::Compile(t["template"].get<std::string>(), t["bos_token"].get<std::string>(),
                                     t["eos_token"].get<std::string>());
      ASSERT_TRUE(c.ok()) << c.status();
      own = std::move(*c);
      tmpl = own.get();
    }
    for (const auto& c : t["cases"]) {
      SCOPED_TRACE(c["messages"].dump() + (c["add_generation_prompt"].get<bool>() ? " +gen" : ""));
      auto text = tmpl->Render(Messages(c["messages"]), c["add_generation_prompt"].get<bool>());
      if (c.contains("error")) {
        ASSERT_FALSE(text.ok()) << "rendered " << *text;
        EXPECT_NE(text.status().message().find(c["error"].get<std::string>()), std::string::npos) << text.status();
        ++refused;
      } else {
        ASSERT_TRUE(text.ok()) << text.status();
        EXPECT_EQ(*text, c["rendered"].get<std::string>());
        ++rendered;
      }
    }
  }
  EXPECT_GT(rendered, 100);
  EXPECT_GT(refused, 10);
}

TEST(ChatTemplate, UnsupportedOrBrokenTemplatesAreRefusedWithTheLine) {
  const std::pair<const char*, const char*> cases[] = {
      {"{% for m in messages %}", "without {% endfor %}"},
      {"{{ messages[0] ", "never closed"},
      {"line one\n{% macro f() %}{% endmacro %}", "line 2"},
      {"{{ 'a' + }}", "unexpected"},
      {"{% endif %}", "without its opening tag"},
      {"{{ \"unterminated }}", "never closed"},
  };
  for (const auto& [src, msg] : cases) {
    auto t = ChatTemplate::Compile(src, "", "");
    ASSERT_FALSE(t.ok()) << src;
    EXPECT_NE(t.status().message().find(msg), std::string::npos) << src << ": " << t.status();
  }
  auto t = ChatTemplate::Compile("{{ messages | frobnicate }}", "", "");
  ASSERT_TRUE(t.ok());
  auto r = (*t)->Render({{"user", "hi"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("filter 'frobnicate' is not supported"), std::string::npos) << r.status();
}

TEST(ChatTemplate, EndOfTurnTokensStopGeneration) {
  auto m = LoadModel(testing::SourcePath("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
  ASSERT_TRUE(m.ok()) << m.status();
  const auto im_end = (*m)->tokenizer->TokenToId("<|im_end|>");
  ASSERT_TRUE(im_end.has_value());
  EXPECT_NE(std::find((*m)->eos_token_ids.begin(), (*m)->eos_token_ids.end(), *im_end), (*m)->eos_token_ids.end());
  auto q = LoadModel(testing::ModelDir("qwen2-tiny"));
  ASSERT_TRUE(q.ok()) << q.status();
  const auto q_im_end = (*q)->tokenizer->TokenToId("<|im_end|>");
  EXPECT_NE(std::find((*q)->eos_token_ids.begin(), (*q)->eos_token_ids.end(), *q_im_end), (*q)->eos_token_ids.end());
}

}  // namespace
}  // namespace inferd

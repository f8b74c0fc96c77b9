// Reasoning split from the answer (engine/chat/reasoning.h), whole and streamed in pieces of every size: a <think>
// at the start or opened by the prompt, a close tag split across pieces, blank lines after it dropped, output that
// never thinks, reasoning that never closes.
#include "engine/chat/reasoning.h"

#include <gtest/gtest.h>

namespace inferd {
namespace {

ReasoningPiece Split(const std::string& text, bool opened, size_t piece) {
  ReasoningStream stream(opened);
  ReasoningPiece all;
  for (size_t i = 0; i < text.size(); i += piece) {
    ReasoningPiece p = stream.Feed(std::string_view(text).substr(i, piece));
    EXPECT_EQ(p.reasoning.find("</think>"), std::string::npos) << text;
    all.reasoning += p.reasoning;
    all.content += p.content;
  }
  ReasoningPiece end = stream.Finish();
  all.reasoning += end.reasoning;
  all.content += end.content;
  return all;
}

TEST(Reasoning, SplitsTheThinkingFromTheAnswerInPiecesOfAnySize) {
  struct Case {
    std::string text;
    bool opened;
    std::string reasoning, content;
  };
  const Case cases[] = {
      {"<think>\nLet me add.\n</think>\n\nIt is 4.", false, "Let me add.\n", "It is 4."},
      {"  <think>x</think>y", false, "x", "y"},
      {"Let me add.\n</think>\n\nIt is 4.", true, "Let me add.\n", "It is 4."},
      {"It is 4, no <think> here.", false, "", "It is 4, no <think> here."},
      {"<thin", false, "", "<thin"},
      {"<think>\nstill thinking when max_tokens ran out </thi", false, "still thinking when max_tokens ran out </thi",
       ""},
      {"<think></think>", false, "", ""},
      {"<think>\n\n</think>\n\nDirect.", false, "", "Direct."},
  };
  for (const Case& c : cases) {
    for (size_t piece : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, c.text.size()}) {
      const ReasoningPiece got = Split(c.text, c.opened, piece);
      EXPECT_EQ(got.reasoning, c.reasoning) << c.text << " in pieces of " << piece;
      EXPECT_EQ(got.content, c.content) << c.text << " in pieces of " << piece;
    }
  }
}

TEST(Reasoning, TemplatesAndPromptsThatThink) {
  EXPECT_TRUE(TemplateThinks("{{ '<think>\\n' + r + '\\n</think>' }}"));
  EXPECT_FALSE(TemplateThinks("{% for m in messages %}{{ m.content }}{% endfor %}"));
  EXPECT_TRUE(PromptOpensReasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(PromptOpensReasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(PromptOpensReasoning("<|im_start|>assistant\n"));
}

}  // namespace
}  // namespace inferd

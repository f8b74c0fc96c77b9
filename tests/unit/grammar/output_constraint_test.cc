// Structured output (engine/grammar/output_constraint.h) on a real byte-level BPE vocabulary (qwen2-tiny's):
// walking a constraint by always taking an allowed token gives text that satisfies it; bad and oversized
// constraints are refused naming their field.
#include "engine/grammar/output_constraint.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "engine/chat/tool_calls.h"
#include "tests/unit/fixtures.h"

namespace inferd {
namespace {

constexpr int32_t kVocab = 608;  // qwen2-tiny's logits width (its tokenizer has 600 ids)

struct Vocab {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ConstraintCompiler> compiler;
  int32_t eos = 0;
};

Vocab Make(ConstraintLimits limits = {}) {
  Vocab s;
  auto tok = Tokenizer::FromFile(testing::SourcePath("tests/fixtures/models/qwen2-tiny/tokenizer.json"));
  EXPECT_TRUE(tok.ok()) << tok.status();
  s.tokenizer = std::move(*tok);
  s.eos = *s.tokenizer->TokenToId("<|endoftext|>");
  auto compiler = ConstraintCompiler::Create(*s.tokenizer, kVocab, {s.eos}, limits);
  EXPECT_TRUE(compiler.ok()) << compiler.status();
  s.compiler = std::move(*compiler);
  return s;
}

// Takes a random allowed token until the constraint ends (at most `limit` tokens); returns the text before the
// stop token, or "<stuck>" when no token is allowed.
std::string Walk(const Vocab& s, const OutputConstraint& c, uint32_t seed, int limit = 400) {
  auto compiled = s.compiler->Compile(c);
  EXPECT_TRUE(compiled.ok()) << compiled.status();
  ConstraintState state(*compiled);
  std::vector<uint32_t> mask(ConstraintState::MaskWords(kVocab));
  std::vector<int32_t> ids;
  std::mt19937 rng(seed);
  for (int i = 0; i < limit && !state.Terminated(); ++i) {
    state.FillAllowed(mask);
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < kVocab; ++t) {
      if (mask[t / 32] >> (t % 32) & 1u) allowed.push_back(t);
    }
    if (allowed.empty()) return "<stuck>";
    // A random allowed token, leaning towards closing quotes and brackets and towards the end once allowed, so
    // that walks finish.
    std::vector<int32_t> closing;
    for (int32_t a : allowed) {
      const std::string text = a < s.tokenizer->vocab_size() ? s.tokenizer->TokenBytes(a, false) : "";
      if (!text.empty() && std::string_view("\"}],").find(text[0]) != std::string_view::npos) closing.push_back(a);
    }
    int32_t t = !closing.empty() && rng() % 4 != 0 ? closing[rng() % closing.size()] : allowed[rng() % allowed.size()];
    if (i > 3 && std::find(allowed.begin(), allowed.end(), s.eos) != allowed.end()) t = s.eos;
    EXPECT_TRUE(state.Accept(t)) << t;
    if (t != s.eos) ids.push_back(t);
  }
  EXPECT_TRUE(state.Terminated()) << "the walk ended within " << limit << " tokens";
  return s.tokenizer->Decode(ids, false);
}

TEST(OutputConstraint, WalksOfAJsonSchemaGiveJsonThatFitsIt) {
  const Vocab s = Make();
  OutputConstraint c{OutputConstraint::Kind::kJsonSchema,
                     R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
                         "required": ["name", "age"], "additionalProperties": false})",
                     {},
                     "response_format.json_schema.schema"};
  for (uint32_t seed = 1; seed <= 30; ++seed) {
    const std::string text = Walk(s, c, seed);
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << text << " (" << absl::CHexEscape(text) << ")";
    ASSERT_TRUE(j["name"].is_string()) << text;
    const std::string name = j["name"].get<std::string>();
    EXPECT_LE(std::count_if(name.begin(), name.end(), [](char ch) { return (ch & 0xC0) != 0x80; }), 8) << text;
    ASSERT_TRUE(j["age"].is_number_integer()) << text;
    EXPECT_LE(j["age"].get<int>(), 120) << text;
    for (auto& [k, v] : j.items()) EXPECT_TRUE(k == "name" || k == "age" || k == "tags") << text;
  }
}

TEST(OutputConstraint, JsonObjectRegexAndChoiceHold) {
  const Vocab s = Make();
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    const std::string obj = Walk(s, {OutputConstraint::Kind::kJsonObject, "", {}, "response_format"}, seed);
    EXPECT_TRUE(nlohmann::json::parse(obj, nullptr, false).is_object()) << obj;
    const std::string date =
        Walk(s, {OutputConstraint::Kind::kRegex, R"(\d{4}-\d{2}-\d{2})", {}, "structured_outputs.regex"}, seed);
    EXPECT_TRUE(std::regex_match(date, std::regex(R"(\d{4}-\d{2}-\d{2})"))) << date;
    const std::string pick = Walk(
        s, {OutputConstraint::Kind::kChoice, "", {"yes (sure)", "no.", "maybe?"}, "structured_outputs.choice"}, seed);
    EXPECT_TRUE(pick == "yes (sure)" || pick == "no." || pick == "maybe?") << pick;
    const std::string ebnf = Walk(
        s, {OutputConstraint::Kind::kGrammar, R"(root ::= "x" [0-9]+ ("," [0-9]+)*)", {}, "structured_outputs.grammar"},
        seed);
    EXPECT_TRUE(std::regex_match(ebnf, std::regex(R"(x[0-9]+(,[0-9]+)*)"))) << ebnf;
  }
}

// Taking tokens back (speculative decoding's rejected drafts) leaves the state as it was before them: the same
// masks, the same tokens accepted next, and an answer that fits the constraint when the walk goes another way.
TEST(OutputConstraint, RollingBackTokensRestoresTheStateBeforeThem) {
  const Vocab s = Make();
  auto compiled = s.compiler->Compile({OutputConstraint::Kind::kRegex, R"(\d{4}-\d{2}-\d{2})", {}, "regex"});
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  ConstraintState state(*compiled);
  const int32_t words = ConstraintState::MaskWords(kVocab);
  auto tokens_of = [&](const std::string& text) {
    std::vector<int32_t> ids = s.tokenizer->Encode(text, false);
    EXPECT_FALSE(ids.empty()) << text;
    return ids;
  };
  const std::vector<int32_t> first = tokens_of("2024-"), wrong = tokens_of("11-03"), right = tokens_of("03-15");
  for (int32_t t : first) ASSERT_TRUE(state.Accept(t)) << t;
  std::vector<uint32_t> before(words), after(words);
  state.FillAllowed(before);
  EXPECT_FALSE(state.Rollback(static_cast<int32_t>(first.size()) + 1)) << "more than was accepted";
  EXPECT_FALSE(state.Rollback(-1));
  for (int32_t t : wrong) ASSERT_TRUE(state.Accept(t)) << t;
  ASSERT_TRUE(state.Rollback(static_cast<int32_t>(wrong.size())));
  state.FillAllowed(after);
  EXPECT_EQ(before, after) << "the masks after the rollback are those before the drafted tokens";
  for (int32_t t : right) ASSERT_TRUE(state.Accept(t)) << t;
  ASSERT_TRUE(state.Accept(s.eos));
  EXPECT_TRUE(state.Terminated());
  // Back past the stop token and into the first part: the text may go on from there again.
  ASSERT_TRUE(state.Rollback(1));
  EXPECT_FALSE(state.Terminated());
  ASSERT_TRUE(state.Rollback(static_cast<int32_t>(right.size())));
  state.FillAllowed(after);
  EXPECT_EQ(before, after);
  EXPECT_FALSE(state.Accept(tokens_of("x")[0])) << "a letter does not fit the pattern after a rollback either";
}

// A forced tool call (engine/chat/tool_calls.h's shape): the prefix, an object naming one of the tools with
// arguments its schema admits, the suffix; a call the tool-call parser reads back.
TEST(OutputConstraint, AForcedToolCallIsAlwaysACallOfAnOfferedTool) {
  const Vocab s = Make();
  const std::vector<ToolSpec> tools = {
      {"get_weather", "", R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}},
                              "required": ["city"], "additionalProperties": false})"},
      {"add", "", R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                      "additionalProperties": false})"}};
  for (ToolCallFormat format : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral}) {
    for (const std::string only : {"", "add"}) {
      const ToolCallShape shape = ForcedToolCall(format, tools, only);
      OutputConstraint c{OutputConstraint::Kind::kToolCall, shape.schema, {}, "tool_choice"};
      c.prefix = shape.prefix;
      c.suffix = shape.suffix;
      for (uint32_t seed = 1; seed <= 10; ++seed) {
        const std::string text = Walk(s, c, seed);
        const ToolCallSplit split = SplitToolCalls(format, text);
        ASSERT_EQ(split.calls.size(), 1u) << ToolCallFormatName(format) << ": " << text;
        EXPECT_TRUE(split.content.empty()) << text;
        const std::string& name = split.calls[0].name;
        EXPECT_TRUE(only.empty() ? (name == "add" || name == "get_weather") : name == only) << text;
        const nlohmann::json args = nlohmann::json::parse(split.calls[0].arguments);
        EXPECT_TRUE(name == "add" ? args["a"].is_number_integer() : args["city"].is_string()) << text;
      }
    }
  }
}

bool Allows(const std::vector<uint32_t>& mask, int32_t t) {
  return mask[t / 32] >> (t % 32) & 1u;
}

// A model that thinks reasons freely (any text, the end of the output refused) until </think>; the constraint
// holds for its answer after that and the blank lines that follow. Where the output may open the reasoning, it
// may also answer at once. With ConstraintLimits::in_reasoning the constraint holds for the reasoning too.
TEST(OutputConstraint, AThinkingModelReasonsFreelyAndItsAnswerFitsTheConstraint) {
  const Vocab s = Make();
  using R = OutputConstraint::Reasoning;
  // Feeds `text`'s tokens, each of which must be allowed, the end of the output never; returns false where one is not.
  const auto feed = [&](ConstraintState& state, const std::string& text, bool may_end) {
    std::vector<uint32_t> mask(ConstraintState::MaskWords(kVocab));
    for (int32_t t : s.tokenizer->Encode(text, false)) {
      state.FillAllowed(mask);
      EXPECT_EQ(Allows(mask, s.eos), may_end) << "before a token of \"" << text << "\"";
      if (!Allows(mask, t)) return false;
      EXPECT_TRUE(state.Accept(t));
    }
    return true;
  };
  const std::string thought = "the answer is {\"json\": 1}, not zz-12 </thin or </ yet\n";
  for (R reasoning : {R::kOpened, R::kMayOpen}) {
    OutputConstraint c{OutputConstraint::Kind::kRegex, "[a-f]{3}-[0-9]{2}", {}, "structured_outputs.regex"};
    c.reasoning = reasoning;
    auto compiled = s.compiler->Compile(c);
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    ConstraintState state(*compiled);
    const std::string opening = reasoning == R::kMayOpen ? "<think>\n" : "";
    ASSERT_TRUE(feed(state, opening + thought + "</think>\n\n", false)) << "the reasoning is free text";
    EXPECT_FALSE(feed(state, "zz", false)) << "the answer is constrained";
    ASSERT_TRUE(feed(state, "abc-42", false));
    std::vector<uint32_t> mask(ConstraintState::MaskWords(kVocab));
    state.FillAllowed(mask);
    EXPECT_TRUE(Allows(mask, s.eos)) << "the answer is complete";
    EXPECT_TRUE(state.Accept(s.eos));
    EXPECT_TRUE(state.Terminated());
  }
  {  // may open, answers at once
    OutputConstraint c{OutputConstraint::Kind::kRegex, "[a-f]{3}-[0-9]{2}", {}, "structured_outputs.regex"};
    c.reasoning = R::kMayOpen;
    ConstraintState state(*s.compiler->Compile(c));
    EXPECT_FALSE(feed(state, "zz", false));
    ConstraintState again(*s.compiler->Compile(c));
    EXPECT_TRUE(feed(again, "fed-10", false));
  }
  {  // the reasoning constrained too
    ConstraintLimits limits;
    limits.in_reasoning = true;
    const Vocab strict = Make(limits);
    OutputConstraint c{OutputConstraint::Kind::kRegex, "[a-f]{3}-[0-9]{2}", {}, "structured_outputs.regex"};
    c.reasoning = R::kOpened;
    ConstraintState state(*strict.compiler->Compile(c));
    std::vector<uint32_t> mask(ConstraintState::MaskWords(kVocab));
    state.FillAllowed(mask);
    const std::vector<int32_t> think = strict.tokenizer->Encode("the", false);
    EXPECT_FALSE(Allows(mask, think[0])) << "no free reasoning";
  }
}

// A constraint whose compilation takes longer than the limit is refused naming its field and the key; it goes on,
// and while limits.max_overdue of those still run, a request to compile is Unavailable.
TEST(OutputConstraint, ACompilationPastItsTimeLimitIsRefusedAndTheOverdueOnesAreBounded) {
  // Hundreds of patterned properties: far longer than a millisecond to compile (about 0.15 s here).
  std::string schema = R"({"type": "object", "properties": {)";
  for (int i = 0; i < 300; ++i) {
    schema += absl::StrCat(i ? ", " : "", "\"p", i, "\": {\"type\": \"string\", \"pattern\": \"[a-z]{1,", i % 7 + 1,
                           "}[0-9]+x", i, "\"}");
  }
  schema += "}}";
  const OutputConstraint slow{OutputConstraint::Kind::kJsonSchema, schema, {}, "response_format.json_schema.schema"};
  ConstraintLimits limits;
  limits.compile_timeout_ms = 1;
  limits.max_overdue = 1;
  const Vocab hurried = Make(limits);
  auto refused = hurried.compiler->Compile(slow);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  const std::string message(refused.status().message());
  EXPECT_NE(message.find("response_format.json_schema.schema"), std::string::npos) << message;
  EXPECT_NE(message.find("engine.structured_output_compile_timeout_ms"), std::string::npos) << message;
  const auto busy = hurried.compiler->Compile(slow);
  EXPECT_EQ(busy.status().code(), absl::StatusCode::kUnavailable) << busy.status();
  // With the default limit it compiles.
  const Vocab patient = Make();
  EXPECT_TRUE(patient.compiler->Compile(slow).ok());
}

TEST(OutputConstraint, BadAndOversizedConstraintsAreRefusedNamingTheField) {
  const Vocab s = Make(ConstraintLimits{.max_bytes = 100});
  auto bad = s.compiler->Compile({OutputConstraint::Kind::kJsonSchema, R"({"type": "nonsense"})", {}, "field.a"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("field.a"), std::string::npos) << bad.status();
  auto regex = s.compiler->Compile({OutputConstraint::Kind::kRegex, "(unclosed", {}, "field.b"});
  ASSERT_FALSE(regex.ok());
  EXPECT_NE(regex.status().message().find("field.b"), std::string::npos) << regex.status();
  auto big = s.compiler->Compile({OutputConstraint::Kind::kRegex, std::string(101, 'a'), {}, "field.c"});
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("at most 100"), std::string::npos) << big.status();
  auto empty = s.compiler->Compile({OutputConstraint::Kind::kChoice, "", {}, "field.d"});
  EXPECT_FALSE(empty.ok());
}

// Hostile schemas as text (the body's depth bound does not look inside a string): deep nesting is refused before
// compiling; a long enum compiles or is refused, never crashes.
TEST(OutputConstraint, DeepAndWideSchemasCompileOrAreRefused) {
  const Vocab s = Make(ConstraintLimits{.max_bytes = 1 << 20});
  const auto nested = [](int depth) {
    std::string schema = R"({"type": "integer", "description": "[[{{"})";
    for (int i = 0; i < depth; ++i) schema = R"({"type": "array", "maxItems": 1, "items": )" + schema + "}";
    return schema;
  };
  // 2,000 deep took xgrammar 7.7 minutes to compile: past kMaxSchemaDepth it is refused at once; at the bound
  // (brackets inside strings not counted) it compiles.
  auto deep = s.compiler->Compile({OutputConstraint::Kind::kJsonSchema, nested(2000), {}, "field.deep"});
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("field.deep: nested deeper than 32"), std::string::npos) << deep.status();
  EXPECT_TRUE(s.compiler->Compile({OutputConstraint::Kind::kJsonSchema, nested(31), {}, "f"}).ok());
  EXPECT_FALSE(s.compiler->Compile({OutputConstraint::Kind::kJsonSchema, nested(32), {}, "f"}).ok());
  std::string wide = R"({"enum": [)";
  for (int i = 0; i < 5000; ++i) wide += (i ? ", " : "") + std::string("\"v") + std::to_string(i) + "\"";
  wide += "]}";
  auto enumerated = s.compiler->Compile({OutputConstraint::Kind::kJsonSchema, wide, {}, "field.wide"});
  if (!enumerated.ok()) {
    EXPECT_EQ(enumerated.status().code(), absl::StatusCode::kInvalidArgument) << enumerated.status();
  }
}

}  // namespace
}  // namespace inferd

namespace inferd {
namespace {

// A step's masks filled together on xgrammar's threads are each row's own: states of two constraints, advanced to
// different places, give the masks FillAllowed gives them one at a time.
TEST(ConstraintBatch, FillsEachRowsOwnMask) {
  const Vocab s = Make();
  auto schema = s.compiler->Compile({OutputConstraint::Kind::kJsonSchema,
                                     R"({"type": "object", "properties": {"n": {"type": "integer"}},
                                         "required": ["n"], "additionalProperties": false})",
                                     {},
                                     "f"});
  auto choice = s.compiler->Compile({OutputConstraint::Kind::kChoice, "", {"yes", "no"}, "f"});
  ASSERT_TRUE(schema.ok() && choice.ok());
  std::vector<ConstraintState> states;
  for (int i = 0; i < 6; ++i) states.emplace_back(i % 2 ? *choice : *schema);
  std::mt19937 rng(4);
  std::vector<uint32_t> mask(ConstraintState::MaskWords(kVocab));
  for (int i = 0; i < 6; ++i) {  // state i advanced by i allowed tokens
    for (int k = 0; k < i / 2; ++k) {
      states[i].FillAllowed(mask);
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < kVocab; ++t) {
        if (t != s.eos && (mask[t / 32] >> (t % 32) & 1u)) allowed.push_back(t);
      }
      if (!allowed.empty()) {
        ASSERT_TRUE(states[i].Accept(allowed[rng() % allowed.size()]));
      }
    }
  }
  std::vector<std::vector<uint32_t>> one(6, mask), together(6, std::vector<uint32_t>(mask.size(), 0x5A5A5A5Au));
  std::vector<ConstraintState*> rows;
  std::vector<std::span<uint32_t>> spans;
  for (int i = 0; i < 6; ++i) {
    states[i].FillAllowed(one[i]);
    rows.push_back(&states[i]);
    spans.push_back(together[i]);
  }
  ConstraintBatch batch(kVocab);
  for (int call = 0; call < 3; ++call) {  // on the pool, then one by one (each way is measured), then the faster
    for (auto& m : together) std::fill(m.begin(), m.end(), 0x5A5A5A5Au);
    batch.FillAllowed(rows, spans);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(together[i], one[i]) << "call " << call << ", row " << i;
  }
}

}  // namespace
}  // namespace inferd

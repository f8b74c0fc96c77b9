#include "engine/grammar/output_constraint.h"

#include <dlpack/dlpack.h>
#include <xgrammar/xgrammar.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/grammar/schema_support.h"
#include "engine/json_depth.h"
#include "engine/status_macros.h"

namespace inferd {

class CompiledConstraint {
 public:
  explicit CompiledConstraint(xgrammar::CompiledGrammar grammar) : grammar(std::move(grammar)) {}
  xgrammar::CompiledGrammar grammar;
};

namespace {

// A short, single-line prefix of an error message for the client, without xgrammar's log prefix ("[12:00:00]
// .../json_schema_converter.cc:4944: ").
std::string Short(std::string_view text) {
  if (text.starts_with('[')) {
    const size_t source = text.find(".cc:");
    const size_t after = source == std::string_view::npos ? source : text.find(": ", source);
    if (after != std::string_view::npos) text.remove_prefix(after + 2);
  }
  std::string s(text.substr(0, 200));
  std::replace(s.begin(), s.end(), '\n', ' ');
  return text.size() > 200 ? s + "..." : s;
}

// A regular expression matching exactly `literal`.
std::string RegexLiteral(const std::string& literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}/").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

constexpr char kAnyObject[] = R"({"type": "object"})";  // response_format json_object

// What comes before the answer of a model that thinks (OutputConstraint::Reasoning): free text without </think>
// (xgrammar's TagDispatch with no tags and </think> excluded), then </think> and blank lines: the answer begins only
// after </think>, so the output cannot end inside the reasoning; with kMayOpen all of it only where the output
// opens with <think> (no blanks before it: a model that may think opens with it, and blanks there could go on).
xgrammar::Grammar ReasoningGrammar(OutputConstraint::Reasoning reasoning) {
  const std::string rules =
      "think ::= free \"</think>\" blanks\n"
      "free ::= TagDispatch(excludes=(\"</think>\"), loop_after_dispatch=false)\n"
      "blanks ::= [\\n]*\n";
  if (reasoning == OutputConstraint::Reasoning::kOpened) return xgrammar::Grammar::FromEBNF("root ::= think\n" + rules);
  return xgrammar::Grammar::FromEBNF("root ::= (\"<think>\" think)?\n" + rules);
}

// An EBNF string literal for `text` (xgrammar's dialect: C-style escapes).
std::string EbnfLiteral(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        out += c;
    }
  }
  return out + "\"";
}

}  // namespace

struct ConstraintCompiler::Impl {
  ConstraintLimits limits;
  std::unique_ptr<xgrammar::GrammarCompiler> compiler;
  std::atomic<int> overdue{0};  // compilations past the time limit that still run
  std::mutex mu;
  std::condition_variable idle;
  int running = 0;  // compilations on their threads (under mu): the compiler's end waits for them
};

ConstraintCompiler::ConstraintCompiler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ConstraintCompiler::~ConstraintCompiler() {
  if (!impl_) return;
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->idle.wait(lock, [&] { return impl_->running == 0; });  // none outlives the process's teardown
}

absl::StatusOr<std::unique_ptr<ConstraintCompiler>> ConstraintCompiler::Create(const Tokenizer& tokenizer,
                                                                               int32_t vocab_size,
                                                                               std::vector<int32_t> stop_ids,
                                                                               ConstraintLimits limits) {
  if (vocab_size < tokenizer.vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat("the model's vocabulary (", vocab_size,
                                                   ") is smaller than its tokenizer's (", tokenizer.vocab_size(), ")"));
  }
  // Each token as the bytes it adds to text; special tokens as empty strings, which xgrammar never lets a
  // constraint produce (only the stop tokens, once it is complete). So are tokens holding a control byte other
  // than tab, newline and carriage return: xgrammar 0.2.8 lets the one-byte tokens of bytes 0x00 and 0x1f into
  // JSON strings, whose grammar excludes them (found by output_constraint_test; no constraint a client states
  // needs them).
  const auto control = [](unsigned char c) { return c < 0x20 && c != '\t' && c != '\n' && c != '\r'; };
  std::vector<std::string> vocab(tokenizer.vocab_size());
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (tokenizer.IsSpecial(id)) continue;
    std::string bytes = tokenizer.TokenBytes(id, /*skip_special_tokens=*/false);
    if (std::none_of(bytes.begin(), bytes.end(), control)) vocab[id] = std::move(bytes);
  }
  try {
    xgrammar::TokenizerInfo info(vocab, xgrammar::VocabType::RAW, vocab_size, std::move(stop_ids));
    auto impl = std::make_unique<Impl>();
    impl->limits = limits;
    const int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
    impl->compiler =
        std::make_unique<xgrammar::GrammarCompiler>(info, threads, /*cache_enabled=*/true, limits.cache_bytes);
    return std::unique_ptr<ConstraintCompiler>(new ConstraintCompiler(std::move(impl)));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("structured output: the tokenizer's vocabulary: ", Short(e.what())));
  }
}

absl::StatusOr<std::shared_ptr<const CompiledConstraint>> ConstraintCompiler::Compile(const OutputConstraint& c) const {
  using Kind = OutputConstraint::Kind;
  int64_t bytes = static_cast<int64_t>(c.text.size() + c.prefix.size() + c.suffix.size());
  for (const std::string& choice : c.choices) bytes += static_cast<int64_t>(choice.size()) + 1;
  if (bytes > impl_->limits.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(c.field, ": ", bytes, " bytes is too large; allowed: at most ",
                                                   impl_->limits.max_bytes, " (engine.structured_output_max_bytes)"));
  }
  // xgrammar's compile time grows steeply with nesting (a schema 2,000 arrays deep took 7.7 minutes), and a
  // schema travels as text, past the request body's own depth bound: the same bound here.
  if ((c.kind == Kind::kJsonSchema || c.kind == Kind::kToolCall) && JsonDepth(c.text) > kMaxSchemaDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat(c.field, ": nested deeper than ", kMaxSchemaDepth, " levels; allowed: at most ", kMaxSchemaDepth));
  }
  if (c.kind == Kind::kJsonSchema || c.kind == Kind::kToolCall) {
    INFERD_RETURN_IF_ERROR(CheckEnforceable(c.text, c.field));
  }
  if (c.kind == Kind::kChoice && c.choices.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(c.field, ": an empty list; allowed: one or more strings"));
  }
  // On a thread of its own, waited for at most the time limit: xgrammar cannot be interrupted, so a compilation
  // past it goes on, counted, and its result is dropped (xgrammar's cache keeps it for a retry).
  if (const int overdue = impl_->overdue.load(); overdue >= impl_->limits.max_overdue) {
    return absl::UnavailableError(absl::StrCat(c.field, ": the constraint compiler is still busy with ", overdue,
                                               " constraints that took longer than ", impl_->limits.compile_timeout_ms,
                                               " ms (engine.structured_output_compile_timeout_ms); try again later"));
  }
  struct Pending {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false, abandoned = false;
    absl::StatusOr<std::shared_ptr<const CompiledConstraint>> result;
  };
  auto pending = std::make_shared<Pending>();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    ++impl_->running;
  }
  auto compile = [impl = impl_, pending, c] {
    absl::StatusOr<std::shared_ptr<const CompiledConstraint>> result = CompileWith(*impl, c);
    {
      std::lock_guard<std::mutex> lock(pending->mu);
      pending->result = std::move(result);
      pending->done = true;
      if (pending->abandoned) --impl->overdue;
      pending->cv.notify_all();
    }
    std::lock_guard<std::mutex> lock(impl->mu);
    --impl->running;
    impl->idle.notify_all();
  };
  try {
    std::thread(std::move(compile)).detach();
  } catch (const std::system_error& e) {  // no thread to be had: the request fails, the server goes on
    std::lock_guard<std::mutex> lock(impl_->mu);
    --impl_->running;
    return absl::UnavailableError(absl::StrCat(c.field, ": no thread to compile it on (", Short(e.what()), ")"));
  }
  std::unique_lock<std::mutex> lock(pending->mu);
  if (!pending->cv.wait_for(lock, std::chrono::milliseconds(impl_->limits.compile_timeout_ms),
                            [&] { return pending->done; })) {
    pending->abandoned = true;
    ++impl_->overdue;
    return absl::InvalidArgumentError(absl::StrCat(
        c.field, ": took longer than ", impl_->limits.compile_timeout_ms, " ms to compile; allowed: at most ",
        impl_->limits.compile_timeout_ms, " ms (engine.structured_output_compile_timeout_ms)"));
  }
  return std::move(pending->result);
}

absl::StatusOr<std::shared_ptr<const CompiledConstraint>> ConstraintCompiler::CompileWith(const Impl& impl,
                                                                                          const OutputConstraint& c) {
  using Kind = OutputConstraint::Kind;
  try {
    xgrammar::GrammarCompiler& x = *impl.compiler;
    std::string choice_regex;
    for (const std::string& choice : c.choices) {
      if (!choice_regex.empty()) choice_regex += '|';
      choice_regex += "(" + RegexLiteral(choice) + ")";
    }
    const OutputConstraint::Reasoning reasoning =
        impl.limits.in_reasoning ? OutputConstraint::Reasoning::kNone : c.reasoning;
    if (reasoning == OutputConstraint::Reasoning::kNone) {  // xgrammar's own calls, cached by their source
      switch (c.kind) {
        case Kind::kNone:
          break;
        case Kind::kJsonObject:
          return std::make_shared<const CompiledConstraint>(x.CompileJSONSchema(kAnyObject));
        case Kind::kJsonSchema:
          return std::make_shared<const CompiledConstraint>(
              x.CompileJSONSchema(c.text, /*any_whitespace=*/false, std::nullopt, std::nullopt, /*strict_mode=*/true));
        case Kind::kRegex:
          return std::make_shared<const CompiledConstraint>(x.CompileRegex(c.text));
        case Kind::kGrammar:
          return std::make_shared<const CompiledConstraint>(x.CompileGrammar(c.text));
        case Kind::kChoice:
          return std::make_shared<const CompiledConstraint>(x.CompileRegex(choice_regex));
        case Kind::kToolCall:
          break;
      }
    }
    std::optional<xgrammar::Grammar> answer;
    switch (c.kind) {
      case Kind::kNone:
        return absl::InvalidArgumentError(absl::StrCat(c.field, ": no constraint to compile"));
      case Kind::kJsonObject:
        answer = xgrammar::Grammar::FromJSONSchema(kAnyObject);
        break;
      case Kind::kJsonSchema:
        answer = xgrammar::Grammar::FromJSONSchema(c.text, /*any_whitespace=*/false, std::nullopt, std::nullopt,
                                                   /*strict_mode=*/true);
        break;
      case Kind::kRegex:
        answer = xgrammar::Grammar::FromRegex(c.text);
        break;
      case Kind::kGrammar:
        answer = xgrammar::Grammar::FromEBNF(c.text);
        break;
      case Kind::kChoice:
        answer = xgrammar::Grammar::FromRegex(choice_regex);
        break;
      case Kind::kToolCall: {
        std::vector<xgrammar::Grammar> parts;
        if (!c.prefix.empty()) parts.push_back(xgrammar::Grammar::FromEBNF("root ::= " + EbnfLiteral(c.prefix)));
        parts.push_back(xgrammar::Grammar::FromJSONSchema(c.text, /*any_whitespace=*/false, std::nullopt, std::nullopt,
                                                          /*strict_mode=*/true));
        if (!c.suffix.empty()) parts.push_back(xgrammar::Grammar::FromEBNF("root ::= " + EbnfLiteral(c.suffix)));
        answer = xgrammar::Grammar::Concat(parts);
        break;
      }
    }
    if (reasoning != OutputConstraint::Reasoning::kNone) {
      answer = xgrammar::Grammar::Concat({ReasoningGrammar(reasoning), *answer});
    }
    return std::make_shared<const CompiledConstraint>(x.CompileGrammar(*answer));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(c.field, " cannot be compiled: ", Short(e.what())));
  }
  return absl::InvalidArgumentError(absl::StrCat(c.field, ": no constraint to compile"));
}

struct ConstraintState::Impl {
  std::shared_ptr<const CompiledConstraint> compiled;  // outlives the matcher
  xgrammar::GrammarMatcher matcher;
  bool broken = false;   // xgrammar failed: the next token is refused, which ends the request with an error
  int32_t accepted = 0;  // tokens accepted since the start, the most Rollback can undo
};

ConstraintState::ConstraintState(std::shared_ptr<const CompiledConstraint> compiled)
    : impl_(new Impl{compiled, xgrammar::GrammarMatcher(compiled->grammar), false, 0}) {}
ConstraintState::~ConstraintState() = default;
ConstraintState::ConstraintState(ConstraintState&&) noexcept = default;

int32_t ConstraintState::MaskWords(int32_t vocab_size) {
  return xgrammar::GetBitmaskSize(vocab_size);
}

void ConstraintState::FillAllowed(std::span<uint32_t> mask) {
  int64_t shape[1] = {static_cast<int64_t>(mask.size())};
  DLTensor t{};
  t.data = mask.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = xgrammar::GetBitmaskDLType();
  t.shape = shape;
  try {
    impl_->matcher.FillNextTokenBitmask(&t);
  } catch (const std::exception&) {
    // Never out of xgrammar onto the engine's thread: every token allowed, and Accept refuses what comes.
    std::fill(mask.begin(), mask.end(), ~0u);
    impl_->broken = true;
  }
}

bool ConstraintState::Accept(int32_t token) {
  if (impl_->broken) return false;
  try {
    if (!impl_->matcher.AcceptToken(token)) return false;
  } catch (const std::exception&) {
    return false;
  }
  ++impl_->accepted;
  return true;
}

bool ConstraintState::Rollback(int32_t tokens) {
  if (tokens < 0 || tokens > impl_->accepted || impl_->broken) return false;
  if (tokens == 0) return true;
  try {
    impl_->matcher.Rollback(tokens);
  } catch (const std::exception&) {
    impl_->broken = true;  // as in FillAllowed: the sequence ends with an error at its next token
    return false;
  }
  impl_->accepted -= tokens;
  return true;
}

bool ConstraintState::Terminated() const {
  return impl_->matcher.IsTerminated();
}

struct ConstraintBatch::Impl {
  xgrammar::BatchGrammarMatcher batch{std::string("auto")};
  int32_t words = 0;
  std::vector<uint32_t> scratch;  // [rows][words]
  // Which way is faster depends on the grammars: a cheap mask (~2 us) costs less than handing rows to the pool.
  // Seconds per row of each way (moving averages, -1 until measured); every kRetry-th call takes the other way.
  double serial_s = -1, pooled_s = -1;
  int64_t calls = 0;
  static constexpr int64_t kRetry = 64;
};

ConstraintBatch::ConstraintBatch(int32_t vocab_size) : impl_(new Impl) {
  impl_->words = ConstraintState::MaskWords(vocab_size);
}
ConstraintBatch::~ConstraintBatch() = default;

void ConstraintBatch::FillAllowed(std::span<ConstraintState* const> states,
                                  std::span<const std::span<uint32_t>> masks) {
  std::vector<xgrammar::GrammarMatcher> matchers;
  std::vector<size_t> rows;  // which state each matcher is
  for (size_t i = 0; i < states.size(); ++i) {
    if (states[i]->impl_->broken || masks[i].size() != static_cast<size_t>(impl_->words)) {
      states[i]->FillAllowed(masks[i]);  // its own way (every token, or a size the batch does not take)
      continue;
    }
    matchers.push_back(states[i]->impl_->matcher);  // a handle: the same matcher
    rows.push_back(i);
  }
  Impl& m = *impl_;
  const auto update = [](double* average, double seconds) {
    *average = *average < 0 ? seconds : 0.8 * *average + 0.2 * seconds;
  };
  const bool measure = m.serial_s < 0 || m.pooled_s < 0 || ++m.calls % Impl::kRetry == 0;
  bool pooled = matchers.size() > 1 && (m.pooled_s < 0 || m.pooled_s < m.serial_s);
  if (measure && matchers.size() > 1 && m.serial_s >= 0 && m.pooled_s >= 0) pooled = !pooled;  // the other way
  const auto start = std::chrono::steady_clock::now();
  const auto per_row = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
           static_cast<double>(matchers.size());
  };
  if (!pooled) {
    for (size_t i : rows) states[i]->FillAllowed(masks[i]);
    if (!matchers.empty()) update(&m.serial_s, per_row());
    return;
  }
  const int64_t n = static_cast<int64_t>(matchers.size()), words = impl_->words;
  impl_->scratch.resize(static_cast<size_t>(n * words));
  int64_t shape[2] = {n, words};
  DLTensor t{};
  t.data = impl_->scratch.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 2;
  t.dtype = xgrammar::GetBitmaskDLType();
  t.shape = shape;
  try {
    impl_->batch.BatchFillNextTokenBitmask(&matchers, &t);
  } catch (const std::exception&) {  // one row failed: each on its own, so that only that one is marked broken
    for (size_t i : rows) states[i]->FillAllowed(masks[i]);
    return;
  }
  for (int64_t r = 0; r < n; ++r) {
    std::copy_n(impl_->scratch.data() + r * words, words, masks[rows[r]].data());
  }
  update(&m.pooled_s, per_row());
}

}  // namespace inferd

// Structured output: a request's constraint on its tokens (a JSON schema, any JSON object, a regular expression,
// an EBNF grammar, one of a list of strings), compiled once by xgrammar's C++ core against the model's vocabulary
// and walked token by token as the request generates. The engine asks each constrained sequence which tokens may
// come next (a bitmask over the vocabulary) before sampling it, and tells it every token it took.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"

namespace inferd {

// A constraint as an API gives it.
struct OutputConstraint {
  enum class Kind { kNone, kJsonObject, kJsonSchema, kRegex, kGrammar, kChoice, kToolCall };
  Kind kind = Kind::kNone;
  // kJsonSchema and kToolCall: the schema (JSON); kRegex: the pattern; kGrammar: EBNF
  std::string text;
  std::vector<std::string> choices;  // kChoice: the output is exactly one of these
  // Where the API put it, for errors ("response_format.json_schema.schema").
  std::string field;
  std::string prefix, suffix;  // kToolCall: the output is prefix, JSON that `text` admits, then suffix
  // A model that thinks in <think>…</think> (engine/chat/reasoning.h) reasons freely; the constraint holds for the
  // answer after </think> and the blank lines that follow it. kMayOpen: the output may begin with <think> (else it
  // is all answer); kOpened: the prompt opened the reasoning. kNone: the constraint holds for the whole output.
  enum class Reasoning { kNone, kMayOpen, kOpened };
  Reasoning reasoning = Reasoning::kNone;

  bool active() const { return kind != Kind::kNone; }
};

// The compiled form, shared by every request with the same constraint (opaque outside this library).
class CompiledConstraint;

// The deepest a JSON schema may nest (objects and arrays), as deep as a request body may (server/http/bounded_json.h).
constexpr int kMaxSchemaDepth = 32;

struct ConstraintLimits {
  int64_t max_bytes = 64 << 10;              // of a schema, pattern, grammar or the choices together
  int64_t cache_bytes = int64_t{256} << 20;  // compiled grammars kept for reuse
  bool in_reasoning = false;                 // OutputConstraint::reasoning is ignored: the whole output is constrained
  int64_t compile_timeout_ms = 10000;        // a compilation that takes longer is refused
  int max_overdue = 2;                       // compilations past the limit still running: beyond, Unavailable
};

// Compiles constraints for one model. Thread-safe: request threads compile, never the engine's.
class ConstraintCompiler {
 public:
  // vocab_size: the model's logits width (may exceed the tokenizer's); stop_ids: the tokens that end a request,
  // the only ones allowed once the constraint is complete.
  static absl::StatusOr<std::unique_ptr<ConstraintCompiler>> Create(const Tokenizer& tokenizer, int32_t vocab_size,
                                                                    std::vector<int32_t> stop_ids,
                                                                    ConstraintLimits limits);
  ~ConstraintCompiler();

  // An invalid or oversized constraint is InvalidArgument naming its field and a short prefix of the problem, and so
  // is one whose compilation takes longer than limits.compile_timeout_ms (it goes on, on a thread of its own, and
  // with limits.max_overdue of those still running, a request to compile is Unavailable; the compiler's destructor
  // waits for them).
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> Compile(const OutputConstraint& constraint) const;

 private:
  struct Impl;
  explicit ConstraintCompiler(std::unique_ptr<Impl> impl);
  static absl::StatusOr<std::shared_ptr<const CompiledConstraint>> CompileWith(const Impl& impl,
                                                                               const OutputConstraint& c);
  std::shared_ptr<Impl> impl_;  // shared with compilations past their time limit
};

// One sequence's place in its constraint.
class ConstraintState {
 public:
  friend class ConstraintBatch;
  explicit ConstraintState(std::shared_ptr<const CompiledConstraint> compiled);
  ~ConstraintState();
  ConstraintState(ConstraintState&&) noexcept;

  // Words of the bitmask over a vocabulary of vocab_size tokens: bit t % 32 of word t / 32 allows token t.
  static int32_t MaskWords(int32_t vocab_size);
  // The tokens allowed next into mask (MaskWords words).
  void FillAllowed(std::span<uint32_t> mask);
  // Moves past a sampled token; false when the constraint does not allow it, or xgrammar failed (the sequence
  // then ends with an error).
  bool Accept(int32_t token);
  // Undoes the last `tokens` accepted tokens (a step taken back: speculative decoding's rejected drafts), so that
  // the state is as it was before them. False, changing nothing, when fewer were accepted since the start.
  bool Rollback(int32_t tokens);
  // The constraint is complete and has taken a stop token: nothing may follow.
  bool Terminated() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Fills the masks of a step's constrained sequences: one after another, or all at once on xgrammar's thread pool
// (its BatchGrammarMatcher), whichever has measured faster per row lately (a cheap mask costs less than handing it
// to the pool; an expensive one gains from the threads). The rows are independent.
class ConstraintBatch {
 public:
  explicit ConstraintBatch(int32_t vocab_size);
  ~ConstraintBatch();
  // masks[i] (MaskWords words) gets states[i]'s allowed tokens, as states[i]->FillAllowed would.
  void FillAllowed(std::span<ConstraintState* const> states, std::span<const std::span<uint32_t>> masks);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferd

// What the request fuzzers convert against, loaded once: the llama3-tiny fixture's tokenizer (and a constraint
// compiler over its vocabulary) and the chat templates of tests/fixtures/chat/renders.json (real models' templates
// and ones that exercise the Jinja subset).
#pragma once

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/chat/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/request_builder.h"

namespace inferd::fuzz {

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  if (!f) __builtin_trap();  // a missing fixture is a broken build, not a finding
  return ss.str();
}

struct Fixtures {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ConstraintCompiler> constraints;  // hostile schemas, patterns and grammars are compiled too
  std::vector<std::unique_ptr<ChatTemplate>> templates;
  std::vector<std::string> template_names;  // as renders.json names them
  ModelLimits limits(size_t template_index) const {
    return {.tokenizer = tokenizer.get(),
            .vocab_size = 256,
            .max_model_len = 4096,
            .chat_template = templates[template_index % templates.size()].get(),
            .constraints = constraints.get()};
  }
};

inline const Fixtures& GetFixtures() {
  static const Fixtures* fixtures = [] {
    auto* f = new Fixtures;
    auto tokenizer =
        Tokenizer::FromJson(ReadFile(INFERD_SOURCE_DIR "/tests/fixtures/models/llama3-tiny/tokenizer.json"));
    if (!tokenizer.ok()) __builtin_trap();
    f->tokenizer = *std::move(tokenizer);
    auto constraints = ConstraintCompiler::Create(*f->tokenizer, f->tokenizer->vocab_size(), {0}, {.max_bytes = 4096});
    if (!constraints.ok()) __builtin_trap();
    f->constraints = *std::move(constraints);
    const auto renders = nlohmann::json::parse(ReadFile(INFERD_SOURCE_DIR "/tests/fixtures/chat/renders.json"));
    for (const auto& t : renders["templates"]) {
      auto compiled = ChatTemplate::Compile(t["template"].get<std::string>(), t["bos_token"].get<std::string>(),
                                            t["eos_token"].get<std::string>());
      if (!compiled.ok()) __builtin_trap();
      f->templates.push_back(*std::move(compiled));
      f->template_names.push_back(t["name"].get<std::string>());
    }
    return f;
  }();
  return *fixtures;
}

}  // namespace inferd::fuzz

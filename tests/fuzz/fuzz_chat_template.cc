// libFuzzer target: hostile chat messages (any roles, any bytes: invalid UTF-8, template syntax, NULs, very many
// or very long messages) rendered by every fixture chat template: rendered or refused, never a crash, and text in a
// message is never run as template code.
#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "tests/fuzz/fuzz_fixtures.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const inferd::fuzz::Fixtures& fixtures = inferd::fuzz::GetFixtures();
  // Messages are separated by 0xFF bytes; each message's first byte picks its role.
  static const char* kRoles[] = {"system", "user", "assistant", "tool", "", "user\n"};
  std::vector<inferd::ChatMessage> messages;
  size_t start = 1;
  for (size_t i = 1; i <= size; ++i) {
    if (i < size && data[i] != 0xFF) continue;
    if (i > start) {
      const std::string piece(reinterpret_cast<const char*>(data) + start + 1, i - start - 1);
      messages.push_back({kRoles[data[start] % std::size(kRoles)], piece});
    }
    start = i + 1;
  }
  const size_t t = data[0] % fixtures.templates.size();
  auto rendered = fixtures.templates[t]->Render(messages, /*add_generation_prompt=*/data[0] & 0x80);
  // The real models' templates put a user's text in the prompt as sent (trimmed at most): none of it was evaluated.
  static const std::set<std::string> kVerbatim = {"llama2-tiny", "llama3-tiny", "mistral-tiny", "qwen2-tiny",
                                                  "smollm2"};
  if (!rendered.ok() || !kVerbatim.count(fixtures.template_names[t])) return 0;
  for (const auto& m : messages) {
    const bool plain = !m.content.empty() && m.content.size() < 64 &&
                       std::all_of(m.content.begin(), m.content.end(), [](char c) { return c > ' ' && c < 127; });
    if (m.role == "user" && plain && !absl::StrContains(*rendered, m.content)) __builtin_trap();
  }
  return 0;
}

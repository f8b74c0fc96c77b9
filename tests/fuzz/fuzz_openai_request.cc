// libFuzzer target: any bytes as the body of /v1/chat/completions or /v1/completions are parsed into requests or
// refused with INVALID_ARGUMENT, and every parsed prompt is built into an engine request (rendered with a chat
// template, tokenized, checked) or refused; never a crash, and an error message quotes at most a short prefix.
#include <cstdint>
#include <string_view>

#include "server/http/openai_request.h"
#include "tests/fuzz/fuzz_fixtures.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const inferd::fuzz::Fixtures& fixtures = inferd::fuzz::GetFixtures();
  // The first byte picks the route and the chat template; the rest is the body.
  const auto route = (data[0] & 1) ? inferd::OpenAiRoute::kChat : inferd::OpenAiRoute::kCompletion;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto request = inferd::ParseOpenAiRequest(body, route);
  if (!request.ok()) {
    if (request.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    if (request.status().message().size() > 1024) __builtin_trap();  // a value echoed whole
    return 0;
  }
  for (const auto& prompt : request->prompts) {
    auto built = inferd::BuildRequest(prompt, fixtures.limits(data[0] >> 1));
    if (!built.ok() && built.status().message().size() > 1024) __builtin_trap();
  }
  return 0;
}

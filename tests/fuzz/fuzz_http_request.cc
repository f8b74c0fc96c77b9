// libFuzzer target: any bytes arriving on the HTTP port go through what the server runs on them before a handler:
// Beast's request parser (head and body limits as served), RFC 9112's head checks (framing, Host, Expect, target),
// then for the generate routes the OpenAI request parser and the build of every prompt into an engine request.
// Parsed or refused, never a crash, and a refusal is a 4xx or 5xx the server can answer.
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "server/http/openai_request.h"
#include "server/http/request_head.h"
#include "tests/fuzz/fuzz_fixtures.h"

namespace http = boost::beast::http;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const inferd::fuzz::Fixtures& fixtures = inferd::fuzz::GetFixtures();
  http::request_parser<http::string_body> parser;
  parser.eager(true);
  parser.header_limit(16 << 10);
  parser.body_limit(1 << 20);
  boost::beast::error_code ec;
  size_t used = 0;
  bool checked = false;
  while (used < size && !parser.is_done()) {
    used += parser.put(boost::asio::buffer(data + used, size - used), ec);
    if (ec == http::error::need_more) break;
    if (ec) return 0;  // malformed: the server answers 400 and closes
    if (parser.is_header_done() && !checked) {
      checked = true;
      const auto& head = parser.get();
      std::vector<std::pair<std::string_view, std::string_view>> fields;
      for (const auto& field : head) fields.emplace_back(field.name_string(), field.value());
      const inferd::RequestHeadCheck check =
          inferd::CheckRequestHead(head.method_string(), head.target(), head.version(), fields);
      if (check.status != 0) {
        if (check.status < 400 || check.status > 599 || check.message.empty()) __builtin_trap();
        return 0;
      }
      if (check.target.empty() || check.target[0] != '/') __builtin_trap();
    }
  }
  if (!parser.is_done()) {
    if (!parser.got_some()) return 0;
    parser.put_eof(ec);
    if (ec || !parser.is_done()) return 0;
  }
  const auto& req = parser.get();
  const std::string_view target = req.target();
  const bool chat = target.find("chat") != std::string_view::npos;
  auto request =
      inferd::ParseOpenAiRequest(req.body(), chat ? inferd::OpenAiRoute::kChat : inferd::OpenAiRoute::kCompletion);
  if (!request.ok()) return 0;
  for (const auto& prompt : request->prompts) (void)inferd::BuildRequest(prompt, fixtures.limits(size));
  return 0;
}

// What RFC 9112 asks of a request head before its body is read, apart from the byte-level syntax that Beast's parser
// checks: the framing (Transfer-Encoding and Content-Length, never both; no coding but chunked), exactly one Host in
// HTTP/1.1, no repeated field that must be single (Authorization, Content-Type, …), Expect, and the request target
// (origin form, or absolute form rewritten to it). Pure: the server and the fuzzer run the same checks.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace inferd {

struct RequestHeadCheck {
  int status = 0;                // 0: acceptable; else the status to answer with, and the connection closes
  std::string message;           // why, when refused
  std::string target;            // the origin-form target: "/path?query"
  bool expect_continue = false;  // "Expect: 100-continue": answer 100 before reading the body
};

// `fields`: every field line as received, names in any case. `version`: 11 for HTTP/1.1, 10 for HTTP/1.0.
RequestHeadCheck CheckRequestHead(std::string_view method, std::string_view target, int version,
                                  const std::vector<std::pair<std::string_view, std::string_view>>& fields);

}  // namespace inferd

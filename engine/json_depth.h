// How deep a JSON text nests its objects and arrays, counted before anything parses it: JSON that reaches inferd
// as text inside other text (a tool's schema or a call's arguments sent over gRPC, a model's own output) passes no
// request body's depth bound, and what is built from it (nlohmann's dump, the chat template's values, xgrammar's
// compiler) recurses once per level.
#pragma once

#include <algorithm>
#include <string_view>

namespace inferd {

// Brackets inside strings are not counted; text that is not JSON is counted all the same.
inline int JsonDepth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

// The deepest JSON text built into values here: as deep as a request body may nest (server/http/bounded_json.h).
constexpr int kMaxJsonTextDepth = 32;

}  // namespace inferd

// Tokenizer cost on pathological inputs: per-character time of Encode across 1 KB … 1 MB for one long word,
// a whitespace run, emoji, CJK and ordinary prose. Encoding must stay near-linear in the input.
//   bench_tokenizer [TOKENIZER_JSON]   (default: the llama3-tiny fixture's tokenizer.json)
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  const std::string path =
      argc > 1 ? argv[1] : std::string(INFERD_SOURCE_DIR) + "/tests/fixtures/models/llama3-tiny/tokenizer.json";
  auto tok = inferd::Tokenizer::FromFile(path);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }
  struct Shape {
    const char* name;
    std::string unit;
  };
  const std::vector<Shape> shapes = {{"one long word", "a"},
                                     {"whitespace run", " "},
                                     {"emoji", "\xF0\x9F\x98\x80"},
                                     {"CJK", "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E"},
                                     {"prose", "the model serves requests over a paged cache. "}};
  std::printf("%-16s %10s %12s %14s %10s\n", "shape", "bytes", "ms", "ns/byte", "tokens");
  for (const Shape& s : shapes) {
    for (size_t bytes : {size_t{1} << 10, size_t{1} << 14, size_t{1} << 17, size_t{1} << 20}) {
      std::string text;
      while (text.size() + s.unit.size() <= bytes) text += s.unit;
      const auto t0 = std::chrono::steady_clock::now();
      const std::vector<int32_t> ids = (*tok)->Encode(text, false);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::printf("%-16s %10zu %12.2f %14.1f %10zu\n", s.name, text.size(), ms, ms * 1e6 / text.size(), ids.size());
    }
  }
  return 0;
}

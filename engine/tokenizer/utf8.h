// UTF-8 helpers shared by the tokenizer, the incremental detokenizer and request validation.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace inferd {

bool IsValidUtf8(std::string_view s);
// Appends the UTF-8 encoding of a code point.
void AppendUtf8(uint32_t cp, std::string* out);
// Splits valid UTF-8 into its characters.
std::vector<std::string_view> Utf8Chars(std::string_view s);

// Converts bytes to valid UTF-8, replacing each maximal invalid subpart with U+FFFD (as Python's
// errors="replace" and Rust's from_utf8_lossy do). When `final` is false, a trailing incomplete but
// still possible character is not converted: *consumed tells how many bytes were.
std::string Utf8Lossy(std::string_view bytes, bool final, size_t* consumed = nullptr);

}  // namespace inferd

#include "engine/tokenizer/utf8.h"

namespace inferd {
namespace {

// Length of the valid character starting at s[i] (1..4), 0 if invalid, -1 if valid so far but cut off.
int CharLength(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  if (c < 0x80) return 1;
  int len;
  uint8_t lo = 0x80, hi = 0xbf;  // allowed range of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  for (int k = 1; k < len; ++k) {
    if (i + k >= s.size()) return -1;
    const uint8_t x = b(i + k);
    if (k == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xbf)) return 0;
  }
  return len;
}

// Bytes of the maximal prefix of a possible character at s[i] (for the replacement of one subpart).
size_t InvalidSpan(std::string_view s, size_t i) {
  size_t n = 1;
  while (i + n < s.size() && n < 4) {
    std::string_view probe = s.substr(i, n + 1);
    // Extend while the prefix could still begin a valid character.
    if (CharLength(probe, 0) != -1) break;
    ++n;
  }
  return n;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const int n = CharLength(s, i);
    if (n <= 0) return false;
    i += n;
  }
  return true;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

std::vector<std::string_view> Utf8Chars(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    int n = CharLength(s, i);
    if (n <= 0) n = 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

std::string Utf8Lossy(std::string_view s, bool final, size_t* consumed) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const int n = CharLength(s, i);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else if (n == -1 && !final) {
      break;  // hold back: more bytes may complete this character
    } else {
      out.append("\xef\xbf\xbd");
      i += n == -1 ? s.size() - i : InvalidSpan(s, i);
    }
  }
  if (consumed) *consumed = i;
  return out;
}

}  // namespace inferd

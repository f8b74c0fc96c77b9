#include "engine/tokenizer/utf8.h"

#include <gtest/gtest.h>

namespace inferd {
namespace {

TEST(Utf8, Validity) {
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("日本 😀 é"));
  EXPECT_FALSE(IsValidUtf8("\xff"));
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xe6\x97"));          // cut off
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // past U+10FFFF
}

TEST(Utf8, LossyHoldsBackAnIncompleteTail) {
  const std::string smile = "\xf0\x9f\x98\x80";
  size_t consumed = 0;
  EXPECT_EQ(Utf8Lossy("ab" + smile.substr(0, 2), false, &consumed), "ab");
  EXPECT_EQ(consumed, 2u);
  EXPECT_EQ(Utf8Lossy("ab" + smile, false, &consumed), "ab" + smile);
  EXPECT_EQ(consumed, 6u);
  EXPECT_EQ(Utf8Lossy("ab" + smile.substr(0, 2), true), "ab\xef\xbf\xbd");
}

TEST(Utf8, LossyReplacesMaximalSubparts) {
  // As Python's bytes.decode(errors="replace"): one U+FFFD per maximal invalid subpart.
  EXPECT_EQ(Utf8Lossy("a\xe2\x82z", true), "a\xef\xbf\xbdz");
  EXPECT_EQ(Utf8Lossy("\x80\x80", true), "\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(Utf8Lossy("\xe0\x80", true), "\xef\xbf\xbd\xef\xbf\xbd");
}

}  // namespace
}  // namespace inferd

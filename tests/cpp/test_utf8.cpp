// Error messages quote bytes read from files; valid_utf8 makes them text Python can hold.
#include <gtest/gtest.h>

#include <string>

#include "core/utf8.h"

namespace torch_shards::core {
namespace {

TEST(ValidUtf8, KeepsValidTextUnchanged) {
  const std::string text = "plain ascii, caf\xc3\xa9, \xe2\x82\xac, \xf0\x9f\x98\x80";
  EXPECT_EQ(valid_utf8(text), text);
  EXPECT_EQ(valid_utf8(""), "");
}

TEST(ValidUtf8, EscapesEveryInvalidByte) {
  EXPECT_EQ(valid_utf8(std::string("a\xff"
                                   "b")),
            "a\\xffb");
  EXPECT_EQ(valid_utf8(std::string("\xc3")), "\\xc3");                             // truncated sequence
  EXPECT_EQ(valid_utf8(std::string("\xc3(")), "\\xc3(");                           // bad continuation
  EXPECT_EQ(valid_utf8(std::string("\xc0\xaf")), "\\xc0\\xaf");                    // overlong
  EXPECT_EQ(valid_utf8(std::string("\xed\xa0\x80")), "\\xed\\xa0\\x80");           // surrogate
  EXPECT_EQ(valid_utf8(std::string("\xf4\x90\x80\x80")), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  EXPECT_EQ(valid_utf8(std::string("\x80", 1)), "\\x80");
  EXPECT_EQ(valid_utf8(std::string("x\0y", 3)), std::string("x\0y", 3));  // NUL is valid UTF-8
}

}  // namespace
}  // namespace torch_shards::core

// Exceptions thrown by the core. The torch glue turns InvalidArgument into a
// Python ValueError and every other std::exception into a RuntimeError, with
// the message unchanged.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace torch_shards::core {

class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Any failure reading data: names the file and the path inside it.
class ReadError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A file or directory that does not exist. Its message is Python's
// FileNotFoundError text, which the Python door turns back into that type.
class FileNotFound : public ReadError {
 public:
  explicit FileNotFound(const std::string& path)
      : ReadError("[Errno 2] No such file or directory: '" + path + "'"), path_(path) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The text with every byte that is not part of valid UTF-8 written as \xNN:
// messages quote bytes read from files, and must still become Python strs.
inline std::string valid_utf8(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  for (size_t i = 0; i < text.size();) {
    const unsigned char lead = byte(i);
    size_t length = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 0;
    bool valid = length != 0 && i + length <= text.size() && !(length == 2 && lead < 0xC2);
    for (size_t k = 1; valid && k < length; ++k) valid = (byte(i + k) & 0xC0) == 0x80;
    if (valid && length == 3) {  // no overlong forms, no surrogates
      const unsigned char second = byte(i + 1);
      valid = !(lead == 0xE0 && second < 0xA0) && !(lead == 0xED && second >= 0xA0);
    }
    if (valid && length == 4) {  // no overlong forms, nothing above U+10FFFF
      const unsigned char second = byte(i + 1);
      valid = !(lead == 0xF0 && second < 0x90) && !(lead == 0xF4 && second >= 0x90) && lead <= 0xF4;
    }
    if (valid) {
      out.append(text, i, length);
      i += length;
    } else {
      static const char* const kHex = "0123456789abcdef";
      out += "\\x";
      out += kHex[lead >> 4];
      out += kHex[lead & 0xF];
      i += 1;
    }
  }
  return out;
}

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

template <typename... Parts>
void check_argument(bool condition, const Parts&... parts) {
  if (!condition) throw InvalidArgument(concat(parts...));
}

}  // namespace torch_shards::core

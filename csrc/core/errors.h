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

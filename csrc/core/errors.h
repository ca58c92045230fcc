// Exceptions thrown by the core. The torch glue turns InvalidArgument,
// MetadataError and Unsupported into a Python ValueError and every other std::exception into
// a RuntimeError, with the message unchanged (bytes that are not UTF-8
// escaped).
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

// Metadata that is not what its format says (unparseable JSON, text that is
// not UTF-8): a ReadError that Python sees as ValueError, as zarr-python's
// json.JSONDecodeError is one.
class MetadataError : public ReadError {
 public:
  using ReadError::ReadError;
};

// What torch_shards does not read (a codec, filter, dtype or encoding it
// does not know, or data of a kind it reads otherwise): a ReadError that
// Python sees as ValueError, as the README promises, rather than damage.
class Unsupported : public ReadError {
 public:
  using ReadError::ReadError;
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

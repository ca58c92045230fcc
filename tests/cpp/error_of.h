// The message a test's call raised, for tests of error texts: the c10::Error
// (or other `Error`) message without its backtrace, or what went otherwise.
#pragma once

#include <exception>
#include <string>

namespace torch_shards::testing_support {

template <typename Error, typename F>
std::string error_of(F&& make) {
  try {
    make();
  } catch (const Error& error) {
    return error.msg();
  } catch (const std::exception& error) {
    return std::string("unexpected exception type: ") + error.what();
  }
  return "no exception";
}

}  // namespace torch_shards::testing_support

// Text read from files, made safe for error messages and for callers that
// need UTF-8 (JSON, Python str): every exception message torch_shards builds
// must be valid UTF-8, or Python fails to decode it instead of raising it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/utf8.h"

namespace torch_shards::io {

// Whether `text` is well-formed UTF-8 (core/utf8.h).
using core::is_valid_utf8;
// `text` for a message: bytes that are not valid UTF-8, and control
// characters, escaped as \xNN; cut to `limit` bytes with "..." (0: no limit).
std::string printable(std::string_view text, size_t limit = 200);
// A JSON value as compact text for a message: invalid UTF-8 in its strings
// escaped, cut to `limit` bytes.
std::string json_text(const nlohmann::json& value, size_t limit = 200);

}  // namespace torch_shards::io

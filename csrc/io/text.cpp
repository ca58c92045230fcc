#include "io/text.h"

namespace torch_shards::io {

std::string printable(std::string_view text, size_t limit) {
  return core::valid_utf8(text, /*escape_controls=*/true, limit);
}

std::string json_text(const nlohmann::json& value, size_t limit) {
  // dump() throws on invalid UTF-8 unless told to replace it; the
  // replacement characters then say where the bad bytes were.
  return printable(value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), limit);
}

}  // namespace torch_shards::io

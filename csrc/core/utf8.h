// UTF-8 well-formedness, the one definition: text read from files reaches
// JSON, error messages and Python str, which all need valid UTF-8.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace torch_shards::core {

// Length of the well-formed UTF-8 sequence starting at text[i] (1 to 4), or 0
// (no overlong forms, surrogates or code points above U+10FFFF).
size_t utf8_sequence(std::string_view text, size_t i);

// Whether `text` is well-formed UTF-8.
bool is_valid_utf8(std::string_view text);

// `text` with every byte that is not part of well-formed UTF-8 (and, with
// escape_controls, every control character) written as \xNN, cut to `limit`
// bytes with "..." (0: no limit): messages quote bytes read from files, and
// must still become Python strs.
std::string valid_utf8(std::string_view text, bool escape_controls = false, size_t limit = 0);

}  // namespace torch_shards::core

#include "io/zarr/json.h"

#include <cmath>
#include <cstring>

#include "io/file.h"
#include "io/storage/url.h"

namespace torch_shards::io::zarr {

using core::concat;

namespace {

// Python's json module (which zarr-python 2 used) writes bare NaN, Infinity
// and -Infinity; nlohmann rejects them. They are swapped for marker strings,
// parsed, and turned back into numbers.
const char kNanMarker[] = "\x01NaN";
const char kInfMarker[] = "\x01Infinity";
const char kNegInfMarker[] = "\x01-Infinity";

std::string quote_nonfinite_tokens(const std::string& text) {
  std::string out;
  out.reserve(text.size() + 16);
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) {
        out += text[++i];
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      out += c;
      continue;
    }
    const auto token = [&](const char* word, const char* marker) {
      const size_t n = std::strlen(word);
      if (text.compare(i, n, word) != 0) return false;
      out += json(marker).dump();
      i += n - 1;
      return true;
    };
    if (token("-Infinity", kNegInfMarker) || token("Infinity", kInfMarker) || token("NaN", kNanMarker)) continue;
    out += c;
  }
  return out;
}

void restore_nonfinite(json& value) {
  if (value.is_string()) {
    const std::string text = value.get<std::string>();
    if (text == kNanMarker) value = std::numeric_limits<double>::quiet_NaN();
    if (text == kInfMarker) value = std::numeric_limits<double>::infinity();
    if (text == kNegInfMarker) value = -std::numeric_limits<double>::infinity();
  } else if (value.is_structured()) {
    for (auto& item : value) restore_nonfinite(item);
  }
}

// The inverse of restore_nonfinite: NaN and infinities as marker strings, which JSON can hold.
void hide_nonfinite(json& value) {
  if (value.is_number_float()) {
    const double number = value.get<double>();
    if (std::isnan(number)) value = kNanMarker;
    if (std::isinf(number)) value = number > 0 ? kInfMarker : kNegInfMarker;
  } else if (value.is_structured()) {
    for (auto& item : value) hide_nonfinite(item);
  }
}

}  // namespace

std::string node_directory(const std::string& store, const std::string& path) {
  return path == "/" ? store : store + path;
}

std::string format_coords(const std::vector<int64_t>& coords) {
  std::string text = "(";
  for (size_t i = 0; i < coords.size(); ++i) text += (i ? ", " : "") + std::to_string(coords[i]);
  return text + (coords.size() == 1 ? ",)" : ")");
}

json parse_json(const std::string& text) {
  json value;
  try {
    value = json::parse(text);
  } catch (const json::parse_error&) {
    value = json::parse(quote_nonfinite_tokens(text));  // rethrows the error if still invalid
  }
  restore_nonfinite(value);  // (markers also come from dump_json)
  return value;
}

std::string dump_json(json value) {
  hide_nonfinite(value);
  return value.dump();
}

std::optional<json> read_json_file(const std::string& dir, const std::string& name, const std::string& where) {
  const std::optional<std::vector<uint8_t>> read = read_whole_file_if_exists(dir + "/" + name);
  if (!read) return std::nullopt;
  const std::vector<uint8_t>& bytes = *read;
  json value;
  try {
    value = parse_json(std::string(bytes.begin(), bytes.end()));
  } catch (const json::exception& error) {
    throw core::MetadataError(concat(where, ": invalid JSON in ", name, ": ", printable(error.what())));
  }
  if (!value.is_object()) throw core::MetadataError(concat(where, ": ", name, " is not a JSON object"));
  return value;
}

bool has_metadata_file(const std::string& dir, const std::string& name) {
  const std::string file = dir + "/" + name;
  // Behind a URL: one GET of the (small) file, kept a few seconds for the read that follows.
  return storage::is_url(file) ? read_whole_file_if_exists(file).has_value() : file_exists(file);
}

std::string node_type_of(const std::string& dir) {
  // A zarr.json that cannot be read raises (behind a URL, a request that failed after its retries names
  // the URL): it says nothing of what the node is.
  const std::optional<std::vector<uint8_t>> read = read_whole_file_if_exists(dir + "/zarr.json");
  if (!read) return "";
  const std::vector<uint8_t>& bytes = *read;
  try {
    const json value = parse_json(std::string(bytes.begin(), bytes.end()));
    if (value.is_object() && value.contains("node_type") && value["node_type"].is_string()) {
      return value["node_type"].get<std::string>();
    }
  } catch (const json::exception&) {
    // A zarr.json that is not JSON is no node; opening it reports why.
  }
  return "";
}

}  // namespace torch_shards::io::zarr

#include "io/storage/url.h"

#include "core/errors.h"

namespace torch_shards::io::storage {

namespace {

bool starts_with(const std::string& text, const char* prefix) { return text.rfind(prefix, 0) == 0; }

}  // namespace

bool is_url(const std::string& path) {
  return starts_with(path, "s3://") || starts_with(path, "http://") || starts_with(path, "https://");
}

Url parse_url(const std::string& given) {
  Url url;
  url.text = given;
  if (url.text.size() > 1 && url.text.back() == '/') url.text.pop_back();
  const size_t colon = url.text.find("://");
  core::check_argument(colon != std::string::npos && is_url(url.text), given,
                       ": not a URL this library reads (s3://, http:// or https://)");
  url.scheme = url.text.substr(0, colon);
  const std::string rest = url.text.substr(colon + 3);
  core::check_argument(rest.find_first_of("?#") == std::string::npos, given,
                       ": a URL with a query or fragment ('?', '#') cannot name a dataset; give the object's URL");
  const size_t slash = rest.find('/');
  url.host = rest.substr(0, slash);
  url.path = slash == std::string::npos ? "" : rest.substr(slash + 1);
  core::check_argument(!url.host.empty(), given,
                       url.scheme == "s3" ? ": no bucket name (s3://bucket/key)" : ": no host");
  size_t start = 0;
  while (start <= url.path.size() && !url.path.empty()) {
    const size_t end = std::min(url.path.find('/', start), url.path.size());
    const std::string segment = url.path.substr(start, end - start);
    core::check_argument(segment != "." && segment != ".." && (segment.size() > 0 || end == url.path.size()), given,
                         ": a URL with an empty, '.' or '..' path segment is ambiguous; give the object's URL");
    start = end + 1;
  }
  return url;
}

std::string percent_encode(const std::string& text, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (const unsigned char c : text) {
    const bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
                            c == '.' || c == '_' || c == '~' || (keep_slash && c == '/');
    if (unreserved) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

}  // namespace torch_shards::io::storage

// URLs where the sources take paths: s3://bucket/key, http://host/path and
// https://host/path. Parsed once, joined as the zarr reader joins paths
// ("<store>/<key>"), and encoded for requests here and nowhere else.
#pragma once

#include <string>

namespace torch_shards::io::storage {

struct Url {
  std::string scheme;  // "s3", "http" or "https"
  std::string host;    // s3: the bucket; http(s): host[:port]
  std::string path;    // s3: the key ("" for the bucket itself); http(s): the path after the host, without '/'
  std::string text;    // the URL as given, one trailing '/' removed
};

// True for a path that is a URL this library reads (s3://, http://, https://).
bool is_url(const std::string& path);

// The parts of a URL; InvalidArgument naming it when it has no host/bucket,
// holds a query or fragment, or a '.'/'..' segment.
Url parse_url(const std::string& text);

// Percent-encodes the bytes of a path or query value that are not
// unreserved (RFC 3986: A-Z a-z 0-9 - . _ ~), keeping '/' when keep_slash.
std::string percent_encode(const std::string& text, bool keep_slash);

}  // namespace torch_shards::io::storage

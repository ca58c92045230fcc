// HTTP(S) requests through libcurl's multi interface: every request of one
// call in flight together (up to max_requests), on connections each thread
// keeps open between calls. Transient failures (timeouts, resets, refused
// connections, bodies cut short, 429 and 5xx answers) are retried with
// exponential backoff and jitter, a bounded number of times; every other
// answer is handed back as it came for the caller to judge. S3 requests are
// signed by libcurl (AWS Signature V4); nothing here signs by hand.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace torch_shards::io::storage {

struct ClientSettings {
  int max_requests = 64;          // in flight at once per call
  double timeout_s = 60;          // one attempt, from connecting to the last byte
  double connect_timeout_s = 10;  // one attempt's connection
  int retries = 6;                // further attempts after a transient failure
  double backoff_s = 0.05;        // before the first retry; doubled each time (with jitter), capped at 5 s
};

// How requests are signed: empty sigv4 = sent unsigned.
struct Signing {
  std::string sigv4;          // "aws:amz:<region>:s3"
  std::string user_password;  // "<access key id>:<secret access key>"
  std::string session_token;  // sent as x-amz-security-token when set
};

struct HttpRequest {
  std::string url;  // encoded, ready to send
  bool head = false;
  int64_t offset = -1;     // a range request for [offset, offset + size) when >= 0
  int64_t size = 0;        //
  uint8_t* out = nullptr;  // a range's bytes go straight here (exactly size); null: into body
  // Else, when set, a range's bytes are handed here as they arrive (`at`: their position in the
  // range), e.g. written to a file; false aborts the request with errno's reason.
  std::function<bool(int64_t at, const uint8_t* data, size_t size)> sink;
  std::vector<std::string> headers;  // "Name: value", e.g. If-Match
  std::string method;                // "" = GET (HEAD when head); else sent as is ("PUT", "POST")
  std::string body;                  // sent as the request's body (with method "POST" or "PUT")
};

struct HttpResponse {
  long status = 0;            // 0: no answer (error says why)
  std::vector<uint8_t> body;  // when the request had no out or sink (and error answers' text, up to 64 KiB)
  int64_t received = 0;       // body bytes of the answer, wherever they went
  std::string etag;           // as sent, quotes included
  int64_t total_size = -1;    // the object's size: Content-Range's total, or a whole answer's length
  std::string error;          // why there was no usable answer after every attempt
  int attempts = 0;
};

// The signing of the next requests, asked once per perform(): credentials that expire are fetched
// again behind it (object_store.cpp).
using SigningSource = std::function<Signing()>;

class HttpClient {
 public:
  HttpClient(ClientSettings settings, Signing signing);
  HttpClient(ClientSettings settings, SigningSource signing);
  const ClientSettings& settings() const { return settings_; }
  // Performs every request, at most settings().max_requests at once, and
  // fills responses (one per request, same order). Throws nothing for
  // answers: the caller judges each status.
  void perform(const std::vector<HttpRequest>& requests, std::vector<HttpResponse>& responses) const;
  HttpResponse perform(const HttpRequest& request) const;

 private:
  ClientSettings settings_;
  SigningSource signing_;
};

// "s3 error NoSuchKey: The specified key does not exist." from an S3 XML
// error body, or the start of a text body, or "".
std::string describe_error_body(const std::vector<uint8_t>& body);

}  // namespace torch_shards::io::storage

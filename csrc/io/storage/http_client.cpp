#include "io/storage/http_client.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

#include "core/errors.h"
#include "io/file.h"
#include "io/storage/connection_sockets.h"
#include "io/storage/curl_library.h"
#include "io/storage/xml_text.h"

namespace torch_shards::io::storage {

using core::concat;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kMaxErrorBody = 64 << 10;
constexpr double kMaxBackoff = 5.0;
constexpr int64_t kLargeBody = int64_t{1} << 20;  // bytes of a body received with kLargeBuffer
constexpr long kLargeBuffer = 512L << 10;

// One thread's curl handles: a multi handle (its connection cache serves
// every call of the thread) and easy handles reused across requests. A
// process forked from one that used them starts its own: the inherited
// handles share their sockets with the parent, so they are abandoned, never
// used or cleaned up (the child closed its copies of those sockets at the
// fork: connection_sockets.h).
struct Handles {
  int pid = 0;
  CURLM* multi = nullptr;
  std::vector<CURL*> idle;

  ~Handles() {
    if (pid != current_process_id()) return;  // inherited (or never made)
    for (CURL* easy : idle) curl().easy_cleanup(easy);
    if (multi != nullptr) curl().multi_cleanup(multi);
  }
  void refresh() {
    if (pid == current_process_id()) return;
    multi = nullptr;
    idle.clear();
    pid = current_process_id();
    multi = curl().multi_init();
    if (multi == nullptr) throw core::ReadError("libcurl: curl_multi_init failed");
  }
  CURL* take() {
    if (!idle.empty()) {
      CURL* easy = idle.back();
      idle.pop_back();
      curl().easy_reset(easy);  // keeps its connection
      return easy;
    }
    CURL* easy = curl().easy_init();
    if (easy == nullptr) throw core::ReadError("libcurl: curl_easy_init failed");
    return easy;
  }
};

Handles& thread_handles() {
  thread_local Handles handles;
  handles.refresh();
  return handles;
}

struct Transfer {
  const HttpRequest* request = nullptr;
  HttpResponse* response = nullptr;
  curl_slist* headers = nullptr;
  CURL* easy = nullptr;
  Clock::time_point ready;  // not before (a retry's backoff)
  bool done = false;
  bool overflow = false;  // the answer had more bytes than the range asked for
  int sink_error = 0;     // errno of the sink that refused bytes (0: none)
  int socket_error = 0;   // errno of a socket that could not be made (0: none)
};

// Makes a connection's socket as libcurl does, keeping why it could not be (libcurl says only "Couldn't
// connect to server", and CURLINFO_OS_ERRNO stays unset).
// Recorded, so that a process forked from this one closes its copy (connection_sockets.h).
curl_socket_t open_socket(void* user, curlsocktype /*purpose*/, curl_sockaddr* address) {
  const curl_socket_t fd = open_connection_socket(address->family, address->socktype, address->protocol);
  if (fd == CURL_SOCKET_BAD) static_cast<Transfer*>(user)->socket_error = errno;
  return fd;
}

int close_socket(void* /*user*/, curl_socket_t fd) { return close_connection_socket(fd); }

// What a transfer that could not make a socket for want of file descriptors (EMFILE, ENFILE) adds to its
// error, else "".
std::string out_of_descriptors(const Transfer& transfer) {
  if (transfer.socket_error != EMFILE && transfer.socket_error != ENFILE) return "";
  struct rlimit limit {};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  return concat(" (", std::strerror(transfer.socket_error), ": this process may have ",
                static_cast<long long>(limit.rlim_cur),
                " open files (ulimit -n), and each thread reading URLs keeps up to max_requests connections: "
                "raise the limit, or lower max_requests or num_threads)");
}

bool ok_status(long status) { return status >= 200 && status < 300; }

// Whether a range's bytes go to out or sink (else into the response's body).
bool has_destination(const HttpRequest& request) { return request.out != nullptr || request.sink != nullptr; }

size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto* transfer = static_cast<Transfer*>(user);
  const size_t bytes = size * count;
  HttpResponse& response = *transfer->response;
  long status = 0;
  curl().easy_getinfo(transfer->easy, CURLINFO_RESPONSE_CODE, &status);
  const HttpRequest& request = *transfer->request;
  if (ok_status(status) && has_destination(request)) {
    if (response.received + static_cast<int64_t>(bytes) > request.size) {
      transfer->overflow = true;
      return 0;  // aborts the transfer: the server sent more than the range (ignored Range?)
    }
    if (request.out != nullptr) {
      std::memcpy(request.out + response.received, data, bytes);
    } else if (!request.sink(response.received, reinterpret_cast<const uint8_t*>(data), bytes)) {
      transfer->sink_error = errno != 0 ? errno : EIO;
      return 0;  // aborts the transfer
    }
  } else if (ok_status(status) || response.body.size() < kMaxErrorBody) {
    response.body.insert(response.body.end(), data, data + bytes);
  }
  response.received += static_cast<int64_t>(bytes);
  return bytes;
}

bool header_is(const std::string& line, const char* name) {
  const size_t length = std::strlen(name);
  if (line.size() <= length || line[length] != ':') return false;
  for (size_t i = 0; i < length; ++i) {
    if (std::tolower(static_cast<unsigned char>(line[i])) != name[i]) return false;
  }
  return true;
}

std::string header_value(const std::string& line) {
  size_t start = line.find(':') + 1;
  while (start < line.size() && (line[start] == ' ' || line[start] == '\t')) ++start;
  size_t end = line.size();
  while (end > start && (line[end - 1] == '\r' || line[end - 1] == '\n' || line[end - 1] == ' ')) --end;
  return line.substr(start, end - start);
}

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto* transfer = static_cast<Transfer*>(user);
  const std::string line(data, size * count);
  HttpResponse& response = *transfer->response;
  if (line.rfind("HTTP/", 0) == 0) {  // a new answer (after a 100 Continue or a redirect)
    response.etag.clear();
    response.total_size = -1;
  } else if (header_is(line, "etag")) {
    response.etag = header_value(line);
  } else if (header_is(line, "content-range")) {
    const std::string value = header_value(line);  // bytes a-b/total
    const size_t slash = value.rfind('/');
    if (slash != std::string::npos && value.compare(slash + 1, std::string::npos, "*") != 0) {
      response.total_size = std::strtoll(value.c_str() + slash + 1, nullptr, 10);
    }
  } else if (header_is(line, "content-length") && transfer->request->offset < 0) {
    response.total_size = std::strtoll(header_value(line).c_str(), nullptr, 10);
  }
  return size * count;
}

}  // namespace

HttpClient::HttpClient(ClientSettings settings, Signing signing)
    : HttpClient(settings, SigningSource([signing = std::move(signing)] { return signing; })) {}

HttpClient::HttpClient(ClientSettings settings, SigningSource signing)
    : settings_(settings), signing_(std::move(signing)) {
  core::check_argument(settings_.max_requests >= 1, "max_requests must be at least 1, got ", settings_.max_requests);
  core::check_argument(settings_.timeout_s > 0, "the request timeout must be positive, got ", settings_.timeout_s);
  core::check_argument(settings_.retries >= 0, "retries must be 0 or more, got ", settings_.retries);
}

HttpResponse HttpClient::perform(const HttpRequest& request) const {
  std::vector<HttpResponse> responses;
  perform({request}, responses);
  return std::move(responses[0]);
}

void HttpClient::perform(const std::vector<HttpRequest>& requests, std::vector<HttpResponse>& responses) const {
  const CurlLibrary& lib = curl();
  Handles& handles = thread_handles();
  const Signing signing = signing_();
  responses.assign(requests.size(), HttpResponse{});
  std::vector<Transfer> transfers(requests.size());
  thread_local std::mt19937_64 jitter(std::random_device{}());
  const auto now = Clock::now();
  for (size_t i = 0; i < requests.size(); ++i) {
    transfers[i].request = &requests[i];
    transfers[i].response = &responses[i];
    transfers[i].ready = now;
  }

  const auto start = [&](Transfer& transfer) {
    const HttpRequest& request = *transfer.request;
    HttpResponse& response = *transfer.response;
    ++response.attempts;
    response.status = 0;
    response.body.clear();
    response.received = 0;
    response.etag.clear();
    response.total_size = -1;
    response.error.clear();
    transfer.overflow = false;
    transfer.sink_error = 0;
    transfer.socket_error = 0;
    CURL* easy = transfer.easy = handles.take();
    lib.easy_setopt(easy, CURLOPT_URL, request.url.c_str());
    lib.easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    lib.easy_setopt(easy, CURLOPT_NOBODY, request.head ? 1L : 0L);
    lib.easy_setopt(easy, CURLOPT_WRITEFUNCTION, on_body);
    lib.easy_setopt(easy, CURLOPT_WRITEDATA, &transfer);
    lib.easy_setopt(easy, CURLOPT_HEADERFUNCTION, on_header);
    lib.easy_setopt(easy, CURLOPT_HEADERDATA, &transfer);
    lib.easy_setopt(easy, CURLOPT_OPENSOCKETFUNCTION, open_socket);
    lib.easy_setopt(easy, CURLOPT_OPENSOCKETDATA, &transfer);
    lib.easy_setopt(easy, CURLOPT_CLOSESOCKETFUNCTION, close_socket);
    lib.easy_setopt(easy, CURLOPT_TIMEOUT_MS, static_cast<long>(settings_.timeout_s * 1000));
    lib.easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(settings_.connect_timeout_s * 1000));
    lib.easy_setopt(easy, CURLOPT_FOLLOWLOCATION, signing.sigv4.empty() ? 1L : 0L);
    lib.easy_setopt(easy, CURLOPT_MAXREDIRS, 5L);
    lib.easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
    lib.easy_setopt(easy, CURLOPT_ACCEPT_ENCODING, nullptr);  // bytes as stored: no transfer decoding
    lib.easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
    // Large bodies (a whole object's parts) received in large pieces: each piece costs a callback,
    // a copy and a socket read (16 KiB by default).
    lib.easy_setopt(easy, CURLOPT_BUFFERSIZE,
                    request.offset >= 0 && request.size >= kLargeBody ? kLargeBuffer : 16384L);
    std::string range;
    if (request.offset >= 0) {
      range = concat(request.offset, "-", request.offset + request.size - 1);
      lib.easy_setopt(easy, CURLOPT_RANGE, range.c_str());  // copied by libcurl
    }
    if (!request.body.empty() || request.method == "POST") {
      lib.easy_setopt(easy, CURLOPT_POSTFIELDSIZE, static_cast<long>(request.body.size()));
      lib.easy_setopt(easy, CURLOPT_POSTFIELDS, request.body.c_str());  // the request outlives the transfer
    }
    if (!request.method.empty()) lib.easy_setopt(easy, CURLOPT_CUSTOMREQUEST, request.method.c_str());
    curl_slist* headers = nullptr;
    for (const std::string& header : request.headers) headers = lib.slist_append(headers, header.c_str());
    if (!signing.sigv4.empty()) {
      lib.easy_setopt(easy, CURLOPT_AWS_SIGV4, signing.sigv4.c_str());
      lib.easy_setopt(easy, CURLOPT_USERPWD, signing.user_password.c_str());
      // The hash of the (empty) payload, which S3 requires as a header and which libcurl signs either way
      // (a body's hash libcurl works out itself).
      if (request.body.empty()) {
        headers = lib.slist_append(
            headers, "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
      }
      if (!signing.session_token.empty()) {
        headers = lib.slist_append(headers, ("x-amz-security-token: " + signing.session_token).c_str());
      }
    }
    transfer.headers = headers;
    if (headers != nullptr) lib.easy_setopt(easy, CURLOPT_HTTPHEADER, headers);
    if (lib.multi_add_handle(handles.multi, easy) != CURLM_OK) {
      throw core::ReadError(concat(request.url, ": libcurl could not start the request"));
    }
  };

  const auto release = [&](Transfer& transfer) {
    lib.multi_remove_handle(handles.multi, transfer.easy);
    handles.idle.push_back(transfer.easy);
    transfer.easy = nullptr;
    if (transfer.headers != nullptr) lib.slist_free_all(transfer.headers);
    transfer.headers = nullptr;
  };

  // Settles a finished attempt: done, or scheduled again after a backoff.
  const auto settle = [&](Transfer& transfer, CURLcode code) {
    const HttpRequest& request = *transfer.request;
    HttpResponse& response = *transfer.response;
    lib.easy_getinfo(transfer.easy, CURLINFO_RESPONSE_CODE, &response.status);
    bool transient = false;
    if (transfer.sink_error != 0) {
      response.error = concat("the body could not be stored: ", std::strerror(transfer.sink_error));
      response.status = 0;
    } else if (transfer.overflow) {
      response.error =
          concat("the server sent more than the ", request.size, " bytes asked for (does it ignore Range requests?)");
    } else if (code != CURLE_OK) {
      response.error = concat("libcurl: ", lib.easy_strerror(code), out_of_descriptors(transfer));
      response.status = 0;
      transient = code != CURLE_UNSUPPORTED_PROTOCOL && code != CURLE_URL_MALFORMAT &&
                  code != CURLE_COULDNT_RESOLVE_HOST && code != CURLE_PEER_FAILED_VERIFICATION &&
                  code != CURLE_SSL_CACERT_BADFILE && code != CURLE_LOGIN_DENIED;
    } else if (response.status == 429 || response.status >= 500) {
      transient = true;
      response.error = concat("HTTP ", response.status);
    } else if (ok_status(response.status) && has_destination(request) && !request.head &&
               response.received != request.size) {
      transient = true;  // cut short
      response.error = concat("the answer ended after ", response.received, " of ", request.size, " bytes");
      response.status = 0;
    }
    release(transfer);
    if (transient && response.attempts <= settings_.retries) {
      const double base =
          std::min(kMaxBackoff, settings_.backoff_s * static_cast<double>(1 << std::min(response.attempts - 1, 16)));
      const double wait = std::uniform_real_distribution<double>(base / 2, base)(jitter);
      transfer.ready = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait));
      return;
    }
    if (!transient && code == CURLE_OK && !transfer.overflow) response.error.clear();
    transfer.done = true;
  };

  size_t finished = 0, next = 0;
  std::vector<Transfer*> running;
  std::vector<Transfer*> waiting;  // retries not yet due
  try {
    while (finished < transfers.size()) {
      // Start what may start: due retries first, then new requests.
      const auto time = Clock::now();
      for (auto it = waiting.begin();
           it != waiting.end() && running.size() < static_cast<size_t>(settings_.max_requests);) {
        if ((*it)->ready <= time) {
          start(**it);
          running.push_back(*it);
          it = waiting.erase(it);
        } else {
          ++it;
        }
      }
      while (next < transfers.size() && running.size() < static_cast<size_t>(settings_.max_requests)) {
        start(transfers[next]);
        running.push_back(&transfers[next++]);
      }
      int active = 0;
      lib.multi_perform(handles.multi, &active);
      int queued = 0;
      while (CURLMsg* message = lib.multi_info_read(handles.multi, &queued)) {
        if (message->msg != CURLMSG_DONE) continue;
        auto it = std::find_if(running.begin(), running.end(),
                               [&](Transfer* transfer) { return transfer->easy == message->easy_handle; });
        if (it == running.end()) continue;
        Transfer* transfer = *it;
        running.erase(it);
        settle(*transfer, message->data.result);
        if (transfer->done) {
          ++finished;
        } else {
          waiting.push_back(transfer);
        }
      }
      if (finished == transfers.size()) break;
      int wait_ms = 100;
      if (running.empty() && !waiting.empty()) {
        auto soonest = waiting.front()->ready;
        for (Transfer* transfer : waiting) soonest = std::min(soonest, transfer->ready);
        wait_ms = static_cast<int>(std::max<int64_t>(
            0, std::chrono::duration_cast<std::chrono::milliseconds>(soonest - Clock::now()).count() + 1));
        std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
        continue;
      }
      if (!waiting.empty()) wait_ms = 5;
      lib.multi_poll(handles.multi, nullptr, 0, wait_ms, nullptr);
    }
  } catch (...) {
    for (Transfer* transfer : running) release(*transfer);
    throw;
  }
}

std::string describe_error_body(const std::vector<uint8_t>& body) {
  const std::string text(body.begin(), body.end());
  const auto tag = [&](const char* name) {
    const std::vector<std::string> values = xml_values(text, name);
    return values.empty() ? std::string() : values.front();
  };
  const std::string code = tag("Code"), message = tag("Message");
  if (!code.empty()) return concat(code, message.empty() ? "" : ": ", message);
  std::string start = text.substr(0, 200);
  for (char& c : start) {
    if (static_cast<unsigned char>(c) < 32 || static_cast<unsigned char>(c) > 126) c = ' ';
  }
  return start;
}

}  // namespace torch_shards::io::storage

#include "io/storage/sso_credentials.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <system_error>
#include <variant>

#include "core/errors.h"
#include "io/file.h"
#include "io/storage/credential_process.h"
#include "io/storage/http_client.h"
#include "io/storage/refreshing_credentials.h"
#include "io/storage/url.h"

namespace torch_shards::io::storage {

using core::concat;
using core::ReadError;

namespace {

constexpr uintmax_t kMaxCacheFileBytes = 1 << 20;

constexpr int64_t kRefreshAheadSeconds = 300;

struct Token {
  std::string access_token;
  int64_t expires = 0;  // seconds since the epoch
  std::string path;
  nlohmann::json file;  // the cache file as read
};

// An expiresAt as the CLI writes it: ISO 8601 with "Z" (v2) or "UTC" (v1).
std::optional<int64_t> parse_expires_at(std::string text) {
  if (text.size() > 3 && text.compare(text.size() - 3, 3, "UTC") == 0) text.replace(text.size() - 3, 3, "Z");
  return parse_iso8601(text);
}

// The cache's token for the start URL: the unexpired one that lasts longest, else the expired one that lasted
// longest (for the message), nullopt when none is there.
std::optional<Token> cached_token(const std::string& cache_dir, const std::string& start_url) {
  std::optional<Token> best;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(cache_dir, error)) {
    if (entry.path().extension() != ".json") continue;
    std::error_code size_error;
    if (!entry.is_regular_file(size_error) || entry.file_size(size_error) > kMaxCacheFileBytes) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    const nlohmann::json file = nlohmann::json::parse(text.str(), nullptr, false);
    if (!file.is_object()) continue;  // not a token file (the cache holds client registrations too)
    const auto url = file.find("startUrl"), token = file.find("accessToken"), expires = file.find("expiresAt");
    if (url == file.end() || !url->is_string() || token == file.end() || !token->is_string() || expires == file.end() ||
        !expires->is_string()) {
      continue;
    }
    std::string found_url = url->get<std::string>();
    while (!found_url.empty() && found_url.back() == '/') found_url.pop_back();
    if (found_url != start_url) continue;
    const std::optional<int64_t> until = parse_expires_at(expires->get<std::string>());
    if (!until || token->get<std::string>().empty()) continue;
    if (!best || *until > best->expires) best = Token{token->get<std::string>(), *until, entry.path().string(), file};
  }
  return best;
}

std::string field(const nlohmann::json& object, const char* key, const std::string& what) {
  const auto found = object.find(key);
  if (found == object.end() || !found->is_string() || found->get<std::string>().empty()) {
    throw ReadError(concat(what, ": the portal answered without ", key));
  }
  return found->get<std::string>();
}

std::string string_of(const nlohmann::json& object, const char* key) {
  const auto found = object.find(key);
  return found != object.end() && found->is_string() ? found->get<std::string>() : std::string();
}

std::string iso8601(int64_t seconds) {
  const std::time_t time = static_cast<std::time_t>(seconds);
  std::tm utc{};
  gmtime_r(&time, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

// The login refreshed through SSO-OIDC (CreateToken, grant type refresh_token) and written back to its
// file; why not, when it cannot be.
std::variant<Token, std::string> refreshed(const SsoRequest& request, const Token& token) {
  const std::string client_id = string_of(token.file, "clientId"), secret = string_of(token.file, "clientSecret");
  const std::string refresh_token = string_of(token.file, "refreshToken");
  if (client_id.empty() || secret.empty() || refresh_token.empty()) return std::string("it holds no refresh token");
  const std::optional<int64_t> registered = parse_expires_at(string_of(token.file, "registrationExpiresAt"));
  if (registered && *registered <= seconds_now()) return std::string("its client registration has expired");
  HttpRequest post;
  post.url = request.oidc_endpoint + "/token";
  post.method = "POST";
  post.body = nlohmann::json{{"grantType", "refresh_token"},
                             {"clientId", client_id},
                             {"clientSecret", secret},
                             {"refreshToken", refresh_token}}
                  .dump();
  post.headers = {"Content-Type: application/json", "Accept: application/json"};
  ClientSettings settings;
  settings.timeout_s = 30;
  settings.connect_timeout_s = 5;
  settings.retries = 3;
  const HttpResponse response = HttpClient(settings, Signing{}).perform(post);
  if (response.status != 200) {
    return concat("CreateToken at ", request.oidc_endpoint, " answered ",
                  response.status == 0 ? response.error : concat("HTTP ", response.status));
  }
  const nlohmann::json answer =
      nlohmann::json::parse(std::string(response.body.begin(), response.body.end()), nullptr, false);
  const std::string access = answer.is_object() ? string_of(answer, "accessToken") : std::string();
  const auto lifetime = answer.is_object() ? answer.find("expiresIn") : answer.end();
  if (access.empty() || lifetime == answer.end() || !lifetime->is_number_integer()) {
    return concat("CreateToken at ", request.oidc_endpoint, " answered no accessToken and expiresIn");
  }
  Token fresh = token;
  fresh.access_token = access;
  fresh.expires = seconds_now() + lifetime->get<int64_t>();
  fresh.file["accessToken"] = access;
  fresh.file["expiresAt"] = iso8601(fresh.expires);
  if (const std::string renewed = string_of(answer, "refreshToken"); !renewed.empty())
    fresh.file["refreshToken"] = renewed;
  // Written back as the CLI writes it (another file, renamed over it): the next process, and `aws`, use it.
  // Readable by its owner only, from its creation on: it holds the tokens.
  const std::string temporary = concat(token.path, ".", current_process_id(), ".tmp");
  const std::string text = fresh.file.dump();
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd >= 0) {
    bool written = true;
    for (size_t at = 0; written && at < text.size();) {
      const ssize_t count = ::write(fd, text.data() + at, text.size() - at);
      if (count < 0 && errno == EINTR) continue;
      written = count > 0;
      if (written) at += static_cast<size_t>(count);
    }
    written = ::close(fd) == 0 && written;
    std::error_code error;
    if (!written || (std::filesystem::rename(temporary, token.path, error), error)) {
      std::filesystem::remove(temporary, error);  // kept in memory only: the next fetch refreshes again
    }
  }
  return fresh;
}

}  // namespace

AwsCredentials sso_role_credentials(const SsoRequest& request) {
  std::string start_url = request.start_url;
  while (!start_url.empty() && start_url.back() == '/') start_url.pop_back();
  const std::string login = concat("run `aws sso login --profile ", request.profile, "`");
  const std::string what =
      concat("cannot fetch the SSO credentials of AWS profile '", request.profile, "' (", request.where, ")");
  std::optional<Token> token = cached_token(request.cache_dir, start_url);
  if (!token) {
    throw ReadError(concat(what, ": no SSO login for ", start_url, " in ", request.cache_dir, "; ", login));
  }
  std::string not_refreshed;
  if (!request.oidc_endpoint.empty() && token->expires <= seconds_now() + kRefreshAheadSeconds) {
    std::variant<Token, std::string> fresh = refreshed(request, *token);
    if (Token* renewed = std::get_if<Token>(&fresh)) {
      token = std::move(*renewed);
    } else {
      not_refreshed = concat(" and could not be refreshed (", std::get<std::string>(fresh), ")");
    }
  }
  if (token->expires <= seconds_now()) {
    throw ReadError(concat(what, ": the SSO login for ", start_url, " (", token->path, ") has expired", not_refreshed,
                           "; ", login));
  }
  HttpRequest get;
  get.url = concat(request.endpoint, "/federation/credentials?account_id=", percent_encode(request.account_id, false),
                   "&role_name=", percent_encode(request.role_name, false));
  get.headers = {"x-amz-sso_bearer_token: " + token->access_token, "Accept: application/json"};
  ClientSettings settings;
  settings.timeout_s = 30;
  settings.connect_timeout_s = 5;
  settings.retries = 3;
  const HttpResponse response = HttpClient(settings, Signing{}).perform(get);
  const std::string at = concat(" at ", request.endpoint);
  if (response.status == 0) throw ReadError(concat(what, at, ": no answer: ", response.error));
  if (response.status == 401) {
    throw ReadError(concat(what, at, ": the SSO login was refused (HTTP 401: expired or signed out?); ", login));
  }
  if (response.status == 403) {
    throw ReadError(concat(what, at, ": HTTP 403: the login may not use role ", request.role_name, " of account ",
                           request.account_id));
  }
  if (response.status != 200) {
    const std::string detail = describe_error_body(response.body);
    throw ReadError(concat(what, at, ": HTTP ", response.status, detail.empty() ? "" : " (" + detail + ")"));
  }
  const nlohmann::json answer =
      nlohmann::json::parse(std::string(response.body.begin(), response.body.end()), nullptr, false);
  const auto role = answer.is_object() ? answer.find("roleCredentials") : answer.end();
  if (!answer.is_object() || role == answer.end() || !role->is_object()) {
    throw ReadError(concat(what, at, ": the portal answered no roleCredentials"));
  }
  AwsCredentials credentials;
  credentials.access_key_id = field(*role, "accessKeyId", what);
  credentials.secret_access_key = field(*role, "secretAccessKey", what);
  credentials.session_token = field(*role, "sessionToken", what);
  const auto expiration = role->find("expiration");
  if (expiration == role->end() || !expiration->is_number()) {
    throw ReadError(concat(what, at, ": the portal answered without an expiration"));
  }
  credentials.expiration = expiration->get<int64_t>() / 1000;  // milliseconds since the epoch
  credentials.source = concat(request.where, " (SSO role ", request.role_name, " of account ", request.account_id, ")");
  return credentials;
}

}  // namespace torch_shards::io::storage

#include "io/storage/metadata_credentials.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/errors.h"
#include "io/file.h"
#include "io/storage/http_client.h"
#include "io/storage/inherited_table.h"
#include "io/storage/refreshing_credentials.h"

namespace torch_shards::io::storage {

using core::concat;
using core::InvalidArgument;
using core::ReadError;

namespace {

constexpr int kImdsTokenSeconds = 21600;
constexpr int64_t kRememberSilenceSeconds = 60;

std::string body_text(const HttpResponse& response) { return std::string(response.body.begin(), response.body.end()); }

std::string field(const nlohmann::json& answer, const char* key, const std::string& what) {
  const auto found = answer.find(key);
  if (found == answer.end() || !found->is_string() || found->get<std::string>().empty()) {
    throw ReadError(concat(what, ": the answer has no ", key));
  }
  return found->get<std::string>();
}

// The credentials in a metadata service's JSON answer (AccessKeyId, SecretAccessKey, Token, Expiration).
AwsCredentials credentials_from(const HttpResponse& response, const std::string& what, const std::string& source) {
  nlohmann::json answer;
  try {
    answer = nlohmann::json::parse(body_text(response));
  } catch (const nlohmann::json::exception&) {
    throw ReadError(concat(what, ": the answer is not JSON"));
  }
  if (!answer.is_object()) throw ReadError(concat(what, ": the answer is not a JSON object"));
  if (answer.contains("Code") && answer["Code"].is_string() && answer["Code"].get<std::string>() != "Success") {
    throw ReadError(concat(what, ": the service answered Code ", answer["Code"].get<std::string>()));
  }
  return answered_credentials(field(answer, "AccessKeyId", what), field(answer, "SecretAccessKey", what),
                              field(answer, "Token", what), field(answer, "Expiration", what), what, source);
}

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// The host of an http(s) URL, without brackets or port, lower-cased.
std::string host_of(const std::string& url) {
  const size_t start = url.find("://") + 3;
  std::string authority = url.substr(start, url.find_first_of("/?#", start) - start);
  if (!authority.empty() && authority[0] == '[') return lower(authority.substr(1, authority.find(']') - 1));
  return lower(authority.substr(0, authority.find(':')));
}

// What botocore accepts for a full container URI over plain http: loopback and the agents' addresses.
bool allowed_http_host(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0 || host == "169.254.170.2" ||
         host == "169.254.170.23" || host == "fd00:ec2::23";
}

double positive_seconds(const Environment& env, const char* name, double otherwise) {
  const std::optional<std::string> text = env_value(env, name);
  if (!text) return otherwise;
  char* end = nullptr;
  const double value = std::strtod(text->c_str(), &end);
  if (end == text->c_str() || *end != '\0' || !(value > 0) || value > 3600) {
    throw InvalidArgument(concat(name, " must be seconds in (0, 3600], got '", *text, "'"));
  }
  return value;
}

int positive_count(const Environment& env, const char* name, int otherwise) {
  const std::optional<std::string> text = env_value(env, name);
  if (!text) return otherwise;
  char* end = nullptr;
  const long value = std::strtol(text->c_str(), &end, 10);
  if (end == text->c_str() || *end != '\0' || value < 1 || value > 10) {
    throw InvalidArgument(concat(name, " must be a count in [1, 10], got '", *text, "'"));
  }
  return static_cast<int>(value);
}

}  // namespace

std::optional<AwsCredentials> container_credentials(const Environment& env) {
  std::string url;
  std::string variable;
  if (const std::optional<std::string> relative = env_value(env, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")) {
    url = "http://169.254.170.2" + (relative->front() == '/' ? *relative : "/" + *relative);
    variable = "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI";
  } else if (const std::optional<std::string> full = env_value(env, "AWS_CONTAINER_CREDENTIALS_FULL_URI")) {
    url = *full;
    variable = "AWS_CONTAINER_CREDENTIALS_FULL_URI";
    const std::string scheme = lower(url.substr(0, url.find("://")));
    const bool https = scheme == "https" && url.find("://") != std::string::npos;
    if (!https && !(scheme == "http" && url.find("://") != std::string::npos && allowed_http_host(host_of(url)))) {
      throw InvalidArgument(concat("AWS_CONTAINER_CREDENTIALS_FULL_URI='", url,
                                   "' is neither https:// nor http:// to a loopback address or the ECS / EKS "
                                   "credential agents (169.254.170.2, 169.254.170.23, [fd00:ec2::23])"));
    }
  } else {
    return std::nullopt;
  }
  HttpRequest get;
  get.url = url;
  get.headers = {"Accept: application/json"};
  std::string token;
  if (const std::optional<std::string> file = env_value(env, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")) {
    token = read_token_file(*file, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
  } else if (const std::optional<std::string> value = env_value(env, "AWS_CONTAINER_AUTHORIZATION_TOKEN")) {
    token = *value;
  }
  if (token.find_first_of("\r\n") != std::string::npos) {
    throw InvalidArgument("the container authorization token holds a line break");
  }
  if (!token.empty()) get.headers.push_back("Authorization: " + token);
  ClientSettings settings;
  settings.timeout_s = 5;
  settings.connect_timeout_s = 2;
  settings.retries = 2;
  const std::string what = concat("cannot fetch the container's AWS credentials from ", url, " (", variable, ")");
  const HttpResponse response = HttpClient(settings, Signing{}).perform(get);
  if (response.status == 0) throw ReadError(concat(what, ": no answer: ", response.error));
  if (response.status != 200) {
    const std::string detail = describe_error_body(response.body);
    throw ReadError(concat(what, ": HTTP ", response.status, detail.empty() ? "" : " (" + detail + ")"));
  }
  return credentials_from(response, what, concat("the container's credentials (", variable, ")"));
}

std::optional<AwsCredentials> instance_credentials(const Environment& env, std::string* why_not) {
  if (env_flag(env, "AWS_EC2_METADATA_DISABLED") == true) {
    *why_not = "instance metadata (AWS_EC2_METADATA_DISABLED is true)";
    return std::nullopt;
  }
  std::string endpoint;
  if (const std::optional<std::string> named = env_value(env, "AWS_EC2_METADATA_SERVICE_ENDPOINT")) {
    endpoint = *named;
  } else {
    const std::string mode = lower(env_value(env, "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE").value_or("ipv4"));
    if (mode != "ipv4" && mode != "ipv6") {
      throw InvalidArgument(concat("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE must be IPv4 or IPv6, got '", mode, "'"));
    }
    endpoint = mode == "ipv6" ? "http://[fd00:ec2::254]" : "http://169.254.169.254";
  }
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  const double timeout_s = positive_seconds(env, "AWS_METADATA_SERVICE_TIMEOUT", 1);
  const int attempts = positive_count(env, "AWS_METADATA_SERVICE_NUM_ATTEMPTS", 1);
  const bool v1_disabled = env_flag(env, "AWS_EC2_METADATA_V1_DISABLED") == true;

  // Not on EC2, the service never answers: remembered for a while, per endpoint, and by the processes
  // forked from this one (DataLoader workers do not each wait for it again).
  static InheritedTable<std::string, int64_t> silent_before;
  struct Silences {
    Silences() : until(silent_before.snapshot()) {}
    std::mutex mutex;
    std::map<std::string, int64_t> until;  // endpoint -> not asked again before
  };
  Silences& silences = per_process<Silences>();
  {
    std::lock_guard<std::mutex> lock(silences.mutex);
    const auto found = silences.until.find(endpoint);
    if (found != silences.until.end() && seconds_now() < found->second) {
      *why_not = concat("instance metadata (", endpoint, " did not answer in the last minute)");
      return std::nullopt;
    }
  }
  ClientSettings settings;
  settings.timeout_s = timeout_s;
  settings.connect_timeout_s = timeout_s;
  settings.retries = attempts - 1;
  const HttpClient client(settings, Signing{});
  // Anything else that is not credentials: none either (as botocore has it: a machine off EC2 may have a
  // proxy answering for the address), and the reason said.
  const auto none = [&](const std::string& why) -> std::optional<AwsCredentials> {
    *why_not = concat("instance metadata (", why, ")");
    return std::nullopt;
  };
  const auto silent = [&](const HttpResponse& response) -> std::optional<AwsCredentials> {
    std::lock_guard<std::mutex> lock(silences.mutex);
    const int64_t until = seconds_now() + kRememberSilenceSeconds;
    silences.until[endpoint] = until;
    silent_before.put(endpoint, until);
    *why_not = concat("instance metadata (no answer from ", endpoint, ": ", response.error, ")");
    return std::nullopt;
  };

  HttpRequest put;
  put.url = endpoint + "/latest/api/token";
  put.method = "PUT";
  put.headers = {concat("X-aws-ec2-metadata-token-ttl-seconds: ", kImdsTokenSeconds)};
  const HttpResponse token = client.perform(put);
  if (token.status == 0) return silent(token);
  std::vector<std::string> headers;
  if (token.status == 200) {
    const std::string value = body_text(token);
    if (value.empty() || value.find_first_of("\r\n") != std::string::npos) {
      return none(concat(put.url, " answered a session token that is not one"));
    }
    headers.push_back("X-aws-ec2-metadata-token: " + value);
  } else if ((token.status == 403 || token.status == 404 || token.status == 405) && !v1_disabled) {
    // A service that hands out no tokens (IMDSv1 only, or a proxy in between): asked without one.
  } else {
    return none(concat(put.url, " refused a session token: HTTP ", token.status,
                       v1_disabled ? " (and AWS_EC2_METADATA_V1_DISABLED is true)" : ""));
  }

  HttpRequest roles;
  roles.url = endpoint + "/latest/meta-data/iam/security-credentials/";
  roles.headers = headers;
  const HttpResponse role = client.perform(roles);
  if (role.status == 0) return silent(role);
  if (role.status == 404) return none(concat(endpoint, ": the instance has no IAM role"));
  if (role.status != 200) return none(concat(roles.url, " answered HTTP ", role.status));
  std::string name = body_text(role);
  name = name.substr(0, name.find_first_of("\r\n"));
  if (name.empty() || name.find('/') != std::string::npos) return none(concat(roles.url, " answered no role name"));
  HttpRequest keys;
  keys.url = roles.url + name;
  keys.headers = headers;
  const HttpResponse answer = client.perform(keys);
  if (answer.status == 0) return silent(answer);
  if (answer.status != 200) return none(concat(keys.url, " answered HTTP ", answer.status));
  try {
    return credentials_from(answer, keys.url, concat("instance metadata (", endpoint, ", role ", name, ")"));
  } catch (const ReadError& error) {
    return none(error.what());
  }
}

}  // namespace torch_shards::io::storage

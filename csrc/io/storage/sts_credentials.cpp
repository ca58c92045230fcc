#include "io/storage/sts_credentials.h"

#include <vector>

#include "core/errors.h"
#include "io/storage/http_client.h"
#include "io/storage/refreshing_credentials.h"
#include "io/storage/url.h"
#include "io/storage/xml_text.h"

namespace torch_shards::io::storage {

using core::concat;
using core::ReadError;

namespace {

// The one value of <tag> in STS's answer; ReadError when missing.
std::string answer_value(const std::string& xml, const char* tag, const std::string& what) {
  const std::vector<std::string> values = xml_values(xml, tag);
  if (values.size() != 1 || values[0].empty()) throw ReadError(concat(what, ": STS answered without one ", tag));
  return values[0];
}

}  // namespace

AwsCredentials assume_role(const RoleRequest& request, const std::string& endpoint, const std::string& region,
                           const AwsCredentials& source) {
  const bool web_identity = !request.web_identity_token_file.empty();
  const std::string action = web_identity ? "AssumeRoleWithWebIdentity" : "AssumeRole";
  const std::string what =
      concat("cannot assume the role ", request.role_arn, " (", request.where, ") with ", action, " at ", endpoint);
  const std::string session_name =
      request.session_name.empty() ? concat("torch-shards-", seconds_now()) : request.session_name;

  std::vector<std::pair<std::string, std::string>> form = {
      {"Action", action}, {"Version", "2011-06-15"}, {"RoleArn", request.role_arn}, {"RoleSessionName", session_name}};
  if (request.duration_s > 0) form.emplace_back("DurationSeconds", std::to_string(request.duration_s));
  if (!request.external_id.empty() && !web_identity) form.emplace_back("ExternalId", request.external_id);
  if (web_identity) {
    std::string token;
    try {
      token = read_token_file(request.web_identity_token_file, "the web identity token file");
    } catch (const ReadError& error) {
      throw ReadError(concat(what, ": ", error.what()));
    }
    if (token.empty()) {
      throw ReadError(concat(what, ": the web identity token file ", request.web_identity_token_file, " is empty"));
    }
    form.emplace_back("WebIdentityToken", token);
  }

  HttpRequest post;
  post.url = endpoint + "/";
  post.method = "POST";
  for (const auto& [key, value] : form) {
    post.body += concat(post.body.empty() ? "" : "&", key, "=", percent_encode(value, false));
  }
  post.headers = {"Content-Type: application/x-www-form-urlencoded; charset=utf-8", "Accept: application/xml"};

  ClientSettings settings;
  settings.timeout_s = 30;
  settings.connect_timeout_s = 5;
  settings.retries = 3;
  Signing signing;
  if (!web_identity) {
    signing.sigv4 = concat("aws:amz:", region, ":sts");
    signing.user_password = source.access_key_id + ":" + source.secret_access_key;
    signing.session_token = source.session_token;
  }
  const HttpResponse response = HttpClient(settings, signing).perform(post);
  if (response.status == 0) throw ReadError(concat(what, ": no answer: ", response.error));
  const std::string xml(response.body.begin(), response.body.end());
  if (response.status != 200) {
    const std::string detail = describe_error_body(response.body);
    throw ReadError(concat(what, ": HTTP ", response.status, detail.empty() ? "" : " (" + detail + ")",
                           web_identity ? "" : concat("; signed with the credentials from ", source.source)));
  }
  return answered_credentials(answer_value(xml, "AccessKeyId", what), answer_value(xml, "SecretAccessKey", what),
                              answer_value(xml, "SessionToken", what), answer_value(xml, "Expiration", what), what,
                              concat(request.where, " (role ", request.role_arn, ", ", action, ")"));
}

}  // namespace torch_shards::io::storage

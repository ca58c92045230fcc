// The settings and credentials an S3 client uses, resolved the way the AWS CLI
// v2 and boto3 resolve them: from the environment, the two shared files, a
// profile's credential_process (credential_process.h), a role assumed through
// STS (sts_credentials.h), an SSO login (sso_credentials.h) and the
// container's or instance's metadata service (metadata_credentials.h).
//
//   profile      options.profile, AWS_PROFILE, "default"
//   files        AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials ([NAME] sections),
//                AWS_CONFIG_FILE or ~/.aws/config ([default], [profile NAME], also [NAME]);
//                a file that does not exist is as good as an empty one
//   credentials  none when anonymous; else, the first found of
//                - AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN), unless
//                  options.profile names a profile (botocore skips them for a session's profile);
//                - the profile's role (role_arn, in the config file or the credentials file),
//                  assumed with the credentials of its source_profile (resolved as a profile
//                  is, roles chained up to 8 deep), of its credential_source (Environment,
//                  Ec2InstanceMetadata, EcsContainer), or with its web_identity_token_file;
//                - AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE (+ AWS_ROLE_SESSION_NAME);
//                - the profile's SSO role (sso_session or sso_start_url, with sso_account_id
//                  and sso_role_name), with the token of the CLI's `aws sso login`;
//                - aws_access_key_id / aws_secret_access_key (/ aws_session_token) of the
//                  profile in the credentials file; what the profile's credential_process
//                  prints (credentials file, then config file); the config file's keys;
//                - the container's credentials (AWS_CONTAINER_CREDENTIALS_*_URI);
//                - the instance's (EC2 instance metadata);
//                none found: anonymous, unless options.anonymous is false. Credentials with
//                an Expiration (a program's, a role's, a metadata service's) are fetched
//                once per process until they are due, and again before they expire
//                (refreshing_credentials.h)
//   anonymous    options.anonymous, else AWS_NO_SIGN_REQUEST (true/1, false/0)
//   region       options.region, AWS_REGION, AWS_DEFAULT_REGION, the profile's region,
//                "us-east-1"
//   endpoint     options.endpoint_url, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's
//                services section's s3 endpoint_url, the profile's s3.endpoint_url, the
//                profile's endpoint_url, "" (AWS itself); all but the option are ignored with
//                AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true (or the profile's
//                ignore_configured_endpoint_urls = true)
//
// An environment variable set to "" counts as unset. Errors: core::InvalidArgument
// for what a user chose (an option, a variable, a profile name), core::ReadError
// for a file that cannot be read or parsed. No message ever holds a secret key
// or a session token.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace torch_shards::io::storage {

// What a user passed explicitly; empty / nullopt = not given.
struct AwsOptions {
  std::string profile, region, endpoint_url;
  std::optional<bool> anonymous;  // true: never sign; false: credentials required
};

struct AwsCredentials {
  std::string access_key_id, secret_access_key, session_token;
  // When they stop being valid (seconds since the epoch), if their source says: a credential_process's,
  // a role's or a metadata service's Expiration.
  std::optional<int64_t> expiration;
  // Where they came from, for messages: "environment", "/home/u/.aws/credentials [prod]",
  // "/home/u/.aws/config [profile prod]".
  std::string source;
  bool empty() const { return access_key_id.empty(); }
};

// Credentials a service answered: its key pair, session token and Expiration (an ISO 8601 time: a
// ReadError saying "<what>: ... not an ISO 8601 time" otherwise), from `source`.
AwsCredentials answered_credentials(std::string access_key_id, std::string secret_access_key, std::string session_token,
                                    const std::string& expiration, const std::string& what, std::string source);

struct AwsSettings {
  std::string profile;         // the profile used ("default" when none was named)
  std::string region;          // never empty: "us-east-1" when nothing says otherwise
  std::string endpoint_url;    // "" = AWS itself; else http(s)://host[:port][/path], no trailing '/'
  bool anonymous = false;      // requests go unsigned
  AwsCredentials credentials;  // empty when anonymous
  // Fetches them again (a credential_process run anew, a role assumed again); empty when they cannot expire.
  std::function<AwsCredentials()> refresh;
  // Where credentials were looked for (the places in order, ending with the
  // one they came from), or why they were not ("nowhere: ..."), for a 403's
  // message.
  std::string searched;
};

// The value of an environment variable; nullopt when unset.
using Environment = std::function<std::optional<std::string>(const std::string&)>;

// The token a small file holds (a web identity's, a container's authorization token), read anew at each
// call (they are rotated), trailing whitespace dropped. ReadError "cannot read <name> <path>: reason", or
// naming a file of more than 64 KiB; nothing of its contents in any message.
std::string read_token_file(const std::string& path, const std::string& name);

// A variable's value; nullopt when unset or "".
std::optional<std::string> env_value(const Environment& env, const std::string& name);
// A true / false (1 / 0, any case) variable; nullopt when unset; InvalidArgument naming it otherwise.
std::optional<bool> env_flag(const Environment& env, const std::string& name);

// getenv; HOME falls back to the user's home directory in the password database.
Environment process_environment();

AwsSettings resolve_aws_settings(const AwsOptions& options, const Environment& env = process_environment());

// One shared file parsed: section (as written between the brackets, trimmed)
// -> key -> value. Keys are lower-cased (as Python's configparser, which the
// CLI uses, does); a sub-setting (an indented `key = value` under a `parent =`
// with an empty value) is recorded as "parent.key". Comments are whole lines
// starting with '#' or ';'. A section or key that appears twice: the later
// value wins. Anything else is a ReadError naming `path` and the line (never
// the line's text: it may hold a secret).
using AwsIniSections = std::map<std::string, std::map<std::string, std::string>>;
AwsIniSections parse_aws_ini(const std::string& text, const std::string& path);

}  // namespace torch_shards::io::storage

// Credentials of an IAM Identity Center (SSO) profile, as the AWS CLI and
// boto3 fetch them once `aws sso login` has run:
//
//   [profile dev]                        or, the older form, in the profile itself:
//   sso_session = my-sso                 sso_start_url = https://x.awsapps.com/start
//   sso_account_id = 111122223333        sso_region = us-east-1
//   sso_role_name = ReadOnly             sso_account_id / sso_role_name
//   [sso-session my-sso]
//   sso_start_url = https://x.awsapps.com/start
//   sso_region = us-east-1
//
// The login's access token is read from the AWS CLI's token cache
// (~/.aws/sso/cache/*.json: the file for the start URL that lasts longest)
// at every fetch, so that a later `aws sso login` is picked up. An
// sso-session's token that expires within 5 minutes is refreshed as the CLI
// refreshes it (SSO-OIDC's CreateToken with the login's refresh token and
// client registration, at AWS_ENDPOINT_URL_SSO_OIDC or
// https://oidc.<sso_region>.amazonaws.com) and written back to its file; a
// refresh that fails while the token holds keeps it. The role's credentials come from the
// portal's GetRoleCredentials (GET <endpoint>/federation/credentials, the
// endpoint AWS_ENDPOINT_URL_SSO, AWS_ENDPOINT_URL, the profile's sso
// endpoint_url, else https://portal.sso.<sso_region>.amazonaws.com).
// Failures are core::ReadError naming the profile and what to run (never the
// token).
#pragma once

#include <string>

#include "io/storage/aws_credentials.h"

namespace torch_shards::io::storage {

struct SsoRequest {
  std::string profile;        // for messages ("aws sso login --profile <profile>")
  std::string where;          // where the profile is configured
  std::string start_url;      // the session's sso_start_url
  std::string account_id;     // sso_account_id
  std::string role_name;      // sso_role_name
  std::string endpoint;       // the portal, without a trailing '/'
  std::string oidc_endpoint;  // SSO-OIDC, which refreshes an sso-session's login ("": not refreshed)
  std::string cache_dir;      // the CLI's token cache (~/.aws/sso/cache)
};

AwsCredentials sso_role_credentials(const SsoRequest& request);

}  // namespace torch_shards::io::storage

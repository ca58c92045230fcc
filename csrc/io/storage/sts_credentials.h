// Credentials from AWS STS (the Security Token Service) for a role, as the
// AWS CLI fetches them for a profile that names one:
//
//   AssumeRole                 a profile's role_arn with a source_profile or a
//                              credential_source: the request is signed with the
//                              source's credentials
//   AssumeRoleWithWebIdentity  a profile's role_arn with a web_identity_token_file, or
//                              AWS_ROLE_ARN with AWS_WEB_IDENTITY_TOKEN_FILE (EKS's
//                              IAM roles for service accounts, GitHub's OIDC): unsigned,
//                              the file's token proving who asks; the file is read at
//                              every request (the token is rotated under it)
//
// One POST of STS's query API (Version 2011-06-15) to the STS endpoint
// (AWS_ENDPOINT_URL_STS, AWS_ENDPOINT_URL, the profile's sts endpoint_url, else
// https://sts.<region>.amazonaws.com), retried as every request is; the
// answer's credentials come with an Expiration, so that a store fetches them
// again before it (refreshing_credentials.h). Failures are core::ReadError
// naming the role, where it is configured, the endpoint and STS's error code
// (never a secret or the token).
#pragma once

#include <string>

#include "io/storage/aws_credentials.h"

namespace torch_shards::io::storage {

struct RoleRequest {
  std::string role_arn;
  std::string session_name;             // "" = "torch-shards-<seconds since the epoch>"
  std::string external_id;              // AssumeRole's ExternalId ("" = none)
  int duration_s = 0;                   // DurationSeconds (0 = STS's default: an hour)
  std::string web_identity_token_file;  // set: AssumeRoleWithWebIdentity with the token in this file
  std::string where;                    // where the role is configured, for messages
};

// The role's credentials; `source` signs an AssumeRole (unused for a web identity).
AwsCredentials assume_role(const RoleRequest& request, const std::string& endpoint, const std::string& region,
                           const AwsCredentials& source);

}  // namespace torch_shards::io::storage

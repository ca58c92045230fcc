// Credentials from the machine's own metadata services, where botocore looks
// last, when neither the environment nor the shared files hold any:
//
//   container  AWS_CONTAINER_CREDENTIALS_RELATIVE_URI (ECS: http://169.254.170.2<uri>)
//              or AWS_CONTAINER_CREDENTIALS_FULL_URI (EKS Pod Identity and others:
//              https://, or http:// to a loopback address or to the ECS / EKS agents
//              169.254.170.2, 169.254.170.23, [fd00:ec2::23]), with the Authorization
//              header from AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE (read at every
//              request: it is rotated) or AWS_CONTAINER_AUTHORIZATION_TOKEN
//   instance   EC2's instance metadata service: a session token (IMDSv2; when the
//              service refuses to hand one out, v1 unless AWS_EC2_METADATA_V1_DISABLED),
//              the instance profile's role name, then its credentials; at
//              AWS_EC2_METADATA_SERVICE_ENDPOINT, else http://169.254.169.254
//              (http://[fd00:ec2::254] with AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE=IPv6);
//              AWS_METADATA_SERVICE_TIMEOUT seconds per attempt (default 1) and
//              AWS_METADATA_SERVICE_NUM_ATTEMPTS attempts (default 1);
//              not asked with AWS_EC2_METADATA_DISABLED=true
//
// Both answer credentials with an Expiration: a store fetches them again
// before it (refreshing_credentials.h).
#pragma once

#include <optional>
#include <string>

#include "io/storage/aws_credentials.h"

namespace torch_shards::io::storage {

// The container's credentials; nullopt when neither variable is set. A service that is configured
// but fails is a core::ReadError naming its URL; a variable that is not valid, core::InvalidArgument.
std::optional<AwsCredentials> container_credentials(const Environment& env);

// The instance profile's credentials; nullopt when the service is disabled, does not answer (not on
// EC2: remembered for a minute, so that each store does not wait again) or the instance has no
// role, or answers anything but credentials (as botocore has it: a machine off EC2 may have a proxy
// answering for the address); *why_not then says which, for messages.
std::optional<AwsCredentials> instance_credentials(const Environment& env, std::string* why_not);

}  // namespace torch_shards::io::storage

// AWS credentials from an external program: a profile's credential_process
// (what `aws configure export-credentials --format process`, SSO helpers and
// vaults are configured as). The command line is split as a POSIX shell
// splits words (quotes and backslashes; no variables, globs or pipes) and run
// without a shell; its standard output is the JSON of the AWS CLI's process
// credential provider:
//
//   {"Version": 1, "AccessKeyId": "...", "SecretAccessKey": "...",
//    "SessionToken": "...", "Expiration": "2026-11-29T23:00:00Z"}
//
// (SessionToken and Expiration optional). The program gets at most
// timeout_s seconds (TORCH_SHARDS_CREDENTIAL_PROCESS_TIMEOUT, default 60),
// then is killed. Failures are core::ReadError naming the profile, where it is
// configured and the program (never its output: it holds the secret).
// Credentials are taken once, when a store is set up; they are not refreshed
// when their Expiration passes.
#pragma once

#include <string>
#include <vector>

#include "io/storage/aws_credentials.h"

namespace torch_shards::io::storage {

// The words of a command line as a POSIX shell splits them: whitespace
// separates, '...' is literal, "..." keeps \" \\ \$ \` escapes, a backslash
// outside quotes escapes the next character. InvalidArgument for an
// unterminated quote or a trailing backslash.
std::vector<std::string> split_command_line(const std::string& command);

// Runs `command` (the credential_process of `profile`, configured in `where`)
// and returns the credentials it printed; source names where they came from.
AwsCredentials run_credential_process(const std::string& command, const std::string& profile, const std::string& where,
                                      double timeout_s);

}  // namespace torch_shards::io::storage

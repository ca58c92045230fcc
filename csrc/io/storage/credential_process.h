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
// then is killed. Its output is read until it ends or, once the program has
// exited, until it has been quiet for 0.2 s: a process the program started in
// the background (an agent, a cache) may hold it open as long as it lives.
// Failures are core::ReadError naming the profile, where it is configured
// and the program (never its output: it holds the secret). Expiration
// (ISO 8601, "Z" or an offset) becomes AwsCredentials::expiration; a store
// runs the program again before then (refreshing_credentials.h).
#pragma once

#include <cstdint>
#include <optional>
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

// Seconds since the epoch of an ISO 8601 time with a zone ("2026-11-29T23:00:00Z",
// "2026-11-29T23:00:00.123+01:00"); nullopt for anything else.
std::optional<int64_t> parse_iso8601(const std::string& text);

}  // namespace torch_shards::io::storage

#include "io/storage/credential_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>

#include "core/errors.h"

extern char** environ;

namespace torch_shards::io::storage {

using core::concat;
using core::ReadError;

namespace {

constexpr size_t kMaxOutput = 1 << 20;  // a credentials JSON is a few KiB
constexpr size_t kMaxErrorText = 4096;  // of its standard error, kept for the message

// Both ends of a pipe, closed when they go out of scope.
struct Pipe {
  int fds[2] = {-1, -1};
  Pipe() {
    if (::pipe2(fds, O_CLOEXEC) != 0) fds[0] = fds[1] = -1;
  }
  ~Pipe() {
    close_end(0);
    close_end(1);
  }
  bool ok() const { return fds[0] >= 0; }
  void close_end(int end) {
    if (fds[end] >= 0) ::close(fds[end]);
    fds[end] = -1;
  }
};

// The first line of a program's standard error, for a message.
std::string first_line(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

struct Finished {
  std::string out, err;
  int status = 0;  // waitpid's
  bool timed_out = false;
};

// After the program exits, its output is read until it has been quiet this long: what it wrote is in the
// pipes already, and a process it started in the background (an agent, a cache daemon) may hold them open
// for as long as it lives.
constexpr std::chrono::milliseconds kQuietAfterExit{200};
constexpr std::chrono::milliseconds kExitCheck{50};  // how often the program is looked at while it runs

// Runs argv[0] (found on PATH) with its output and error captured, for at most timeout_s: until it has
// exited and its output has ended (or gone quiet for kQuietAfterExit).
Finished run(const std::vector<std::string>& argv, double timeout_s, const std::string& what) {
  Pipe out, err;
  if (!out.ok() || !err.ok()) throw ReadError(concat(what, ": cannot make a pipe: ", std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out.fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err.fds[1], STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) throw ReadError(concat(what, ": cannot run ", argv[0], ": ", std::strerror(spawned)));
  out.close_end(1);
  err.close_end(1);

  Finished finished;
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  bool out_open = true, err_open = true, exited = false;
  Clock::time_point quiet_since;  // since its exit was seen, or its last output after that
  for (;;) {
    if (!exited) {
      pid_t waited = 0;
      while ((waited = ::waitpid(pid, &finished.status, WNOHANG)) < 0 && errno == EINTR) {
      }
      exited = waited == pid;
      if (exited) quiet_since = Clock::now();
    }
    const auto now = Clock::now();
    if (!out_open && !err_open && exited) break;
    if (exited && now - quiet_since >= kQuietAfterExit) break;  // held open by a process it started
    if (now >= deadline) {
      finished.timed_out = !exited;
      break;
    }
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now) + std::chrono::milliseconds(1);
    wait = std::min(wait, exited ? kQuietAfterExit : kExitCheck);
    pollfd fds[2] = {{out_open ? out.fds[0] : -1, POLLIN, 0}, {err_open ? err.fds[0] : -1, POLLIN, 0}};
    if (!out_open && !err_open) {
      ::poll(nullptr, 0, static_cast<int>(wait.count()));  // both ended: only its exit is awaited
      continue;
    }
    const int ready = ::poll(fds, 2, static_cast<int>(wait.count()));
    if (ready < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buffer[4096];
      const ssize_t got = ::read(fds[i].fd, buffer, sizeof buffer);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        (i == 0 ? out_open : err_open) = false;
        continue;
      }
      quiet_since = Clock::now();
      std::string& text = i == 0 ? finished.out : finished.err;
      const size_t keep = i == 0 ? kMaxOutput + 1 : kMaxErrorText;  // more than kMaxOutput: refused below
      text.append(buffer, std::min(static_cast<size_t>(got), keep - std::min(keep, text.size())));
    }
  }
  if (!exited) {
    ::kill(pid, SIGKILL);  // timed out (or poll failed): never left running
    while (::waitpid(pid, &finished.status, 0) < 0 && errno == EINTR) {
    }
  }
  return finished;
}

std::string string_field(const nlohmann::json& answer, const char* key, bool required, const std::string& what) {
  const auto found = answer.find(key);
  if (found == answer.end() || found->is_null()) {
    if (required) throw ReadError(concat(what, " printed credentials without ", key));
    return "";
  }
  if (!found->is_string() || (required && found->get<std::string>().empty())) {
    throw ReadError(concat(what, " printed a ", key, " that is not a non-empty string"));
  }
  return found->get<std::string>();
}

}  // namespace

std::optional<int64_t> parse_iso8601(const std::string& text) {
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0, used = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &year, &month, &day, &hour, &minute, &second, &used) !=
          6 ||
      used != 19 || month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || second > 60) {
    return std::nullopt;
  }
  size_t at = 19;
  if (at < text.size() && text[at] == '.') {  // fractions of a second: dropped
    ++at;
    const size_t digits = at;
    while (at < text.size() && std::isdigit(static_cast<unsigned char>(text[at]))) ++at;
    if (at == digits) return std::nullopt;
  }
  int64_t offset = 0;
  if (at + 1 == text.size() && (text[at] == 'Z' || text[at] == 'z')) {
    ++at;
  } else if (at + 6 == text.size() && (text[at] == '+' || text[at] == '-') && text[at + 3] == ':') {
    int zone_hours = 0, zone_minutes = 0;
    if (std::sscanf(text.c_str() + at + 1, "%2d:%2d", &zone_hours, &zone_minutes) != 2 || zone_hours > 23 ||
        zone_minutes > 59) {
      return std::nullopt;
    }
    offset = (text[at] == '+' ? 1 : -1) * (zone_hours * 3600 + zone_minutes * 60);
    at += 6;
  } else {
    return std::nullopt;  // no zone: not a time the AWS CLI's providers print
  }
  if (at != text.size()) return std::nullopt;
  std::tm when{};
  when.tm_year = year - 1900;
  when.tm_mon = month - 1;
  when.tm_mday = day;
  when.tm_hour = hour;
  when.tm_min = minute;
  when.tm_sec = second;
  return static_cast<int64_t>(timegm(&when)) - offset;
}

std::vector<std::string> split_command_line(const std::string& command) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (size_t i = 0; i < command.size(); ++i) {
    const char c = command[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\\') {
      core::check_argument(i + 1 < command.size(), "credential_process '", command, "' ends in a backslash");
      word += command[++i];
    } else if (c == '\'') {
      const size_t end = command.find('\'', i + 1);
      core::check_argument(end != std::string::npos, "credential_process '", command, "' has an unterminated '");
      word += command.substr(i + 1, end - i - 1);
      i = end;
    } else if (c == '"') {
      size_t j = i + 1;
      for (; j < command.size() && command[j] != '"'; ++j) {
        if (command[j] == '\\' && j + 1 < command.size() && std::strchr("\"\\$`", command[j + 1]) != nullptr) ++j;
        word += command[j];
      }
      core::check_argument(j < command.size(), "credential_process '", command, "' has an unterminated \"");
      i = j;
    } else {
      word += c;
    }
  }
  if (in_word) words.push_back(word);
  return words;
}

AwsCredentials run_credential_process(const std::string& command, const std::string& profile, const std::string& where,
                                      double timeout_s) {
  std::vector<std::string> argv;
  try {
    argv = split_command_line(command);
  } catch (const core::InvalidArgument& error) {
    throw core::InvalidArgument(concat(where, ": AWS profile '", profile, "': ", error.what()));
  }
  const std::string what =
      concat(where, ": AWS profile '", profile, "': credential_process ", argv.empty() ? "''" : argv[0]);
  if (argv.empty()) throw ReadError(concat(what, " is empty"));
  const Finished finished = run(argv, timeout_s, what);
  if (finished.timed_out) {
    throw ReadError(concat(what, " did not finish within ", timeout_s,
                           " s (killed; TORCH_SHARDS_CREDENTIAL_PROCESS_TIMEOUT sets the limit)"));
  }
  if (WIFSIGNALED(finished.status)) {
    throw ReadError(concat(what, " was killed by signal ", WTERMSIG(finished.status)));
  }
  if (WEXITSTATUS(finished.status) != 0) {
    const std::string reason = first_line(finished.err);
    throw ReadError(concat(what, " exited with status ", WEXITSTATUS(finished.status),
                           reason.empty() ? std::string() : ": " + reason));
  }
  if (finished.out.size() > kMaxOutput) throw ReadError(concat(what, " printed more than ", kMaxOutput, " bytes"));
  nlohmann::json answer;
  try {
    answer = nlohmann::json::parse(finished.out);
  } catch (const nlohmann::json::exception&) {
    throw ReadError(concat(what, " did not print a JSON object (the AWS CLI's process credentials)"));
  }
  if (!answer.is_object()) throw ReadError(concat(what, " did not print a JSON object"));
  const auto version = answer.find("Version");
  if (version == answer.end() || !version->is_number_integer() || version->get<int64_t>() != 1) {
    throw ReadError(concat(what, " printed credentials of a Version other than 1 (the only one there is)"));
  }
  AwsCredentials credentials;
  credentials.access_key_id = string_field(answer, "AccessKeyId", true, what);
  credentials.secret_access_key = string_field(answer, "SecretAccessKey", true, what);
  credentials.session_token = string_field(answer, "SessionToken", false, what);
  const std::string expiration = string_field(answer, "Expiration", false, what);
  if (!expiration.empty()) {
    credentials.expiration = parse_iso8601(expiration);
    if (!credentials.expiration) {
      throw ReadError(concat(what, " printed an Expiration that is not an ISO 8601 time: '", expiration, "'"));
    }
  }
  credentials.source = concat(where, " (credential_process ", argv[0], ")");
  return credentials;
}

}  // namespace torch_shards::io::storage

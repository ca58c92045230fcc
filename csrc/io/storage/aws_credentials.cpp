#include "io/storage/aws_credentials.h"

#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "io/storage/credential_process.h"
#include "io/storage/refreshing_credentials.h"

namespace torch_shards::io::storage {

using core::concat;
using core::InvalidArgument;
using core::ReadError;

namespace {

using Values = std::map<std::string, std::string>;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }

std::string trim(const std::string& text) {
  size_t begin = 0, end = text.size();
  while (begin < end && is_space(text[begin])) ++begin;
  while (end > begin && is_space(text[end - 1])) --end;
  return text.substr(begin, end - begin);
}

std::string lower(std::string text) {
  for (char& c : text) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return text;
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

// A variable's value; "" counts as unset.
std::optional<std::string> get(const Environment& env, const std::string& name) {
  std::optional<std::string> value = env(name);
  if (value && value->empty()) return std::nullopt;
  return value;
}

std::string get_value(const Values& values, const std::string& key) {
  const auto found = values.find(key);
  return found == values.end() ? std::string() : found->second;
}

// true / 1 and false / 0, in any case; anything else is a mistake worth naming.
std::optional<bool> parse_bool(const std::string& text) {
  const std::string value = lower(trim(text));
  if (value == "true" || value == "1") return true;
  if (value == "false" || value == "0") return false;
  return std::nullopt;
}

std::optional<bool> env_bool(const Environment& env, const std::string& name) {
  const std::optional<std::string> value = get(env, name);
  if (!value) return std::nullopt;
  const std::optional<bool> parsed = parse_bool(*value);
  if (!parsed) throw InvalidArgument(concat(name, "='", *value, "' in the environment is neither true nor false"));
  return parsed;
}

// `key = value` (or `key: value`, as configparser also reads): the key (lower-cased) and the
// value, trimmed; nullopt when the line has no delimiter or an empty key.
std::optional<std::pair<std::string, std::string>> split_setting(const std::string& line) {
  const size_t delimiter = line.find_first_of("=:");
  if (delimiter == std::string::npos) return std::nullopt;
  std::string key = trim(line.substr(0, delimiter));
  if (key.empty()) return std::nullopt;
  return std::make_pair(lower(std::move(key)), trim(line.substr(delimiter + 1)));
}

// One of the two shared files: where it is and what it holds.
struct SharedFile {
  std::string path;  // "" when HOME is not set and no variable names the file
  std::string name;  // path, or "~/.aws/<file>" when it is ""
  bool found = false;
  AwsIniSections sections;

  // Why it holds nothing ("" when it was read), for messages.
  std::string missing() const {
    if (found) return "";
    return path.empty() ? " (HOME is not set)" : " (no such file)";
  }
};

std::string expand_home(const std::string& path, const std::optional<std::string>& home) {
  if (home && (path == "~" || starts_with(path, "~/"))) return *home + path.substr(1);
  return path;
}

SharedFile read_shared_file(const Environment& env, const std::string& variable, const std::string& file_name) {
  SharedFile file;
  const std::optional<std::string> home = get(env, "HOME");
  if (const std::optional<std::string> named = get(env, variable)) {
    file.path = expand_home(*named, home);
  } else if (home) {
    file.path = (std::filesystem::path(*home) / ".aws" / file_name).string();
  }
  file.name = file.path.empty() ? "~/.aws/" + file_name : file.path;
  if (file.path.empty()) return file;

  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(file.path, error);
  if (status.type() == std::filesystem::file_type::not_found) return file;  // as good as empty
  if (error) throw ReadError(concat("cannot read the AWS file ", file.path, ": ", error.message()));
  if (std::filesystem::is_directory(status)) {
    throw ReadError(concat("cannot read the AWS file ", file.path, ": it is a directory"));
  }
  std::ifstream in(file.path, std::ios::binary);
  if (!in) throw ReadError(concat("cannot read the AWS file ", file.path, ": ", std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ReadError(concat("cannot read the AWS file ", file.path, ": ", std::strerror(errno)));
  file.found = true;
  file.sections = parse_aws_ini(text.str(), file.path);
  return file;
}

// What a section of the config file is: a profile (`[default]`, `[profile NAME]`, or, as the
// CLI tolerates, `[NAME]`), a `[services NAME]` section, or something else (`[sso-session NAME]`).
struct ConfigSection {
  enum class Kind { kProfile, kServices, kOther } kind;
  std::string name;
  bool prefixed = false;  // `[profile NAME]` rather than `[NAME]`
};

std::string unquote(const std::string& text) {
  if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') && text.back() == text.front()) {
    return text.substr(1, text.size() - 2);
  }
  return text;
}

ConfigSection classify(const std::string& section) {
  size_t space = 0;
  while (space < section.size() && !is_space(section[space])) ++space;
  const std::string word = section.substr(0, space), rest = unquote(trim(section.substr(space)));
  if (!rest.empty()) {
    if (word == "profile") return {ConfigSection::Kind::kProfile, rest, true};
    if (word == "services") return {ConfigSection::Kind::kServices, rest, false};
    if (word == "sso-session") return {ConfigSection::Kind::kOther, rest, false};
  }
  return {ConfigSection::Kind::kProfile, section, false};
}

// A profile's settings in the config file: `[profile NAME]` over `[NAME]`.
struct ConfigProfile {
  bool found = false;
  std::string label;  // the section's name as written, e.g. "profile prod" or "default"
  Values values;
};

ConfigProfile config_profile(const SharedFile& config, const std::string& profile) {
  ConfigProfile result;
  result.label = profile == "default" ? "default" : "profile " + profile;
  const Values* bare = nullptr;
  const Values* prefixed = nullptr;
  for (const auto& [section, values] : config.sections) {
    const ConfigSection kind = classify(section);
    if (kind.kind != ConfigSection::Kind::kProfile || kind.name != profile) continue;
    if (kind.prefixed) {
      prefixed = &values;
      result.label = section;
    } else {
      bare = &values;
      if (!prefixed) result.label = section;
    }
  }
  if (bare) result.values = *bare;
  if (prefixed) {
    for (const auto& [key, value] : *prefixed) result.values[key] = value;
  }
  result.found = bare || prefixed;
  return result;
}

const Values* services_section(const SharedFile& config, const std::string& name, std::string* label) {
  for (const auto& [section, values] : config.sections) {
    const ConfigSection kind = classify(section);
    if (kind.kind == ConfigSection::Kind::kServices && kind.name == name) {
      *label = section;
      return &values;
    }
  }
  return nullptr;
}

// The static keys of one section; nullopt when it has none. Half a pair is a ReadError.
std::optional<AwsCredentials> section_credentials(const Values& values, const std::string& source,
                                                  const std::string& profile) {
  AwsCredentials credentials;
  credentials.access_key_id = get_value(values, "aws_access_key_id");
  credentials.secret_access_key = get_value(values, "aws_secret_access_key");
  if (credentials.access_key_id.empty() && credentials.secret_access_key.empty()) return std::nullopt;
  if (credentials.access_key_id.empty() || credentials.secret_access_key.empty()) {
    const char* has = credentials.access_key_id.empty() ? "aws_secret_access_key" : "aws_access_key_id";
    const char* lacks = credentials.access_key_id.empty() ? "aws_access_key_id" : "aws_secret_access_key";
    throw ReadError(concat(source, ": AWS profile '", profile, "' has ", has, " but no ", lacks));
  }
  credentials.session_token = get_value(values, "aws_session_token");
  credentials.source = source;
  return credentials;
}

// Keys of a profile that ask for credentials torch_shards does not fetch (they need the network):
// named in `searched`, so that a 403 says why the profile did not sign, and how to bridge them.
std::string unsupported_note(const Values& values, const std::string& profile) {
  for (const char* key : {"role_arn", "sso_session", "sso_start_url", "web_identity_token_file"}) {
    if (values.count(key)) {
      return concat(" (has ", key, ", which torch_shards does not resolve: give another profile credential_process = ",
                    "aws configure export-credentials --profile ", profile,
                    " --format process, or set the environment variables from `aws configure export-credentials "
                    "--profile ",
                    profile, " --format env`)");
    }
  }
  return "";
}

// A credential_process's credentials, run once per process until they are due to be fetched again
// (refresh_due): every opening resolves its options (where they are given, and again for each store), and
// an SSO or vault helper is not run for each.
AwsCredentials process_credentials(const std::string& command, const std::string& profile, const std::string& where,
                                   double timeout_s) {
  struct Fetched {
    AwsCredentials credentials;
    int64_t due = 0;
  };
  static std::mutex mutex;
  static std::map<std::string, Fetched> fetched;
  const std::string key = concat(command, '\n', profile, '\n', where);
  std::lock_guard<std::mutex> lock(mutex);
  const int64_t now = seconds_now();
  auto found = fetched.find(key);
  if (found != fetched.end() && now < found->second.due) return found->second.credentials;
  Fetched fresh{run_credential_process(command, profile, where, timeout_s), INT64_MAX};
  if (fresh.credentials.expiration) fresh.due = refresh_due(*fresh.credentials.expiration, now);
  return (fetched[key] = std::move(fresh)).credentials;
}

// Seconds a credential_process may take: TORCH_SHARDS_CREDENTIAL_PROCESS_TIMEOUT, else 60.
double credential_process_timeout(const Environment& env) {
  const std::optional<std::string> text = get(env, "TORCH_SHARDS_CREDENTIAL_PROCESS_TIMEOUT");
  if (!text) return 60;
  char* end = nullptr;
  const double seconds = std::strtod(text->c_str(), &end);
  if (end == text->c_str() || *end != '\0' || !(seconds > 0) || seconds > 86400) {
    throw InvalidArgument(
        concat("TORCH_SHARDS_CREDENTIAL_PROCESS_TIMEOUT must be seconds in (0, 86400], got '", *text, "'"));
  }
  return seconds;
}

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? separator : "") + parts[i];
  return out;
}

// Validates an endpoint URL (http:// or https://, a host, an optional numeric port, no
// whitespace, no '@') and drops one trailing '/'.
std::string checked_endpoint(std::string url, const std::string& where) {
  if (url.find('@') != std::string::npos) {
    // Not echoed: user information (user:password@host) may hold a password.
    throw InvalidArgument(concat("the endpoint_url from ", where,
                                 " holds an '@' (user information?); give credentials as AWS keys instead"));
  }
  const size_t separator = url.find("://");
  const std::string scheme = separator == std::string::npos ? "" : lower(url.substr(0, separator));
  bool valid = scheme == "http" || scheme == "https";
  for (char c : url) valid = valid && static_cast<unsigned char>(c) > 0x20 && c != 0x7f;
  if (valid) {
    const std::string rest = url.substr(separator + 3);
    const std::string authority = rest.substr(0, rest.find_first_of("/?#"));
    // host[:port], or [IPv6 address][:port]
    size_t host_end = starts_with(authority, "[") ? authority.find(']') : authority.find(':');
    if (host_end != std::string::npos && starts_with(authority, "[")) ++host_end;
    const std::string host = authority.substr(0, host_end);
    const std::string after = host_end == std::string::npos ? "" : authority.substr(host_end);
    valid = !host.empty() && host != "[]" && !(starts_with(authority, "[") && host_end == std::string::npos);
    if (!after.empty()) {
      valid = valid && after[0] == ':' && after.size() >= 2 && after.size() <= 6;
      for (size_t i = 1; i < after.size(); ++i) valid = valid && after[i] >= '0' && after[i] <= '9';
    }
  }
  if (!valid) {
    throw InvalidArgument(concat("endpoint_url '", url, "' (from ", where,
                                 ") is not an http:// or https:// URL with a host, e.g. http://localhost:9000"));
  }
  if (url.back() == '/') url.pop_back();
  return url;
}

// What botocore accepts as a region name (validate_region_name): it becomes part of host names.
std::string checked_region(const std::string& region, const std::string& where) {
  bool valid = !region.empty() && region.size() <= 63 && region.front() != '-' && region.back() != '-';
  for (char c : region) {
    valid = valid && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-');
  }
  if (!valid) {
    throw InvalidArgument(concat("AWS region '", region, "' (from ", where,
                                 ") is not a region name: letters, digits and '-', e.g. us-east-1"));
  }
  return region;
}

}  // namespace

AwsIniSections parse_aws_ini(const std::string& text, const std::string& path) {
  AwsIniSections sections;
  Values* section = nullptr;
  std::string key;            // the section's last top-level key ("" before the first)
  bool key_has_value = true;  // false: indented lines under it are sub-settings
  size_t key_indent = 0;
  std::istringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    if (number == 1 && starts_with(line, "\xEF\xBB\xBF")) line.erase(0, 3);  // a UTF-8 byte order mark
    const std::string content = trim(line);
    if (content.empty() || content[0] == '#' || content[0] == ';') continue;
    size_t indent = 0;
    while (indent < line.size() && is_space(line[indent])) ++indent;
    const auto fail = [&](const std::string& why) {
      // The line itself is left out: it may hold a secret.
      throw ReadError(concat(path, ":", number, ": ", why));
    };

    if (content[0] == '[') {
      // As configparser: the name runs to the last ']'; a comment may follow.
      const size_t close = content.rfind(']');
      const std::string after = close == std::string::npos ? "" : trim(content.substr(close + 1));
      if (close == std::string::npos || (!after.empty() && after[0] != '#' && after[0] != ';')) {
        fail("a section header that does not end with ']'");
      }
      const std::string name = trim(content.substr(1, close - 1));
      if (name.empty()) fail("a section header with no name");
      section = &sections[name];
      key.clear();
      key_has_value = true;
      continue;
    }
    const auto setting = split_setting(content);
    if (!key.empty() && indent > key_indent) {
      if (key_has_value) {
        fail(concat("an indented line continuing the value of '", key,
                    "' (values of more than one line are not supported)"));
      }
      if (!setting) fail(concat("an indented line under '", key, " =' that is not a 'key = value' sub-setting"));
      (*section)[key + "." + setting->first] = setting->second;
      continue;
    }
    if (!setting) fail("neither a [section], a 'key = value' setting nor a comment");
    if (!section) fail("a setting before any [section]");
    key = setting->first;
    key_has_value = !setting->second.empty();
    key_indent = indent;
    (*section)[key] = setting->second;
  }
  return sections;
}

Environment process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    if (const char* value = std::getenv(name.c_str())) return std::string(value);
    if (name == "HOME") {  // as os.path.expanduser does when HOME is unset
      std::vector<char> buffer(16384);
      passwd entry{};
      passwd* found = nullptr;
      if (::getpwuid_r(::getuid(), &entry, buffer.data(), buffer.size(), &found) == 0 && found && found->pw_dir) {
        return std::string(found->pw_dir);
      }
    }
    return std::nullopt;
  };
}

AwsSettings resolve_aws_settings(const AwsOptions& options, const Environment& env) {
  AwsSettings settings;

  // The profile, and who named it (nobody: "default").
  std::string named_by;
  if (!options.profile.empty()) {
    settings.profile = options.profile;
    named_by = "the profile option";
  } else if (const std::optional<std::string> profile = get(env, "AWS_PROFILE")) {
    settings.profile = *profile;
    named_by = "AWS_PROFILE";
  } else {
    settings.profile = "default";
  }
  const std::string& profile = settings.profile;

  // Both files are read (and must parse) whatever is used from them, as botocore does.
  const SharedFile credentials_file = read_shared_file(env, "AWS_SHARED_CREDENTIALS_FILE", "credentials");
  const SharedFile config_file = read_shared_file(env, "AWS_CONFIG_FILE", "config");
  const auto credentials_section = credentials_file.sections.find(profile);
  const bool in_credentials = credentials_section != credentials_file.sections.end();
  const ConfigProfile config = config_profile(config_file, profile);
  const std::string config_source = concat(config_file.name, " [", config.label, "]");

  // Anonymous: the option, else AWS_NO_SIGN_REQUEST.
  std::optional<bool> anonymous = options.anonymous;
  std::string anonymous_because = "the anonymous option is true";
  if (!anonymous) {
    anonymous = env_bool(env, "AWS_NO_SIGN_REQUEST");
    anonymous_because = "AWS_NO_SIGN_REQUEST is true in the environment";
  }

  // Credentials from the environment.
  std::vector<std::string> searched;
  if (anonymous != true) {
    const std::optional<std::string> key_id = get(env, "AWS_ACCESS_KEY_ID");
    const std::optional<std::string> secret = get(env, "AWS_SECRET_ACCESS_KEY");
    if (key_id.has_value() != secret.has_value()) {
      throw InvalidArgument(concat(key_id ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
                                   " is set in the environment but ",
                                   key_id ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID", " is not"));
    }
    if (key_id) {
      settings.credentials.access_key_id = *key_id;
      settings.credentials.secret_access_key = *secret;
      settings.credentials.session_token = get(env, "AWS_SESSION_TOKEN").value_or("");
      settings.credentials.source = "environment";
    } else {
      searched.push_back("the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)");
    }
  }

  // A profile somebody named must exist, unless nothing is wanted from it but credentials
  // and those came from the environment.
  if (!named_by.empty() && !in_credentials && !config.found && settings.credentials.empty()) {
    throw InvalidArgument(concat("AWS profile '", profile, "' (named by ", named_by, ") is in neither ",
                                 credentials_file.name, credentials_file.missing(), " nor ", config_file.name,
                                 config_file.missing()));
  }

  // Credentials from the files: the credentials file, then the config file.
  if (anonymous != true && settings.credentials.empty()) {
    const std::string source = concat(credentials_file.name, " [", profile, "]");
    if (in_credentials) {
      if (auto found = section_credentials(credentials_section->second, source, profile)) {
        settings.credentials = std::move(*found);
      } else {
        searched.push_back(source + " (no aws_access_key_id)" + unsupported_note(credentials_section->second, profile));
      }
    } else {
      searched.push_back(source + (credentials_file.found ? " (no such section)" : credentials_file.missing()));
    }
  }
  // A program's credentials (credential_process, in the credentials file's section, else the profile's).
  if (anonymous != true && settings.credentials.empty()) {
    const bool in_section = in_credentials && credentials_section->second.count("credential_process") > 0;
    const std::string command = in_section
                                    ? get_value(credentials_section->second, "credential_process")
                                    : (config.found ? get_value(config.values, "credential_process") : std::string());
    if (!command.empty()) {
      const std::string where = in_section ? concat(credentials_file.name, " [", profile, "]") : config_source;
      const double timeout_s = credential_process_timeout(env);
      settings.credentials = process_credentials(command, profile, where, timeout_s);
      settings.refresh = [command, profile, where, timeout_s] {
        return process_credentials(command, profile, where, timeout_s);
      };
    }
  }
  if (anonymous != true && settings.credentials.empty()) {
    if (config.found) {
      if (auto found = section_credentials(config.values, config_source, profile)) {
        settings.credentials = std::move(*found);
      } else {
        searched.push_back(config_source + " (no aws_access_key_id)" + unsupported_note(config.values, profile));
      }
    } else {
      searched.push_back(config_source + (config_file.found ? " (no such section)" : config_file.missing()));
    }
  }
  if (!settings.credentials.empty()) searched.push_back(settings.credentials.source);
  for (const char* variable : {"AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                               "AWS_CONTAINER_CREDENTIALS_FULL_URI"}) {
    if (settings.credentials.empty() && anonymous != true && get(env, variable)) {
      searched.push_back(concat(variable, " (set, but torch_shards does not fetch credentials from it)"));
    }
  }

  if (anonymous == true) {
    settings.anonymous = true;
    settings.searched = "nowhere: " + anonymous_because;
  } else if (settings.credentials.empty()) {
    if (anonymous == false) {
      throw InvalidArgument(concat("no AWS credentials found (and the anonymous option is false) for profile '",
                                   profile, "'; looked in: ", join(searched, "; ")));
    }
    settings.anonymous = true;  // unsigned requests, as for a public bucket
    settings.searched = join(searched, "; ");
  } else {
    settings.searched = join(searched, "; ");
  }

  // The region.
  if (!options.region.empty()) {
    settings.region = checked_region(options.region, "the region option");
  } else if (const std::optional<std::string> region = get(env, "AWS_REGION")) {
    settings.region = checked_region(*region, "AWS_REGION");
  } else if (const std::optional<std::string> region = get(env, "AWS_DEFAULT_REGION")) {
    settings.region = checked_region(*region, "AWS_DEFAULT_REGION");
  } else if (const std::string region = get_value(config.values, "region"); !region.empty()) {
    settings.region = checked_region(region, config_source);
  } else {
    settings.region = "us-east-1";
  }

  // The endpoint.
  if (!options.endpoint_url.empty()) {
    settings.endpoint_url = checked_endpoint(options.endpoint_url, "the endpoint_url option");
    return settings;
  }
  std::optional<bool> ignore_configured = env_bool(env, "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS");
  if (!ignore_configured) {
    if (const std::string value = get_value(config.values, "ignore_configured_endpoint_urls"); !value.empty()) {
      ignore_configured = parse_bool(value);
      if (!ignore_configured) {
        throw ReadError(
            concat(config_source, ": ignore_configured_endpoint_urls = '", value, "' is neither true nor false"));
      }
    }
  }
  if (ignore_configured == true) return settings;
  for (const char* variable : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}) {
    if (const std::optional<std::string> url = get(env, variable)) {
      settings.endpoint_url = checked_endpoint(*url, variable);
      return settings;
    }
  }
  std::vector<std::pair<std::string, std::string>> configured;  // (value, where)
  if (const std::string services = get_value(config.values, "services"); !services.empty()) {
    std::string label;
    if (const Values* section = services_section(config_file, services, &label)) {
      configured.emplace_back(get_value(*section, "s3.endpoint_url"),
                              concat(config_file.name, " [", label, "] s3.endpoint_url"));
    }
  }
  configured.emplace_back(get_value(config.values, "s3.endpoint_url"), config_source + " s3.endpoint_url");
  configured.emplace_back(get_value(config.values, "endpoint_url"), config_source + " endpoint_url");
  for (const auto& [url, where] : configured) {
    if (!url.empty()) {
      settings.endpoint_url = checked_endpoint(url, where);
      break;
    }
  }
  return settings;
}

}  // namespace torch_shards::io::storage

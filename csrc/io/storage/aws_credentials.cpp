#include "io/storage/aws_credentials.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "io/file.h"
#include "io/storage/credential_process.h"
#include "io/storage/inherited_table.h"
#include "io/storage/metadata_credentials.h"
#include "io/storage/refreshing_credentials.h"
#include "io/storage/sso_credentials.h"
#include "io/storage/sts_credentials.h"

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
// CLI tolerates, `[NAME]`), a `[services NAME]` section or an `[sso-session NAME]` section.
struct ConfigSection {
  enum class Kind { kProfile, kServices, kSsoSession } kind;
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
    if (word == "sso-session") return {ConfigSection::Kind::kSsoSession, rest, false};
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

// The `[services NAME]` or `[sso-session NAME]` section (kind) of the config file; null when none.
const Values* named_section(const SharedFile& config, ConfigSection::Kind kind_wanted, const std::string& name,
                            std::string* label) {
  for (const auto& [section, values] : config.sections) {
    const ConfigSection kind = classify(section);
    if (kind.kind == kind_wanted && kind.name == name) {
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

// Credentials fetched, by key, each with when it is due to be fetched again: for the processes forked from
// this one.
InheritedTable<std::string, std::pair<AwsCredentials, int64_t>>& fetched_before() {
  static InheritedTable<std::string, std::pair<AwsCredentials, int64_t>> table;
  return table;
}

// Credentials from a program or a service (`fetch`), fetched once per process under `key` until they are
// due to be fetched again (refresh_due): every opening resolves its options (where they are given, and
// again for each store), and an SSO helper, STS or a metadata service is not asked for each. A process
// forked from one that fetched them (a DataLoader worker) starts with them, as its parent would sign with
// them: eight workers per rank on 64 ranks, started afresh each epoch, would otherwise ask STS or a
// metadata service 512 times an epoch.
AwsCredentials fetched_once(const std::string& key, const std::function<AwsCredentials()>& fetch) {
  // One entry per key, each with its own lock: a role's fetch asks for its source's credentials (another
  // key) while its own entry is held.
  // Per process (per_process): a child forked while a thread of its parent fetched would otherwise find that
  // entry locked for ever. It starts from what was fetched before the fork.
  struct Fetched {
    std::mutex mutex;
    AwsCredentials credentials;
    int64_t due = 0;  // 0: never fetched
  };
  struct Table {
    Table() {
      for (const auto& [key, fetched] : fetched_before().snapshot()) {
        auto entry = std::make_shared<Fetched>();
        entry->credentials = fetched.first;
        entry->due = fetched.second;
        by_key.emplace(key, std::move(entry));
      }
    }
    std::mutex mutex;
    std::map<std::string, std::shared_ptr<Fetched>> by_key;
  };
  Table& table = per_process<Table>();
  std::shared_ptr<Fetched> entry;
  {
    std::lock_guard<std::mutex> lock(table.mutex);
    std::shared_ptr<Fetched>& slot = table.by_key[key];
    if (!slot) slot = std::make_shared<Fetched>();
    entry = slot;
  }
  std::lock_guard<std::mutex> lock(entry->mutex);
  const int64_t now = seconds_now();
  if (entry->due != 0 && now < entry->due) return entry->credentials;
  AwsCredentials credentials = fetch();
  entry->due = credentials.expiration ? refresh_due(*credentials.expiration, now) : INT64_MAX;
  entry->credentials = std::move(credentials);
  fetched_before().put(key, {entry->credentials, entry->due});
  return entry->credentials;
}

// Credentials and how to fetch them again (empty: they cannot expire).
struct Found {
  AwsCredentials credentials;
  std::function<AwsCredentials()> refresh;
};

// Found credentials that `fetch` gives, fetched once per process under `key`.
Found fetched(const std::string& key, std::function<AwsCredentials()> fetch) {
  Found found{fetched_once(key, fetch), nullptr};
  found.refresh = [key, fetch = std::move(fetch)] { return fetched_once(key, fetch); };
  return found;
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

namespace {

// Where a profile's credentials are resolved from.
struct Context {
  Environment env;
  const SharedFile& credentials_file;
  const SharedFile& config_file;
  std::string region;
  std::string sts_endpoint;
  bool ignore_configured_endpoints = false;
};

// A profile's sections in both files.
struct ProfileFiles {
  const Values* credentials = nullptr;  // its section of the credentials file (null: none)
  std::string credentials_source;       // "<file> [NAME]"
  ConfigProfile config;
  std::string config_source;  // "<file> [profile NAME]"
  bool found() const { return credentials != nullptr || config.found; }
};

ProfileFiles profile_files(const Context& context, const std::string& profile) {
  ProfileFiles files;
  const auto section = context.credentials_file.sections.find(profile);
  if (section != context.credentials_file.sections.end()) files.credentials = &section->second;
  files.credentials_source = concat(context.credentials_file.name, " [", profile, "]");
  files.config = config_profile(context.config_file, profile);
  files.config_source = concat(context.config_file.name, " [", files.config.label, "]");
  return files;
}

// A setting of the profile: the config file's, else the credentials file's ("" when neither has it);
// *where says which.
std::string profile_value(const ProfileFiles& files, const std::string& key, std::string* where = nullptr) {
  if (const std::string value = get_value(files.config.values, key); !value.empty()) {
    if (where) *where = files.config_source;
    return value;
  }
  if (files.credentials) {
    if (const std::string value = get_value(*files.credentials, key); !value.empty()) {
      if (where) *where = files.credentials_source;
      return value;
    }
  }
  return "";
}

std::optional<AwsCredentials> environment_credentials(const Environment& env) {
  const std::optional<std::string> key_id = get(env, "AWS_ACCESS_KEY_ID");
  const std::optional<std::string> secret = get(env, "AWS_SECRET_ACCESS_KEY");
  if (key_id.has_value() != secret.has_value()) {
    throw InvalidArgument(concat(key_id ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
                                 " is set in the environment but ",
                                 key_id ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID", " is not"));
  }
  if (!key_id) return std::nullopt;
  AwsCredentials credentials;
  credentials.access_key_id = *key_id;
  credentials.secret_access_key = *secret;
  credentials.session_token = get(env, "AWS_SESSION_TOKEN").value_or("");
  credentials.source = "environment";
  return credentials;
}

// No credentials where they were asked for: why, for `searched`.
struct NotFound : std::runtime_error {
  using std::runtime_error::runtime_error;
};

Found instance_found(const Environment& env) {
  const std::string key = concat("instance\n", get(env, "AWS_EC2_METADATA_SERVICE_ENDPOINT").value_or(""), '\n',
                                 get(env, "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE").value_or(""));
  return fetched(key, [env] {
    std::string why_not;
    std::optional<AwsCredentials> credentials = instance_credentials(env, &why_not);
    if (!credentials) throw NotFound(why_not);
    return *credentials;
  });
}

Found container_found(const Environment& env) {
  const std::string key = concat("container\n", get(env, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").value_or(""), '\n',
                                 get(env, "AWS_CONTAINER_CREDENTIALS_FULL_URI").value_or(""));
  return fetched(key, [env] {
    std::optional<AwsCredentials> credentials = container_credentials(env);
    if (!credentials) throw NotFound("the container (AWS_CONTAINER_CREDENTIALS_*_URI not set)");
    return *credentials;
  });
}

Found role_found(const Context& context, const RoleRequest& request, Found source) {
  const std::string key = concat("role\n", request.where, '\n', request.role_arn, '\n',
                                 source.credentials.access_key_id, '\n', request.web_identity_token_file);
  return fetched(key, [request, endpoint = context.sts_endpoint, region = context.region, source] {
    return assume_role(request, endpoint, region, source.refresh ? source.refresh() : source.credentials);
  });
}

int duration_seconds(const std::string& text, const std::string& where) {
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || value < 900 || value > 43200) {
    throw ReadError(concat(where, ": duration_seconds = '", text, "' is not seconds in [900, 43200]"));
  }
  return static_cast<int>(value);
}

std::optional<Found> profile_credentials(const Context& context, const std::string& profile,
                                         std::vector<std::string>& searched, std::vector<std::string>& chain, bool top);
std::string configured_endpoint(const Environment& env, const SharedFile& config_file, const ConfigProfile& config,
                                const std::string& config_source, const std::string& service);

// The credentials of the profile's SSO role (sso_session, or the older sso_start_url), nullopt when it has none.
std::optional<Found> sso_found(const Context& context, const std::string& profile, const ProfileFiles& files) {
  const Values& values = files.config.values;
  const std::string session = get_value(values, "sso_session");
  if (session.empty() && get_value(values, "sso_start_url").empty()) return std::nullopt;
  SsoRequest request;
  request.profile = profile;
  request.where = files.config_source;
  const Values* settings = &values;  // where sso_start_url and sso_region are
  std::string settings_where = files.config_source;
  if (!session.empty()) {
    std::string label;
    settings = named_section(context.config_file, ConfigSection::Kind::kSsoSession, session, &label);
    if (!settings) {
      throw InvalidArgument(concat(files.config_source, ": AWS profile '", profile, "' names sso_session '", session,
                                   "', which has no [sso-session ", session, "] section in ",
                                   context.config_file.name));
    }
    settings_where = concat(context.config_file.name, " [", label, "]");
  }
  request.start_url = get_value(*settings, "sso_start_url");
  const std::string region = get_value(*settings, "sso_region");
  request.account_id = get_value(values, "sso_account_id");
  request.role_name = get_value(values, "sso_role_name");
  for (const auto& [value, key, where] : {std::tuple{request.start_url, "sso_start_url", settings_where},
                                          std::tuple{region, "sso_region", settings_where},
                                          std::tuple{request.account_id, "sso_account_id", files.config_source},
                                          std::tuple{request.role_name, "sso_role_name", files.config_source}}) {
    if (value.empty()) {
      throw InvalidArgument(concat(where, ": AWS profile '", profile, "' uses SSO but ", key, " is not set"));
    }
  }
  checked_region(region, settings_where + " sso_region");
  // The service's configured endpoint (unless configured ones are ignored), else AWS's.
  const auto endpoint = [&](const std::string& service, const std::string& aws) {
    const std::string configured =
        context.ignore_configured_endpoints
            ? std::string()
            : configured_endpoint(context.env, context.config_file, files.config, files.config_source, service);
    return configured.empty() ? concat("https://", aws, ".", region, ".amazonaws.com") : configured;
  };
  request.endpoint = endpoint("sso", "portal.sso");
  if (!session.empty()) request.oidc_endpoint = endpoint("sso_oidc", "oidc");  // the older form has no refresh
  const std::optional<std::string> home = get(context.env, "HOME");
  if (!home)
    throw InvalidArgument(concat(files.config_source, ": AWS profile '", profile,
                                 "' uses SSO, whose login is kept under HOME, which is not set"));
  request.cache_dir = (std::filesystem::path(*home) / ".aws" / "sso" / "cache").string();
  return fetched(concat("sso\n", request.where, '\n', request.start_url, '\n', request.account_id, '\n',
                        request.role_name, '\n', request.endpoint),
                 [request] { return sso_role_credentials(request); });
}

// The credentials of the role the profile names (role_arn), nullopt when it names none. `chain`: the
// profiles whose source_profile led here.
std::optional<Found> role_credentials(const Context& context, const std::string& profile, const ProfileFiles& files,
                                      std::vector<std::string>& chain) {
  RoleRequest request;
  request.role_arn = profile_value(files, "role_arn", &request.where);
  if (request.role_arn.empty()) return std::nullopt;
  const std::string& where = request.where;
  const std::string bridge = concat("; bridge it with credential_process = aws configure export-credentials --profile ",
                                    profile, " --format process in another profile");
  if (!profile_value(files, "mfa_serial").empty()) {
    throw InvalidArgument(concat(where, ": the role of AWS profile '", profile,
                                 "' needs an MFA code (mfa_serial), which a job cannot type", bridge));
  }
  request.session_name = profile_value(files, "role_session_name");
  request.external_id = profile_value(files, "external_id");
  if (const std::string duration = profile_value(files, "duration_seconds"); !duration.empty()) {
    request.duration_s = duration_seconds(duration, where);
  }
  request.web_identity_token_file =
      expand_home(profile_value(files, "web_identity_token_file"), get(context.env, "HOME"));
  const std::string source_profile = profile_value(files, "source_profile");
  const std::string credential_source = profile_value(files, "credential_source");
  if (!source_profile.empty() && !credential_source.empty()) {
    throw InvalidArgument(concat(where, ": AWS profile '", profile,
                                 "' has both source_profile and credential_source; a role takes one of them"));
  }
  if (!request.web_identity_token_file.empty()) return role_found(context, request, Found{});

  Found source;
  if (source_profile == profile) {
    // A profile that is its own source holds the keys the role is assumed with (as botocore reads it).
    std::optional<AwsCredentials> keys;
    if (files.credentials) keys = section_credentials(*files.credentials, files.credentials_source, profile);
    if (!keys && files.config.found) keys = section_credentials(files.config.values, files.config_source, profile);
    if (!keys) {
      throw ReadError(
          concat(where, ": AWS profile '", profile, "' is its own source_profile but holds no aws_access_key_id"));
    }
    source.credentials = *keys;
  } else if (!source_profile.empty()) {
    if (std::find(chain.begin(), chain.end(), source_profile) != chain.end()) {
      throw InvalidArgument(concat(where, ": the source_profile of AWS profile '", profile, "' leads back to '",
                                   source_profile, "' (", join(chain, " -> "), " -> ", profile, ")"));
    }
    if (chain.size() >= 8) {
      throw InvalidArgument(
          concat(where, ": AWS profiles' roles chained more than 8 deep (", join(chain, " -> "), ")"));
    }
    if (!profile_files(context, source_profile).found()) {
      throw InvalidArgument(concat(where, ": the source_profile '", source_profile, "' of AWS profile '", profile,
                                   "' is in neither ", context.credentials_file.name, " nor ",
                                   context.config_file.name));
    }
    std::vector<std::string> looked;
    chain.push_back(profile);
    std::optional<Found> found = profile_credentials(context, source_profile, looked, chain, false);
    chain.pop_back();
    if (!found) {
      throw ReadError(concat(where, ": the source_profile '", source_profile, "' of AWS profile '", profile,
                             "' has no credentials; looked in: ", join(looked, "; ")));
    }
    source = std::move(*found);
  } else if (credential_source == "Environment") {
    std::optional<AwsCredentials> keys = environment_credentials(context.env);
    if (!keys) {
      throw ReadError(concat(where, ": AWS profile '", profile,
                             "' takes its role's source credentials from the environment, which has no "
                             "AWS_ACCESS_KEY_ID"));
    }
    source.credentials = *keys;
  } else if (credential_source == "Ec2InstanceMetadata" || credential_source == "EcsContainer") {
    try {
      source = credential_source == "EcsContainer" ? container_found(context.env) : instance_found(context.env);
    } catch (const NotFound& why) {
      throw ReadError(concat(where, ": AWS profile '", profile, "' takes its role's source credentials from ",
                             credential_source, ", which has none: ", why.what()));
    }
  } else if (!credential_source.empty()) {
    throw InvalidArgument(concat(where, ": credential_source = '", credential_source, "' of AWS profile '", profile,
                                 "' is none of Environment, Ec2InstanceMetadata, EcsContainer"));
  } else {
    throw InvalidArgument(concat(where, ": AWS profile '", profile,
                                 "' has a role_arn but no source_profile, credential_source or "
                                 "web_identity_token_file to assume it with"));
  }
  return role_found(context, request, std::move(source));
}

// A role for the web identity in the environment (AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE).
std::optional<Found> environment_role(const Context& context, std::vector<std::string>& searched) {
  const std::optional<std::string> role = get(context.env, "AWS_ROLE_ARN");
  const std::optional<std::string> token_file = get(context.env, "AWS_WEB_IDENTITY_TOKEN_FILE");
  if (!role && !token_file) return std::nullopt;
  if (!role || !token_file) {
    searched.push_back(concat(role ? "AWS_ROLE_ARN" : "AWS_WEB_IDENTITY_TOKEN_FILE", " (set, but ",
                              role ? "AWS_WEB_IDENTITY_TOKEN_FILE" : "AWS_ROLE_ARN", " is not)"));
    return std::nullopt;
  }
  RoleRequest request;
  request.role_arn = *role;
  request.web_identity_token_file = *token_file;
  request.session_name = get(context.env, "AWS_ROLE_SESSION_NAME").value_or("");
  request.where = "AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE";
  return role_found(context, request, Found{});
}

// The credentials a profile gives by itself (its role, its keys, its program), nullopt when none;
// `searched` gets the places looked in. top: the profile the options chose (the environment's web
// identity is looked at after its role), not a source_profile.
std::optional<Found> profile_credentials(const Context& context, const std::string& profile,
                                         std::vector<std::string>& searched, std::vector<std::string>& chain,
                                         bool top) {
  const ProfileFiles files = profile_files(context, profile);
  if (std::optional<Found> role = role_credentials(context, profile, files, chain)) return role;
  if (top) {
    if (std::optional<Found> role = environment_role(context, searched)) return role;
  }
  if (std::optional<Found> sso = sso_found(context, profile, files)) return sso;
  if (files.credentials) {
    if (auto keys = section_credentials(*files.credentials, files.credentials_source, profile)) return Found{*keys, {}};
    if (files.credentials->count("credential_process") == 0) {
      searched.push_back(files.credentials_source + " (no aws_access_key_id)");
    }
  } else {
    const SharedFile& file = context.credentials_file;
    searched.push_back(files.credentials_source + (file.found ? " (no such section)" : file.missing()));
  }
  // A program's credentials (credential_process, in the credentials file's section, else the profile's).
  const bool in_section = files.credentials && files.credentials->count("credential_process") > 0;
  const std::string command = in_section ? get_value(*files.credentials, "credential_process")
                                         : get_value(files.config.values, "credential_process");
  if (!command.empty()) {
    const std::string where = in_section ? files.credentials_source : files.config_source;
    const double timeout_s = credential_process_timeout(context.env);
    return fetched(concat(command, '\n', profile, '\n', where), [command, profile, where, timeout_s] {
      return run_credential_process(command, profile, where, timeout_s);
    });
  }
  if (files.config.found) {
    if (auto keys = section_credentials(files.config.values, files.config_source, profile)) return Found{*keys, {}};
    searched.push_back(files.config_source + " (no aws_access_key_id)");
  } else {
    const SharedFile& file = context.config_file;
    searched.push_back(files.config_source + (file.found ? " (no such section)" : file.missing()));
  }
  return std::nullopt;
}

// Whether configured endpoints are ignored (AWS_IGNORE_CONFIGURED_ENDPOINT_URLS, else the profile's setting).
bool ignore_configured_endpoints(const Environment& env, const ConfigProfile& config,
                                 const std::string& config_source) {
  if (std::optional<bool> ignore = env_bool(env, "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")) return *ignore;
  const std::string value = get_value(config.values, "ignore_configured_endpoint_urls");
  if (value.empty()) return false;
  const std::optional<bool> ignore = parse_bool(value);
  if (!ignore) {
    throw ReadError(
        concat(config_source, ": ignore_configured_endpoint_urls = '", value, "' is neither true nor false"));
  }
  return *ignore;
}

// The endpoint configured for an AWS service ("s3", "sts", "sso", "sso_oidc"): AWS_ENDPOINT_URL_<SERVICE>,
// AWS_ENDPOINT_URL, the profile's services section's `<service>.endpoint_url`, the profile's `<service>.endpoint_url`,
// its `endpoint_url`; "" when none.
std::string configured_endpoint(const Environment& env, const SharedFile& config_file, const ConfigProfile& config,
                                const std::string& config_source, const std::string& service) {
  std::string upper = service;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const std::string& variable : {"AWS_ENDPOINT_URL_" + upper, std::string("AWS_ENDPOINT_URL")}) {
    if (const std::optional<std::string> url = get(env, variable)) return checked_endpoint(*url, variable);
  }
  std::vector<std::pair<std::string, std::string>> configured;  // (value, where)
  if (const std::string services = get_value(config.values, "services"); !services.empty()) {
    std::string label;
    if (const Values* section = named_section(config_file, ConfigSection::Kind::kServices, services, &label)) {
      configured.emplace_back(get_value(*section, service + ".endpoint_url"),
                              concat(config_file.name, " [", label, "] ", service, ".endpoint_url"));
    }
  }
  configured.emplace_back(get_value(config.values, service + ".endpoint_url"),
                          concat(config_source, " ", service, ".endpoint_url"));
  configured.emplace_back(get_value(config.values, "endpoint_url"), config_source + " endpoint_url");
  for (const auto& [url, where] : configured) {
    if (!url.empty()) return checked_endpoint(url, where);
  }
  return "";
}

}  // namespace

AwsCredentials answered_credentials(std::string access_key_id, std::string secret_access_key, std::string session_token,
                                    const std::string& expiration, const std::string& what, std::string source) {
  AwsCredentials credentials;
  credentials.access_key_id = std::move(access_key_id);
  credentials.secret_access_key = std::move(secret_access_key);
  credentials.session_token = std::move(session_token);
  credentials.expiration = parse_iso8601(expiration);
  if (!credentials.expiration) {
    throw ReadError(concat(what, ": the answer's Expiration is not an ISO 8601 time: '", expiration, "'"));
  }
  credentials.source = std::move(source);
  return credentials;
}

std::string read_token_file(const std::string& path, const std::string& name) {
  constexpr std::streamsize kMaxTokenBytes = 64 << 10;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ReadError(concat("cannot read ", name, " ", path, ": ", std::strerror(errno)));
  std::string token(static_cast<size_t>(kMaxTokenBytes) + 1, '\0');
  in.read(token.data(), kMaxTokenBytes + 1);
  if (in.bad()) throw ReadError(concat("cannot read ", name, " ", path, ": ", std::strerror(errno)));
  token.resize(static_cast<size_t>(in.gcount()));
  if (token.size() > static_cast<size_t>(kMaxTokenBytes)) {
    throw ReadError(concat(name, " ", path, " holds more than ", kMaxTokenBytes, " bytes"));
  }
  while (!token.empty() && is_space(token.back())) token.pop_back();
  return token;
}

std::optional<std::string> env_value(const Environment& env, const std::string& name) { return get(env, name); }

std::optional<bool> env_flag(const Environment& env, const std::string& name) { return env_bool(env, name); }

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
  const ConfigProfile config = config_profile(config_file, profile);
  const std::string config_source = concat(config_file.name, " [", config.label, "]");

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

  // The endpoints: S3's (the option first), STS's for roles.
  const bool ignore_configured = ignore_configured_endpoints(env, config, config_source);
  const auto endpoint = [&](const std::string& service) {
    return ignore_configured ? std::string() : configured_endpoint(env, config_file, config, config_source, service);
  };
  settings.endpoint_url = !options.endpoint_url.empty()
                              ? checked_endpoint(options.endpoint_url, "the endpoint_url option")
                              : endpoint("s3");
  std::string sts_endpoint = endpoint("sts");
  if (sts_endpoint.empty()) {
    sts_endpoint =
        concat("https://sts.", settings.region, ".amazonaws.com", starts_with(settings.region, "cn-") ? ".cn" : "");
  }
  const Context context{env, credentials_file, config_file, settings.region, sts_endpoint, ignore_configured};

  // Anonymous: the option, else AWS_NO_SIGN_REQUEST.
  std::optional<bool> anonymous = options.anonymous;
  std::string anonymous_because = "the anonymous option is true";
  if (!anonymous) {
    anonymous = env_bool(env, "AWS_NO_SIGN_REQUEST");
    anonymous_because = "AWS_NO_SIGN_REQUEST is true in the environment";
  }

  // Credentials from the environment, unless the options name a profile (as botocore's session with a
  // profile, and `aws --profile`, skip them).
  std::vector<std::string> searched;
  std::optional<Found> found;
  if (anonymous != true && options.profile.empty()) {
    if (std::optional<AwsCredentials> keys = environment_credentials(env)) {
      found = Found{*keys, {}};
    } else {
      searched.push_back("the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)");
    }
  }

  // A profile somebody named must exist, unless nothing is wanted from it but credentials
  // and those came from the environment.
  if (!named_by.empty() && !profile_files(context, profile).found() && !found) {
    throw InvalidArgument(concat("AWS profile '", profile, "' (named by ", named_by, ") is in neither ",
                                 credentials_file.name, credentials_file.missing(), " nor ", config_file.name,
                                 config_file.missing()));
  }

  // Then the profile's, then the machine's.
  if (anonymous != true && !found) {
    std::vector<std::string> chain;
    found = profile_credentials(context, profile, searched, chain, true);
  }
  if (anonymous != true && !found &&
      (get(env, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") || get(env, "AWS_CONTAINER_CREDENTIALS_FULL_URI"))) {
    found = container_found(env);
  }
  if (anonymous != true && !found) {
    try {
      found = instance_found(env);
    } catch (const NotFound& why) {
      searched.push_back(why.what());
    }
  }
  if (found) {
    settings.credentials = std::move(found->credentials);
    if (settings.credentials.expiration) settings.refresh = std::move(found->refresh);
    searched.push_back(settings.credentials.source);
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
  return settings;
}

}  // namespace torch_shards::io::storage

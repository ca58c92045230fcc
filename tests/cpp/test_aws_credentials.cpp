// io::storage::resolve_aws_settings: the AWS CLI's order for the profile,
// credentials (environment, credentials file, config file, else anonymous),
// region and endpoint; the shared files' INI syntax (sections, comments,
// sub-settings) and its errors (file:line, never a line's text); a profile named
// but missing; half a key pair; AWS_NO_SIGN_REQUEST; endpoint checks. Files go
// to a fresh mkdtemp directory; the environment is a map.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/errors.h"
#include "io/storage/aws_credentials.h"
#include "io/storage/credential_process.h"
#include "io/storage/refreshing_credentials.h"

using torch_shards::core::InvalidArgument;
using torch_shards::core::ReadError;
using torch_shards::io::storage::AwsCredentials;
using torch_shards::io::storage::AwsOptions;
using torch_shards::io::storage::AwsSettings;
using torch_shards::io::storage::Environment;
using torch_shards::io::storage::parse_aws_ini;
using torch_shards::io::storage::parse_iso8601;
using torch_shards::io::storage::process_environment;
using torch_shards::io::storage::RefreshingCredentials;
using torch_shards::io::storage::resolve_aws_settings;
using torch_shards::io::storage::split_command_line;

namespace {

namespace fs = std::filesystem;

// Values no message may ever hold.
const std::string kSecret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYSECRETKEY";
const std::string kToken = "IQoJb3JpZ2luX2VjSESSIONTOKEN";

// The message of the exception `action` throws as E; fails the test when it throws nothing or something else.
template <typename E>
std::string message_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const E& error) {
    return error.what();
  } catch (const std::exception& error) {
    ADD_FAILURE() << "threw another exception: " << error.what();
    return "";
  }
  ADD_FAILURE() << "threw nothing";
  return "";
}

class AwsResolve : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "aws_credentials_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    home_ = dir_ + "/home";
    fs::create_directories(home_ + "/.aws");
    env_["HOME"] = home_;
    env_["AWS_EC2_METADATA_DISABLED"] = "true";  // never a request to 169.254.169.254 from a test
  }
  void TearDown() override {
    std::error_code error;
    fs::remove_all(dir_, error);
  }

  std::string credentials_path() const { return home_ + "/.aws/credentials"; }
  std::string config_path() const { return home_ + "/.aws/config"; }

  static void write(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    out << text;
    ASSERT_TRUE(out.good()) << path;
  }
  void write_credentials(const std::string& text) { write(credentials_path(), text); }
  void write_config(const std::string& text) { write(config_path(), text); }

  Environment env() const {
    const std::map<std::string, std::string> vars = env_;
    return [vars](const std::string& name) -> std::optional<std::string> {
      const auto found = vars.find(name);
      if (found == vars.end()) return std::nullopt;
      return found->second;
    };
  }
  AwsSettings resolve(const AwsOptions& options = {}) const { return resolve_aws_settings(options, env()); }

  // The message `resolve(options)` throws as E; checks that no secret is in it.
  template <typename E>
  std::string failure(const AwsOptions& options = {}) const {
    const std::string message = message_of<E>([&] { resolve(options); });
    EXPECT_EQ(message.find(kSecret), std::string::npos) << message;
    EXPECT_EQ(message.find(kToken), std::string::npos) << message;
    return message;
  }

  std::string dir_, home_;
  std::map<std::string, std::string> env_;
};

AwsOptions with_profile(const std::string& profile) {
  AwsOptions options;
  options.profile = profile;
  return options;
}

AwsOptions with_anonymous(bool anonymous) {
  AwsOptions options;
  options.anonymous = anonymous;
  return options;
}

AwsOptions with_endpoint(const std::string& endpoint_url) {
  AwsOptions options;
  options.endpoint_url = endpoint_url;
  return options;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

// ---- the INI syntax ---------------------------------------------------------------------------

TEST(AwsIni, ReadsSectionsSettingsCommentsAndSubSettings) {
  const auto sections = parse_aws_ini(
      "\xEF\xBB\xBF# a comment\r\n"
      "; another\n"
      "\n"
      "[default]\n"
      "region = eu-west-1\r\n"
      "Output=json\n"
      "s3 =\n"
      "  endpoint_url = http://localhost:9000\n"
      "    # an indented comment\n"
      "\n"
      "  addressing_style = path\n"
      "secret = a=b=c\n"
      "[ profile prod ]  # a comment\n"
      "  region : us-west-2\n"
      "  empty =\n"
      "[default]\n"
      "output = text\n",
      "/x/config");
  ASSERT_EQ(sections.size(), 2u);
  const auto& base = sections.at("default");
  EXPECT_EQ(base.at("region"), "eu-west-1");
  EXPECT_EQ(base.at("output"), "text");  // keys lower-cased; the later value wins
  EXPECT_EQ(base.at("s3.endpoint_url"), "http://localhost:9000");
  EXPECT_EQ(base.at("s3.addressing_style"), "path");
  EXPECT_EQ(base.at("secret"), "a=b=c");  // split at the first '='
  const auto& prod = sections.at("profile prod");
  EXPECT_EQ(prod.at("region"), "us-west-2");  // an indented first key is a key; ':' delimits too
  EXPECT_EQ(prod.at("empty"), "");
  EXPECT_TRUE(parse_aws_ini("", "/x/config").empty());
}

TEST(AwsIni, MalformedLinesNameTheFileAndLineButNotTheText) {
  const std::vector<std::pair<std::string, int>> cases = {
      {"[default]\naws_secret_access_key " + kSecret + "\n", 2},  // no '='
      {"aws_secret_access_key = " + kSecret + "\n", 1},           // before any section
      {"[default\n", 1},                                          // unclosed header
      {"[default] x\n", 1},                                       // text after the header
      {"[ ]\n", 1},                                               // no name
      {"[default]\nregion = us-east-1\n  " + kSecret + "\n", 3},  // continuation of a value
      {"[default]\ns3 =\n  " + kSecret + "\n", 3},                // sub-setting without '='
      {"[default]\n= " + kSecret + "\n", 2},                      // no key
  };
  for (const auto& [text, line] : cases) {
    const std::string message = message_of<ReadError>([&] { parse_aws_ini(text, "/x/credentials"); });
    EXPECT_TRUE(contains(message, "/x/credentials:" + std::to_string(line) + ":")) << message;
    EXPECT_FALSE(contains(message, kSecret)) << message;
  }
}

// ---- profile and files ------------------------------------------------------------------------

TEST_F(AwsResolve, NothingConfiguredMeansAnonymousDefaultProfileInUsEast1) {
  const AwsSettings settings = resolve();
  EXPECT_EQ(settings.profile, "default");
  EXPECT_EQ(settings.region, "us-east-1");
  EXPECT_EQ(settings.endpoint_url, "");
  EXPECT_TRUE(settings.anonymous);
  EXPECT_TRUE(settings.credentials.empty());
  EXPECT_TRUE(contains(settings.searched, "AWS_ACCESS_KEY_ID")) << settings.searched;
  EXPECT_TRUE(contains(settings.searched, credentials_path() + " [default] (no such file)")) << settings.searched;
  EXPECT_TRUE(contains(settings.searched, config_path() + " [default] (no such file)")) << settings.searched;
}

TEST_F(AwsResolve, ProfileComesFromTheOptionThenAwsProfileThenDefault) {
  write_credentials("[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = " + kSecret +
                    "\n[env]\naws_access_key_id = AKIDENV\naws_secret_access_key = " + kSecret +
                    "\n[option]\naws_access_key_id = AKIDOPTION\naws_secret_access_key = " + kSecret + "\n");
  EXPECT_EQ(resolve().credentials.access_key_id, "AKIDDEFAULT");
  env_["AWS_PROFILE"] = "env";
  EXPECT_EQ(resolve().profile, "env");
  EXPECT_EQ(resolve().credentials.access_key_id, "AKIDENV");
  const AwsSettings settings = resolve(with_profile("option"));
  EXPECT_EQ(settings.profile, "option");
  EXPECT_EQ(settings.credentials.access_key_id, "AKIDOPTION");
  EXPECT_EQ(settings.credentials.source, credentials_path() + " [option]");
  env_["AWS_PROFILE"] = "";  // set but empty: unset
  EXPECT_EQ(resolve().profile, "default");
}

TEST_F(AwsResolve, AProfileNamedButInNeitherFileIsAnError) {
  write_config("[profile other]\nregion = eu-west-1\n");
  std::string message = failure<InvalidArgument>(with_profile("prod"));
  EXPECT_TRUE(contains(message, "'prod'")) << message;
  EXPECT_TRUE(contains(message, "profile option")) << message;
  EXPECT_TRUE(contains(message, credentials_path() + " (no such file)")) << message;
  EXPECT_TRUE(contains(message, config_path())) << message;

  env_["AWS_PROFILE"] = "staging";
  message = failure<InvalidArgument>();
  EXPECT_TRUE(contains(message, "'staging'") && contains(message, "AWS_PROFILE")) << message;
  // Even "default", when named.
  EXPECT_THROW(resolve(with_profile("default")), InvalidArgument);
  // But not when the credentials come from the environment.
  env_["AWS_ACCESS_KEY_ID"] = "AKIDENV";
  env_["AWS_SECRET_ACCESS_KEY"] = kSecret;
  const AwsSettings settings = resolve();
  EXPECT_EQ(settings.profile, "staging");
  EXPECT_EQ(settings.credentials.source, "environment");
  EXPECT_EQ(settings.region, "us-east-1");
}

TEST_F(AwsResolve, ConfigSectionsAreDefaultProfileNameOrBareName) {
  write_config(
      "[default]\nregion = eu-west-1\n"
      "[profile prod]\nregion = us-west-2\n"
      "[bare]\nregion = ap-south-1\n"
      "[both]\nregion = ca-central-1\noutput = json\n"
      "[profile both]\nregion = sa-east-1\n"
      "[sso-session corp]\nregion = me-south-1\n");
  EXPECT_EQ(resolve().region, "eu-west-1");
  EXPECT_EQ(resolve(with_profile("prod")).region, "us-west-2");
  EXPECT_EQ(resolve(with_profile("bare")).region, "ap-south-1");
  EXPECT_EQ(resolve(with_profile("both")).region, "sa-east-1");  // [profile NAME] over [NAME]
  EXPECT_THROW(resolve(with_profile("corp")), InvalidArgument);  // not a profile
  // In the credentials file a section is the profile's bare name.
  write_credentials("[profile prod2]\naws_access_key_id = AKID\naws_secret_access_key = " + kSecret + "\n");
  EXPECT_THROW(resolve(with_profile("prod2")), InvalidArgument);
  EXPECT_EQ(resolve(with_profile("profile prod2")).credentials.access_key_id, "AKID");
}

TEST_F(AwsResolve, FileLocationsComeFromTheEnvironment) {
  write_credentials("[default]\naws_access_key_id = AKIDHOME\naws_secret_access_key = " + kSecret + "\n");
  write_config("[default]\nregion = eu-west-1\n");
  write(dir_ + "/creds", "[default]\naws_access_key_id = AKIDVAR\naws_secret_access_key = " + kSecret + "\n");
  fs::create_directories(home_ + "/elsewhere");
  write(home_ + "/elsewhere/conf", "[default]\nregion = eu-north-1\n");
  env_["AWS_SHARED_CREDENTIALS_FILE"] = dir_ + "/creds";
  env_["AWS_CONFIG_FILE"] = "~/elsewhere/conf";  // ~ is HOME
  AwsSettings settings = resolve();
  EXPECT_EQ(settings.credentials.access_key_id, "AKIDVAR");
  EXPECT_EQ(settings.credentials.source, dir_ + "/creds [default]");
  EXPECT_EQ(settings.region, "eu-north-1");
  // Named files that do not exist are empty ones (not the files under HOME).
  env_["AWS_SHARED_CREDENTIALS_FILE"] = dir_ + "/missing";
  env_["AWS_CONFIG_FILE"] = dir_ + "/missing too";
  settings = resolve();
  EXPECT_TRUE(settings.anonymous);
  EXPECT_EQ(settings.region, "us-east-1");
  EXPECT_TRUE(contains(settings.searched, dir_ + "/missing [default] (no such file)")) << settings.searched;
  // No HOME and no variables: no files.
  env_.clear();
  env_["AWS_EC2_METADATA_DISABLED"] = "true";
  settings = resolve();
  EXPECT_TRUE(settings.anonymous);
  EXPECT_TRUE(contains(settings.searched, "HOME is not set")) << settings.searched;
}

TEST_F(AwsResolve, UnreadableOrMalformedFilesAreReadErrors) {
  fs::create_directories(config_path());  // a directory where the file should be
  std::string message = failure<ReadError>();
  EXPECT_TRUE(contains(message, config_path())) << message;
  fs::remove(config_path());

  write_credentials("[default]\naws_access_key_id = AKID\naws_secret_access_key " + kSecret + "\n");
  message = failure<ReadError>();
  EXPECT_TRUE(contains(message, credentials_path() + ":3:")) << message;
  // Even when the environment has the credentials, as with the CLI.
  env_["AWS_ACCESS_KEY_ID"] = "AKIDENV";
  env_["AWS_SECRET_ACCESS_KEY"] = kSecret;
  EXPECT_THROW(resolve(), ReadError);
}

// ---- credentials ------------------------------------------------------------------------------

TEST_F(AwsResolve, EnvironmentCredentialsComeFirst) {
  write_credentials("[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = filesecret\n");
  env_["AWS_ACCESS_KEY_ID"] = "AKIDENV";
  env_["AWS_SECRET_ACCESS_KEY"] = kSecret;
  env_["AWS_SESSION_TOKEN"] = kToken;
  const AwsSettings settings = resolve();
  EXPECT_FALSE(settings.anonymous);
  EXPECT_EQ(settings.credentials.access_key_id, "AKIDENV");
  EXPECT_EQ(settings.credentials.secret_access_key, kSecret);
  EXPECT_EQ(settings.credentials.session_token, kToken);
  EXPECT_EQ(settings.credentials.source, "environment");
  EXPECT_EQ(settings.searched, "environment");
  EXPECT_FALSE(contains(settings.searched, kSecret));
}

TEST_F(AwsResolve, HalfAPairInTheEnvironmentNamesTheMissingVariable) {
  env_["AWS_ACCESS_KEY_ID"] = "AKIDENV";
  std::string message = failure<InvalidArgument>();
  EXPECT_TRUE(contains(message, "AWS_SECRET_ACCESS_KEY is not")) << message;
  env_.erase("AWS_ACCESS_KEY_ID");
  env_["AWS_SECRET_ACCESS_KEY"] = kSecret;
  env_["AWS_SESSION_TOKEN"] = kToken;
  message = failure<InvalidArgument>();
  EXPECT_TRUE(contains(message, "AWS_ACCESS_KEY_ID is not")) << message;
  // A session token alone is no credential: ignored.
  env_.erase("AWS_SECRET_ACCESS_KEY");
  EXPECT_TRUE(resolve().anonymous);
}

TEST_F(AwsResolve, CredentialsFileComesBeforeConfigFile) {
  write_credentials("[default]\naws_access_key_id = AKIDCREDS\naws_secret_access_key = " + kSecret +
                    "\naws_session_token = " + kToken + "\n");
  write_config("[default]\naws_access_key_id = AKIDCONFIG\naws_secret_access_key = " + kSecret + "\n" +
               "[profile prod]\naws_access_key_id = AKIDPROD\naws_secret_access_key = " + kSecret + "\n");
  AwsSettings settings = resolve();
  EXPECT_EQ(settings.credentials.access_key_id, "AKIDCREDS");
  EXPECT_EQ(settings.credentials.session_token, kToken);
  EXPECT_EQ(settings.credentials.source, credentials_path() + " [default]");
  // The profile is only in the config file.
  settings = resolve(with_profile("prod"));
  EXPECT_FALSE(settings.anonymous);
  EXPECT_EQ(settings.credentials.access_key_id, "AKIDPROD");
  EXPECT_EQ(settings.credentials.secret_access_key, kSecret);
  EXPECT_EQ(settings.credentials.session_token, "");
  EXPECT_EQ(settings.credentials.source, config_path() + " [profile prod]");
  EXPECT_TRUE(contains(settings.searched, credentials_path() + " [prod] (no such section)")) << settings.searched;
  // A credentials file section without keys falls through to the config file.
  write_credentials("[default]\nregion = us-west-1\n");
  settings = resolve();
  EXPECT_EQ(settings.credentials.access_key_id, "AKIDCONFIG");
  EXPECT_EQ(settings.credentials.source, config_path() + " [default]");
}

TEST_F(AwsResolve, HalfAPairInAFileIsAReadErrorNamingFileAndProfile) {
  write_credentials("[prod]\naws_secret_access_key = " + kSecret + "\naws_session_token = " + kToken + "\n");
  std::string message = failure<ReadError>(with_profile("prod"));
  EXPECT_TRUE(contains(message, credentials_path() + " [prod]")) << message;
  EXPECT_TRUE(contains(message, "'prod'") && contains(message, "no aws_access_key_id")) << message;

  fs::remove(credentials_path());
  write_config("[profile prod]\naws_access_key_id = AKIDPROD\n");
  message = failure<ReadError>(with_profile("prod"));
  EXPECT_TRUE(contains(message, config_path() + " [profile prod]")) << message;
  EXPECT_TRUE(contains(message, "no aws_secret_access_key")) << message;
}

TEST_F(AwsResolve, NoCredentialsIsAnonymousUnlessCredentialsAreRequired) {
  write_config("[default]\nregion = eu-west-1\n");
  AwsSettings settings = resolve();
  EXPECT_TRUE(settings.anonymous);
  EXPECT_TRUE(settings.credentials.empty());
  EXPECT_EQ(settings.region, "eu-west-1");
  EXPECT_TRUE(contains(settings.searched, config_path() + " [default] (no aws_access_key_id)")) << settings.searched;

  const std::string message = failure<InvalidArgument>(with_anonymous(false));
  EXPECT_TRUE(contains(message, "no AWS credentials")) << message;
  EXPECT_TRUE(contains(message, "AWS_ACCESS_KEY_ID")) << message;
  EXPECT_TRUE(contains(message, credentials_path())) << message;
  EXPECT_TRUE(contains(message, config_path())) << message;
}

TEST_F(AwsResolve, AnonymousTrueIgnoresAllCredentials) {
  write_credentials("[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = " + kSecret + "\n");
  env_["AWS_ACCESS_KEY_ID"] = "AKIDENV";  // half a pair: not even looked at
  const AwsSettings settings = resolve(with_anonymous(true));
  EXPECT_TRUE(settings.anonymous);
  EXPECT_TRUE(settings.credentials.empty());
  EXPECT_TRUE(contains(settings.searched, "nowhere")) << settings.searched;
}

TEST_F(AwsResolve, SsoProfilesNeedTheirSettingsAndALoginBeforeAnyRequest) {
  // Each refused before a request is sent (no portal runs here): the message names the profile and what
  // is missing, or what to run.
  write_config("[profile no-section]\nsso_session = corp\nsso_account_id = 1\nsso_role_name = R\n");
  std::string message = failure<InvalidArgument>(with_profile("no-section"));
  EXPECT_TRUE(contains(message, "names sso_session 'corp'")) << message;
  write_config(
      "[profile no-role]\nsso_session = corp\nsso_account_id = 1\n"
      "[profile no-login]\nsso_session = corp\nsso_account_id = 1\nsso_role_name = R\n"
      "[sso-session corp]\nsso_start_url = https://corp.awsapps.com/start\nsso_region = eu-west-1\n");
  message = failure<InvalidArgument>(with_profile("no-role"));
  EXPECT_TRUE(contains(message, "'no-role' uses SSO but sso_role_name is not set")) << message;
  message = failure<ReadError>(with_profile("no-login"));
  EXPECT_TRUE(contains(message, "no SSO login for https://corp.awsapps.com/start")) << message;
  EXPECT_TRUE(contains(message, "aws sso login --profile no-login")) << message;
}

TEST_F(AwsResolve, NoSignRequestMeansAnonymousUnlessTheOptionSaysOtherwise) {
  env_["AWS_ACCESS_KEY_ID"] = "AKIDENV";
  env_["AWS_SECRET_ACCESS_KEY"] = kSecret;
  for (const char* value : {"true", "TRUE", "True", "1"}) {
    env_["AWS_NO_SIGN_REQUEST"] = value;
    const AwsSettings settings = resolve();
    EXPECT_TRUE(settings.anonymous) << value;
    EXPECT_TRUE(settings.credentials.empty()) << value;
    EXPECT_TRUE(contains(settings.searched, "AWS_NO_SIGN_REQUEST")) << settings.searched;
  }
  EXPECT_EQ(resolve(with_anonymous(false)).credentials.access_key_id, "AKIDENV");
  for (const char* value : {"false", "0", ""}) {
    env_["AWS_NO_SIGN_REQUEST"] = value;
    EXPECT_FALSE(resolve().anonymous) << value;
  }
  env_["AWS_NO_SIGN_REQUEST"] = "yes";
  const std::string message = failure<InvalidArgument>();
  EXPECT_TRUE(contains(message, "AWS_NO_SIGN_REQUEST") && contains(message, "'yes'")) << message;
  EXPECT_TRUE(resolve(with_anonymous(true)).anonymous);  // the option decides: the variable is not read
  // With no credentials anywhere and anonymous=false, the variable does not help.
  env_["AWS_NO_SIGN_REQUEST"] = "true";
  env_.erase("AWS_ACCESS_KEY_ID");
  env_.erase("AWS_SECRET_ACCESS_KEY");
  EXPECT_THROW(resolve(with_anonymous(false)), InvalidArgument);
}

// ---- region -----------------------------------------------------------------------------------

TEST_F(AwsResolve, RegionPrecedence) {
  write_config("[default]\nregion = eu-west-1\n");
  EXPECT_EQ(resolve().region, "eu-west-1");
  env_["AWS_DEFAULT_REGION"] = "eu-west-2";
  EXPECT_EQ(resolve().region, "eu-west-2");
  env_["AWS_REGION"] = "eu-west-3";
  EXPECT_EQ(resolve().region, "eu-west-3");
  AwsOptions options;
  options.region = "eu-central-1";
  EXPECT_EQ(resolve(options).region, "eu-central-1");
  env_["AWS_REGION"] = "";  // empty: unset
  EXPECT_EQ(resolve().region, "eu-west-2");
}

TEST_F(AwsResolve, InvalidRegionsNameTheValueAndWhereItCameFrom) {
  write_config("[default]\nregion = us-west-2 # Oregon\n");  // no inline comments, as in the CLI
  std::string message = failure<InvalidArgument>();
  EXPECT_TRUE(contains(message, "'us-west-2 # Oregon'") && contains(message, config_path() + " [default]")) << message;
  env_["AWS_REGION"] = "us_east_1";
  message = failure<InvalidArgument>();
  EXPECT_TRUE(contains(message, "'us_east_1'") && contains(message, "AWS_REGION")) << message;
}

// ---- endpoint ---------------------------------------------------------------------------------

TEST_F(AwsResolve, EndpointPrecedence) {
  write_config(
      "[default]\n"
      "endpoint_url = http://profile-global:1\n"
      "s3 =\n"
      "  endpoint_url = http://profile-s3:2\n"
      "services = local\n"
      "[services local]\n"
      "s3 =\n"
      "  endpoint_url = http://services-s3:3/\n"
      "[profile global]\n"
      "endpoint_url = https://only-global.example.com/\n");
  EXPECT_EQ(resolve().endpoint_url, "http://services-s3:3");
  EXPECT_EQ(resolve(with_profile("global")).endpoint_url, "https://only-global.example.com");
  env_["AWS_ENDPOINT_URL"] = "http://env-global:4";
  EXPECT_EQ(resolve().endpoint_url, "http://env-global:4");
  env_["AWS_ENDPOINT_URL_S3"] = "http://env-s3:5//";  // only one '/' goes
  EXPECT_EQ(resolve().endpoint_url, "http://env-s3:5/");
  EXPECT_EQ(resolve(with_endpoint("https://option.example.com/path/")).endpoint_url, "https://option.example.com/path");

  // Without the services section: the profile's s3 sub-setting, then its endpoint_url.
  env_.erase("AWS_ENDPOINT_URL");
  env_.erase("AWS_ENDPOINT_URL_S3");
  write_config("[default]\nendpoint_url = http://profile-global:1\ns3 =\n  endpoint_url = http://profile-s3:2\n");
  EXPECT_EQ(resolve().endpoint_url, "http://profile-s3:2");
  write_config("[default]\nendpoint_url = http://profile-global:1\n");
  EXPECT_EQ(resolve().endpoint_url, "http://profile-global:1");
  write_config("[default]\nregion = eu-west-1\n");
  EXPECT_EQ(resolve().endpoint_url, "");
}

TEST_F(AwsResolve, IgnoreConfiguredEndpointUrlsLeavesOnlyTheOption) {
  write_config(
      "[default]\nendpoint_url = http://config:1\n[profile off]\nendpoint_url = http://config:1\n"
      "ignore_configured_endpoint_urls = true\n");
  env_["AWS_ENDPOINT_URL_S3"] = "http://env:2";
  env_["AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"] = "true";
  EXPECT_EQ(resolve().endpoint_url, "");
  EXPECT_EQ(resolve(with_endpoint("http://option:3")).endpoint_url, "http://option:3");
  env_.erase("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS");
  EXPECT_EQ(resolve().endpoint_url, "http://env:2");
  EXPECT_EQ(resolve(with_profile("off")).endpoint_url, "");
}

TEST_F(AwsResolve, InvalidEndpointsNameTheValueAndWhereItCameFrom) {
  for (const std::string bad :
       {"localhost:9000", "ftp://host", "http://", "https:///bucket", "http://:9000", "http://host:port",
        "http://host:", "http://host:1234567", "http://ho st", "http://[::1", "s3.amazonaws.com"}) {
    const std::string message = failure<InvalidArgument>(with_endpoint(bad));
    EXPECT_TRUE(contains(message, "'" + bad + "'")) << message;
    EXPECT_TRUE(contains(message, "endpoint_url option")) << message;
  }
  for (const std::string good : {"http://localhost", "HTTPS://Host.Example.com:443", "http://[::1]:9000",
                                 "http://10.0.0.1:9000/prefix", "https://host?x=1"}) {
    EXPECT_EQ(resolve(with_endpoint(good)).endpoint_url, good);
  }
  // User information is refused without being echoed.
  std::string message = failure<InvalidArgument>(with_endpoint("http://user:" + kSecret + "@host"));
  EXPECT_TRUE(contains(message, "user information") && contains(message, "endpoint_url option")) << message;

  write_config("[profile minio]\ns3 =\n  endpoint_url = minio:9000\n");
  message = failure<InvalidArgument>(with_profile("minio"));
  EXPECT_TRUE(contains(message, "'minio:9000'")) << message;
  EXPECT_TRUE(contains(message, config_path() + " [profile minio] s3.endpoint_url")) << message;
  env_["AWS_ENDPOINT_URL"] = "localhost";
  message = failure<InvalidArgument>();
  EXPECT_TRUE(contains(message, "'localhost'") && contains(message, "AWS_ENDPOINT_URL")) << message;
}

// ---- secrets and the process environment ------------------------------------------------------

TEST_F(AwsResolve, NoMessageHoldsASecret) {
  // Every failure above goes through failure<E>(), which checks this; here the
  // settings' own message fields too.
  write_credentials("[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = " + kSecret +
                    "\naws_session_token = " + kToken + "\n");
  const AwsSettings settings = resolve();
  EXPECT_EQ(settings.credentials.secret_access_key, kSecret);
  for (const std::string& text : {settings.searched, settings.credentials.source}) {
    EXPECT_FALSE(contains(text, kSecret) || contains(text, kToken)) << text;
  }
  // A required-credentials failure after a half-read environment names the variables only.
  env_["AWS_SECRET_ACCESS_KEY"] = kSecret;
  env_["AWS_SESSION_TOKEN"] = kToken;
  const std::string message = failure<InvalidArgument>(with_anonymous(false));
  EXPECT_TRUE(contains(message, "AWS_ACCESS_KEY_ID")) << message;
}

// ---- credential_process ---------------------------------------------------------------------

namespace {

// A credential_process program: a shell script in the test's directory that runs `body`.
std::string write_program(const std::string& dir, const std::string& name, const std::string& body) {
  const std::string path = dir + "/" + name;
  std::ofstream out(path, std::ios::binary);
  out << "#!/bin/sh\n" << body << "\n";
  out.close();
  ::chmod(path.c_str(), 0755);
  return path;
}

std::string credentials_json(const std::string& key_id) {
  return "{\"Version\": 1, \"AccessKeyId\": \"" + key_id + "\", \"SecretAccessKey\": \"" + kSecret +
         "\", \"SessionToken\": \"" + kToken + "\", \"Expiration\": \"2099-01-01T00:00:00Z\"}";
}

}  // namespace

TEST(CredentialProcess, CommandLinesSplitAsAShellSplitsWords) {
  using Words = std::vector<std::string>;
  EXPECT_EQ(split_command_line("aws configure export-credentials --profile p --format process"),
            (Words{"aws", "configure", "export-credentials", "--profile", "p", "--format", "process"}));
  EXPECT_EQ(split_command_line("  /bin/tool  'two words' \"a \\\"q\\\" $x\" back\\ slash ''  "),
            (Words{"/bin/tool", "two words", "a \"q\" $x", "back slash", ""}));
  EXPECT_EQ(split_command_line(""), Words{});
  for (const char* bad : {"tool 'open", "tool \"open", "tool \\"}) {
    EXPECT_THROW(split_command_line(bad), InvalidArgument) << bad;
  }
}

TEST_F(AwsResolve, CredentialProcessPrintsTheProfilesCredentials) {
  // Its arguments reach it as the words of the line: the program prints the keys only when given them.
  const std::string program = write_program(
      dir_, "creds.sh",
      "[ \"$1\" = \"two words\" ] && [ \"$2\" = x ] || exit 9\necho '" + credentials_json("AKIDPROC") + "'");
  write_config("[profile proc]\ncredential_process = " + program + " 'two words' x\n");
  const AwsSettings settings = resolve(with_profile("proc"));
  EXPECT_FALSE(settings.anonymous);
  EXPECT_EQ(settings.credentials.access_key_id, "AKIDPROC");
  EXPECT_EQ(settings.credentials.secret_access_key, kSecret);
  EXPECT_EQ(settings.credentials.session_token, kToken);
  EXPECT_TRUE(contains(settings.credentials.source, "credential_process " + program)) << settings.credentials.source;
  EXPECT_TRUE(contains(settings.credentials.source, "[profile proc]")) << settings.credentials.source;
  EXPECT_FALSE(contains(settings.searched, kSecret) || contains(settings.searched, kToken)) << settings.searched;
}

TEST_F(AwsResolve, CredentialProcessComesAfterTheCredentialsFileBeforeTheConfigFilesKeys) {
  const std::string program = write_program(dir_, "creds.sh", "echo '" + credentials_json("AKIDPROC") + "'");
  write_config("[default]\ncredential_process = " + program +
               "\naws_access_key_id = AKIDCONFIG\naws_secret_access_key = s\n");
  EXPECT_EQ(resolve().credentials.access_key_id, "AKIDPROC");
  write_credentials("[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = s\n");
  EXPECT_EQ(resolve().credentials.access_key_id, "AKIDFILE");
  env_["AWS_ACCESS_KEY_ID"] = "AKIDENV";
  env_["AWS_SECRET_ACCESS_KEY"] = "s";
  EXPECT_EQ(resolve().credentials.access_key_id, "AKIDENV");
  // In the credentials file's section, it is that file's.
  env_.erase("AWS_ACCESS_KEY_ID");
  env_.erase("AWS_SECRET_ACCESS_KEY");
  write_credentials("[default]\ncredential_process = " + program + "\n");
  EXPECT_TRUE(contains(resolve().credentials.source, credentials_path())) << resolve().credentials.source;
  // Anonymous: it is not run.
  write_credentials("[default]\ncredential_process = " + write_program(dir_, "fails.sh", "exit 1") + "\n");
  EXPECT_TRUE(resolve(with_anonymous(true)).anonymous);
}

TEST_F(AwsResolve, CredentialProcessFailuresNameTheProfileAndProgramNeverItsOutput) {
  const auto with_program = [&](const std::string& body) {
    write_config("[profile proc]\ncredential_process = " + write_program(dir_, "creds.sh", body) + "\n");
  };
  const std::string secret_output = "echo '" + credentials_json("AKIDPROC") + "' | tr -d '{'";
  struct Case {
    std::string body, expected;
  };
  for (const Case& c : std::vector<Case>{
           {"echo 'the SSO session expired' >&2\nexit 3", "exited with status 3: the SSO session expired"},
           {secret_output, "did not print a JSON object"},
           {"echo '[1, 2]'", "did not print a JSON object"},
           {"echo '{\"Version\": 2, \"AccessKeyId\": \"A\", \"SecretAccessKey\": \"S\"}'", "Version other than 1"},
           {"echo '{\"Version\": 1, \"AccessKeyId\": \"A\"}'", "without SecretAccessKey"},
           {"echo '{\"Version\": 1, \"AccessKeyId\": 7, \"SecretAccessKey\": \"S\"}'", "AccessKeyId that is not"},
           {"kill -9 $$", "killed by signal 9"},
       }) {
    with_program(c.body);
    const std::string message = failure<ReadError>(with_profile("proc"));
    EXPECT_TRUE(contains(message, c.expected)) << c.body << " -> " << message;
    EXPECT_TRUE(contains(message, "AWS profile 'proc'")) << message;
    EXPECT_TRUE(contains(message, dir_ + "/creds.sh")) << message;
  }
  write_config("[profile proc]\ncredential_process = " + dir_ + "/no-such-program --flag\n");
  EXPECT_TRUE(contains(failure<ReadError>(with_profile("proc")), "cannot run"));
  write_config("[profile proc]\ncredential_process = 'unterminated\n");
  const std::string unterminated = failure<InvalidArgument>(with_profile("proc"));
  EXPECT_TRUE(contains(unterminated, "unterminated") && contains(unterminated, "AWS profile 'proc'")) << unterminated;
}

TEST(CredentialProcess, ExpirationsAreIso8601TimesWithAZone) {
  EXPECT_EQ(parse_iso8601("1970-01-01T00:00:00Z"), 0);
  EXPECT_EQ(parse_iso8601("2026-11-29T23:00:00Z"), 1795993200);
  EXPECT_EQ(parse_iso8601("2026-11-29T23:00:00.123456Z"), 1795993200);
  EXPECT_EQ(parse_iso8601("2026-11-30T00:30:00+01:30"), 1795993200);
  EXPECT_EQ(parse_iso8601("2026-11-29T22:00:00-01:00"), 1795993200);
  for (const char* bad : {"", "2026-11-29", "2026-11-29T23:00:00", "2026-11-29 23:00:00Z", "2026-13-01T00:00:00Z",
                          "2026-11-29T23:00:00.Z", "2026-11-29T23:00:00Zjunk", "2026-11-29T23:00:00+1:00"}) {
    EXPECT_EQ(parse_iso8601(bad), std::nullopt) << bad;
  }
}

TEST_F(AwsResolve, ACredentialProcessRunsOnceUntilItsCredentialsAreDueAndThenAgain) {
  const auto runs_of = [&](const std::string& counter) {
    std::ifstream runs(counter);
    return std::count(std::istreambuf_iterator<char>(runs), std::istreambuf_iterator<char>(), '\n');
  };
  const std::string counter = dir_ + "/runs";
  const std::string program =
      write_program(dir_, "creds.sh", "echo x >> '" + counter + "'\necho '" + credentials_json("AKIDPROC") + "'");
  write_config("[profile proc]\ncredential_process = " + program + "\n");
  const AwsSettings settings = resolve(with_profile("proc"));
  EXPECT_EQ(settings.credentials.expiration, parse_iso8601("2099-01-01T00:00:00Z"));
  ASSERT_TRUE(settings.refresh);
  // Resolved again (each opening does) or refreshed: not due before 2099, not run again.
  EXPECT_EQ(resolve(with_profile("proc")).credentials.access_key_id, "AKIDPROC");
  EXPECT_EQ(settings.refresh().access_key_id, "AKIDPROC");
  EXPECT_EQ(runs_of(counter), 1);
  // Credentials handed out expired are due a second later: then the program runs again.
  const std::string expired_counter = dir_ + "/expired_runs";
  const std::string expired =
      write_program(dir_, "expired.sh",
                    "echo x >> '" + expired_counter +
                        "'\necho '{\"Version\": 1, \"AccessKeyId\": \"A\", \"SecretAccessKey\": \"S\", \"Expiration\": "
                        "\"2000-01-01T00:00:00Z\"}'");
  write_config("[profile old]\ncredential_process = " + expired + "\n");
  const AwsSettings old = resolve(with_profile("old"));
  old.refresh();
  EXPECT_EQ(runs_of(expired_counter), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  old.refresh();
  EXPECT_EQ(runs_of(expired_counter), 2);
  write_config("[profile proc]\ncredential_process = " +
               write_program(dir_, "late.sh",
                             "echo '{\"Version\": 1, \"AccessKeyId\": \"A\", \"SecretAccessKey\": \"S\", "
                             "\"Expiration\": \"tomorrow\"}'") +
               "\n");
  EXPECT_TRUE(contains(failure<ReadError>(with_profile("proc")), "an Expiration that is not an ISO 8601 time"));
  // Keys from the files never expire: nothing to run again.
  write_config("[profile keys]\naws_access_key_id = AKIDCONFIG\naws_secret_access_key = s\n");
  EXPECT_FALSE(resolve(with_profile("keys")).refresh);
}

TEST(RefreshingCredentials, FetchedAgainBeforeTheyExpireAtMostOnceASecond) {
  int64_t now = 1000;
  int fetched = 0;
  bool fail = false;
  const auto credentials = [](const std::string& id, int64_t expiration) {
    AwsCredentials c;
    c.access_key_id = id;
    c.secret_access_key = "s";
    c.expiration = expiration;
    return c;
  };
  RefreshingCredentials refreshing(
      credentials("FIRST", 1000 + 3600),
      [&] {
        if (fail) throw ReadError("the SSO session has expired");
        ++fetched;
        return credentials("NEXT" + std::to_string(fetched), now + 3600);
      },
      [&] { return now; });
  EXPECT_EQ(refreshing.current().access_key_id, "FIRST");
  now = 1000 + 3600 - 301;  // more than the 5-minute margin before
  EXPECT_EQ(refreshing.current().access_key_id, "FIRST");
  now = 1000 + 3600 - 300;
  EXPECT_EQ(refreshing.current().access_key_id, "NEXT1");
  EXPECT_EQ(refreshing.current().access_key_id, "NEXT1");
  EXPECT_EQ(refreshing.refreshes(), 1);
  // A failed refresh while they hold keeps them and tries again a second later; after they expired it throws.
  now += 3600 - 300;
  fail = true;
  EXPECT_EQ(refreshing.current().access_key_id, "NEXT1");
  EXPECT_EQ(refreshing.current().access_key_id, "NEXT1");  // the same second: not run again
  now += 301;
  EXPECT_THROW(refreshing.current(), ReadError);
  fail = false;
  EXPECT_EQ(refreshing.current().access_key_id, "NEXT2");
  // Credentials that live 10 s are fetched again after 5; ones handed out already expired, once a second.
  RefreshingCredentials short_lived(
      credentials("SHORT", now + 10), [&] { return credentials("SHORT", now - 1); }, [&] { return now; });
  int64_t start = now;
  now = start + 4;
  short_lived.current();
  EXPECT_EQ(short_lived.refreshes(), 0);
  now = start + 5;
  short_lived.current();
  short_lived.current();
  EXPECT_EQ(short_lived.refreshes(), 1);
  now += 1;
  short_lived.current();
  EXPECT_EQ(short_lived.refreshes(), 2);
}

TEST_F(AwsResolve, ACredentialProcessThatHangsIsKilledAtTheTimeout) {
  write_config("[profile proc]\ncredential_process = " + write_program(dir_, "creds.sh", "sleep 30") + "\n");
  env_["TORCH_SHARDS_CREDENTIAL_PROCESS_TIMEOUT"] = "0.5";
  const auto start = std::chrono::steady_clock::now();
  const std::string message = failure<ReadError>(with_profile("proc"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_TRUE(contains(message, "did not finish within 0.5 s")) << message;
  env_["TORCH_SHARDS_CREDENTIAL_PROCESS_TIMEOUT"] = "soon";
  EXPECT_TRUE(contains(failure<InvalidArgument>(with_profile("proc")), "'soon'"));
}

TEST_F(AwsResolve, ACredentialProcessIsDoneWhenItExitsThoughAProcessItStartedHoldsItsOutput) {
  // The background sleep inherits the program's standard output and error and outlives it; the program
  // prints its credentials a while after starting it, then exits.
  const std::string pid_file = dir_ + "/background.pid";
  write_config("[profile proc]\ncredential_process = " +
               write_program(dir_, "creds.sh",
                             "sleep 30 &\necho $! > " + pid_file + "\nsleep 0.3\necho '" +
                                 credentials_json("AKIDBACKGROUND") + "'") +
               "\n");
  const auto start = std::chrono::steady_clock::now();
  const AwsSettings settings = resolve(with_profile("proc"));
  const auto took = std::chrono::steady_clock::now() - start;
  std::ifstream pid_in(pid_file);
  pid_t background = 0;
  pid_in >> background;
  if (background > 0) ::kill(background, SIGKILL);
  EXPECT_EQ(settings.credentials.access_key_id, "AKIDBACKGROUND");
  EXPECT_LT(took, std::chrono::seconds(5));  // not the background's 30 s, nor the 60 s timeout
}

TEST(AwsEnvironment, ProcessEnvironmentReadsGetenv) {
  ASSERT_EQ(::setenv("TORCH_SHARDS_AWS_TEST_VARIABLE", "value", 1), 0);
  const Environment env = process_environment();
  EXPECT_EQ(env("TORCH_SHARDS_AWS_TEST_VARIABLE"), std::optional<std::string>("value"));
  ::unsetenv("TORCH_SHARDS_AWS_TEST_VARIABLE");
  EXPECT_EQ(env("TORCH_SHARDS_AWS_TEST_VARIABLE"), std::nullopt);
  EXPECT_TRUE(env("HOME").has_value());
}

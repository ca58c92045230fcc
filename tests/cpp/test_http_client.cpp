// io::storage::HttpClient when the process has no file descriptor left: libcurl says only "Couldn't connect
// to server"; the response's error names the open files limit and what to change. The descriptors are used
// up for the test only (dup of /dev/null under a lowered soft limit), then given back.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "io/storage/http_client.h"

namespace torch_shards::io::storage {
namespace {

// A request to 127.0.0.1's port 9 (discard; nothing listens there in a test): refused, or no socket at all.
HttpResponse request_port_nine(const HttpClient& client) {
  HttpRequest request;
  request.url = "http://127.0.0.1:9/object";
  return client.perform(request);
}

TEST(HttpClient, RunningOutOfFileDescriptorsIsNamedInTheError) {
  ClientSettings settings;
  settings.retries = 0;
  settings.connect_timeout_s = 2;
  const HttpClient client(settings, Signing{});
  // libcurl loaded and this thread's handles made while descriptors are left (whatever the answer).
  const HttpResponse first = request_port_nine(client);
  EXPECT_EQ(first.error.find("open files"), std::string::npos) << first.error;

  struct rlimit saved {};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  const int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(null, 0);
  struct rlimit lowered = saved;
  lowered.rlim_cur = static_cast<rlim_t>(null + 16);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  std::vector<int> taken;
  for (int fd; (fd = fcntl(null, F_DUPFD_CLOEXEC, 0)) >= 0;) taken.push_back(fd);
  const HttpResponse starved = request_port_nine(client);
  for (const int fd : taken) close(fd);
  close(null);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);

  EXPECT_EQ(starved.status, 0);
  EXPECT_NE(starved.error.find("libcurl: "), std::string::npos) << starved.error;
  EXPECT_NE(starved.error.find(" open files (ulimit -n)"), std::string::npos) << starved.error;
  EXPECT_NE(starved.error.find("lower max_requests or num_threads"), std::string::npos) << starved.error;
}

}  // namespace
}  // namespace torch_shards::io::storage

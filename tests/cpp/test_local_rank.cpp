// The LOCAL_RANK / device cross-check of the device stage (damacy's), without a GPU.
#include <gtest/gtest.h>

#include "core/local_rank.h"

namespace torch_shards::core {
namespace {

TEST(LocalRank, NothingToCheckWithoutLocalRank) {
  EXPECT_EQ(check_local_rank(std::nullopt, 0, std::nullopt).problem, "");
  EXPECT_EQ(check_local_rank(3, 0, std::nullopt).problem, "");
}

TEST(LocalRank, CurrentDeviceMatchingLocalRankIsFine) {
  EXPECT_EQ(check_local_rank(std::nullopt, 2, 2).problem, "");
  EXPECT_EQ(check_local_rank(2, 2, 2).problem, "");
}

TEST(LocalRank, CurrentDeviceOtherThanLocalRankWarnsNamingBoth) {
  const DeviceCheck check = check_local_rank(std::nullopt, 0, 3);
  EXPECT_FALSE(check.error);
  EXPECT_NE(check.problem.find("the current device is cuda:0 but LOCAL_RANK=3"), std::string::npos) << check.problem;
  EXPECT_NE(check.problem.find("torch.cuda.set_device(local_rank)"), std::string::npos);
}

TEST(LocalRank, ExplicitIndexOtherThanTheCurrentDeviceIsAnError) {
  const DeviceCheck check = check_local_rank(1, 0, 0);
  EXPECT_TRUE(check.error);
  EXPECT_NE(check.problem.find("device=cuda:1 but LOCAL_RANK=0 and the current device is cuda:0"), std::string::npos)
      << check.problem;
}

}  // namespace
}  // namespace torch_shards::core

// torch_shards::build_info(): the C++ door's account of the build, what `python -m torch_shards info`
// prints.
#include <gtest/gtest.h>
#include <torch/version.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include <torch_shards/version.h>

TEST(BuildInfo, NamesTheVersionTheTorchAndEveryLibraryWithTheFileItRunsFrom) {
  const nlohmann::json info = nlohmann::json::parse(torch_shards::build_info());
  EXPECT_EQ(info.at("version").get<std::string>(), torch_shards::version());
  EXPECT_EQ(info.at("torch").get<std::string>(), std::to_string(TORCH_VERSION_MAJOR) + "." +
                                                     std::to_string(TORCH_VERSION_MINOR) + "." +
                                                     std::to_string(TORCH_VERSION_PATCH));
  std::set<std::string> names;
  for (const auto& library : info.at("libraries")) {
    names.insert(library.at("name").get<std::string>());
    EXPECT_FALSE(library.at("version").get<std::string>().empty());
    EXPECT_NE(library.at("location").get<std::string>(), "unknown");
  }
  EXPECT_EQ(names, (std::set<std::string>{"hdf5", "blosc", "lz4", "zstd", "zlib"}));
  EXPECT_TRUE(info.at("bundled_dependencies").is_boolean());
  EXPECT_TRUE(info.at("cpu").at("features").is_array());
}

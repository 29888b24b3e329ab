#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "interpose/config.h"

namespace gmem {
namespace {

TEST(Config, EmptyOrNullGivesTheTableDefaults) {
  for (const char* text : {static_cast<const char*>(nullptr), "", ",,"}) {
    ConfigResult r = parse_config(text);
    EXPECT_EQ(r.error, "");
    EXPECT_FALSE(r.config.disable);
    EXPECT_FALSE(r.config.report);
    EXPECT_EQ(r.config.log_level, spdlog::level::warn);
  }
}

TEST(Config, ReadsEveryKey) {
  ConfigResult r = parse_config("disable:1,report:true,log_level:debug");
  ASSERT_EQ(r.error, "");
  EXPECT_TRUE(r.config.disable);
  EXPECT_TRUE(r.config.report);
  EXPECT_EQ(r.config.log_level, spdlog::level::debug);
  EXPECT_EQ(parse_config("pool:vmm").config.pool, config_type::source::vmm);
  EXPECT_EQ(parse_config("").config.pool, config_type::source::driver);
  EXPECT_EQ(parse_config("pool:heap").error, "bad value 'heap' for key 'pool' (expected driver or vmm)");
  EXPECT_EQ(parse_config("log_level:off").config.log_level, spdlog::level::off);
  EXPECT_EQ(parse_config("log_level:warn").config.log_level, spdlog::level::warn);
}

TEST(Config, UnknownKeyNamesTheValidKeys) {
  ConfigResult r = parse_config("report:1,repot:1");
  EXPECT_EQ(r.error, "unknown key 'repot' (valid keys: disable, report, pool, pool_headroom, stats, stats_dir, dedup, dedup_socket, log_level)");
}

TEST(Config, BadValueSaysWhatIsExpected) {
  EXPECT_EQ(parse_config("report:yes").error, "bad value 'yes' for key 'report' (expected 0 or 1)");
  EXPECT_NE(parse_config("log_level:loud").error.find("expected one of trace, debug"), std::string::npos);
  EXPECT_NE(parse_config("disable:").error, "");
  EXPECT_EQ(parse_config("pool_headroom:25").config.pool_headroom, 25.0);
  EXPECT_EQ(parse_config("pool_headroom:-1").error,
            "bad value '-1' for key 'pool_headroom' (expected a percentage from 0 to 1000)");
  EXPECT_NE(parse_config("pool_headroom:5x").error, "");
  EXPECT_EQ(parse_config("stats_dir:run/gmem").error,
            "bad value 'run/gmem' for key 'stats_dir' (expected an absolute path)");
  EXPECT_FALSE(parse_config("").config.dedup);
  EXPECT_TRUE(parse_config("dedup:1").config.dedup);
  EXPECT_EQ(parse_config("dedup_socket:/tmp/d.sock").config.dedup_socket.path, "/tmp/d.sock");
  EXPECT_EQ(parse_config("dedup_socket:").config.dedup_socket.path, "");
  EXPECT_EQ(parse_config("dedup_socket:d.sock").error,
            "bad value 'd.sock' for key 'dedup_socket' (expected an absolute path, or nothing for the default)");
}

TEST(Config, ItemWithoutColonIsAnError) {
  EXPECT_EQ(parse_config("report").error, "'report' is not key:value (valid keys: disable, report, pool, pool_headroom, stats, stats_dir, dedup, dedup_socket, log_level)");
}

TEST(Config, ReadmeDocumentsEveryKeyFromTheTable) {
  std::ifstream in(GMEM_README_PATH);
  std::stringstream readme;
  readme << in.rdbuf();
  ASSERT_FALSE(readme.str().empty());
#define GMEM_README_ROW(name, type, default_value, doc) \
  EXPECT_NE(readme.str().find("| `" #name "` | `" default_value "` | " doc " |\n"), std::string::npos) << #name;
  GMEM_CONFIG_KEYS(GMEM_README_ROW)
#undef GMEM_README_ROW
}

}  // namespace
}  // namespace gmem

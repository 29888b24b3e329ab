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
    EXPECT_EQ(r.config.log_level, LogLevel::warn);
  }
}

TEST(Config, ReadsEveryKey) {
  ConfigResult r = parse_config("disable:1,report:true,log_level:debug");
  ASSERT_EQ(r.error, "");
  EXPECT_TRUE(r.config.disable);
  EXPECT_TRUE(r.config.report);
  EXPECT_EQ(r.config.log_level, LogLevel::debug);
  EXPECT_EQ(parse_config("pool:vmm").config.pool, config_type::source::vmm);
  EXPECT_EQ(parse_config("").config.pool, config_type::source::vmm);
  EXPECT_EQ(parse_config("pool:driver").config.pool, config_type::source::driver);
  EXPECT_TRUE(parse_config("").config.torch_retry);
  EXPECT_FALSE(parse_config("torch_retry:0").config.torch_retry);
  EXPECT_EQ(parse_config("pool:heap").error, "bad value 'heap' for key 'pool' (expected driver or vmm)");
  EXPECT_EQ(parse_config("log_level:off").config.log_level, LogLevel::off);
  EXPECT_EQ(parse_config("log_level:warn").config.log_level, LogLevel::warn);
}

TEST(Config, UnknownKeyNamesTheValidKeys) {
  ConfigResult r = parse_config("report:1,repot:1");
  EXPECT_EQ(r.error, "unknown key 'repot' (valid keys: " + config_key_list() + ")");
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
            "bad value 'd.sock' for key 'dedup_socket' (expected an absolute path, or nothing)");
  EXPECT_TRUE(parse_config("plan_file:auto").config.plan_file.automatic);
  EXPECT_EQ(parse_config("plan_file:auto").config.plan_file.path, "");
  EXPECT_FALSE(parse_config("plan_file:/tmp/j.plan").config.plan_file.automatic);
  EXPECT_EQ(parse_config("plan_file:/tmp/j.plan").config.plan_file.path, "/tmp/j.plan");
  EXPECT_FALSE(parse_config("").config.plan_file.automatic);
  EXPECT_EQ(parse_config("plan_file:j.plan").error,
            "bad value 'j.plan' for key 'plan_file' (expected an absolute path, auto, or nothing)");
}

TEST(Config, BudgetsAreSizesOrShares) {
  const ConfigResult defaults = parse_config("");
  EXPECT_EQ(defaults.config.device_budget.of(80ull << 30), 80ull << 30);  // the whole device
  EXPECT_EQ(defaults.config.peer_reserve.of(1000), 100u);
  EXPECT_EQ(defaults.config.host_budget.of(1000), 500u);
  EXPECT_EQ(defaults.config.mem_info, pool::MemInfo::device);
  ConfigResult r = parse_config("device_budget:60G,peer_budget:512M,peer_reserve:4096,host_budget:1T,mem_info:tiers");
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.config.device_budget.of(80ull << 30), 60ull << 30);  // a size ignores the capacity
  EXPECT_EQ(r.config.peer_budget.of(1), 512ull << 20);
  EXPECT_EQ(r.config.peer_reserve.of(1), 4096u);
  EXPECT_EQ(r.config.host_budget.of(1), 1ull << 40);
  EXPECT_EQ(r.config.mem_info, pool::MemInfo::tiers);
  EXPECT_EQ(parse_config("host_budget:25%").config.host_budget.of(1000), 250u);
  EXPECT_EQ(parse_config("peer_budget:0").config.peer_budget.of(1ull << 40), 0u);
  EXPECT_EQ(parse_config("host_budget:12X").error,
            "bad value '12X' for key 'host_budget' (expected a size in bytes with an optional K, M, G or T suffix "
            "(64G), or a percentage (50%))");
  for (const char* bad : {"device_budget:", "device_budget:-1G", "device_budget:150%", "device_budget:G",
                          "device_budget:5%%", "device_budget:99999999999999999999", "device_budget:20000000T",
                          "mem_info:host"}) {
    EXPECT_NE(parse_config(bad).error, "") << bad;
  }
}

TEST(Config, BringInIsOffTriedOrAlways) {
  EXPECT_EQ(parse_config("").config.bring_in, pool::BringIn::tried);
  EXPECT_EQ(parse_config("bring_in:off").config.bring_in, pool::BringIn::off);
  EXPECT_EQ(parse_config("bring_in:always").config.bring_in, pool::BringIn::always);
  EXPECT_EQ(parse_config("bring_in:1").error, "bad value '1' for key 'bring_in' (expected off, tried or always)");
}

TEST(Config, EvictIsOffAlwaysOrTried) {
  EXPECT_EQ(parse_config("").config.evict, pool::Evict::off);
  EXPECT_EQ(parse_config("evict:1").config.evict, pool::Evict::always);
  EXPECT_EQ(parse_config("evict:tried").config.evict, pool::Evict::tried);
  EXPECT_EQ(parse_config("evict:0").config.evict, pool::Evict::off);
  EXPECT_EQ(parse_config("evict:yes").error, "bad value 'yes' for key 'evict' (expected 0, 1 or tried)");
}

TEST(Config, ItemWithoutColonIsAnError) {
  EXPECT_EQ(parse_config("report").error, "'report' is not key:value (valid keys: " + config_key_list() + ")");
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

// The start-time checks of ckptd's configuration (src/daemon/service_checks.h) on their
// own; tests/integration/service_test.cc runs them through the real daemon.
#include "daemon/service_checks.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "support/test_env.h"

namespace ckpt::daemon {
namespace {

TEST(ParseModeBitsTest, TakesOctalUpTo0777AndNamesTheKeyOtherwise) {
  EXPECT_EQ(*ParseModeBits("m", "0644"), 0644u);
  EXPECT_EQ(*ParseModeBits("m", "640"), 0640u);
  EXPECT_EQ(*ParseModeBits("m", "0"), 0u);
  EXPECT_EQ(*ParseModeBits("m", "0777"), 0777u);
  for (const char* bad : {"", "0668", "640x", "1777", "04755", "rw-r--r--", " 0644", "-644", "00644"}) {
    auto r = ParseModeBits("metrics-file-mode", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("metrics-file-mode = '" + std::string(bad) + "'"), std::string::npos)
        << r.status().message();
  }
}

TEST(MemoryBudgetWarningsTest, NoneForNoBudgetOrOneThatFits) {
  EXPECT_TRUE(MemoryBudgetWarnings(0).empty());
  EXPECT_TRUE(MemoryBudgetWarnings(1 << 20).empty());
}

TEST(MemoryBudgetWarningsTest, NamesTheFileSystemAndPhysicalMemory) {
  const uint64_t huge = uint64_t{1} << 50;  // 1 PiB
  auto warnings = MemoryBudgetWarnings(huge, "/dev/shm");
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("larger than /dev/shm"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[1].find("physical memory"), std::string::npos) << warnings[1];
  // Another file system is measured as named.
  testing::ScratchDir dir;
  auto other = MemoryBudgetWarnings(huge, dir.path());
  ASSERT_FALSE(other.empty());
  EXPECT_NE(other[0].find("larger than " + dir.path()), std::string::npos) << other[0];
}

TEST(CheckServiceConfigTest, AcceptsWhatExistsAndRefusesWhatDoesNot) {
  testing::ScratchDir dir;
  ServerOptions o;
  o.socket_path = dir.File("ckptd.sock");
  o.model_roots = {dir.path()};
  o.metrics_file = dir.File("ckptd.prom");
  EXPECT_TRUE(CheckServiceConfig(o).ok()) << CheckServiceConfig(o).ToString();
  o.socket_path = dir.File("no-dir/ckptd.sock");
  EXPECT_NE(CheckServiceConfig(o).message().find("its directory " + dir.File("no-dir") + " does not exist"),
            std::string::npos) << CheckServiceConfig(o).ToString();
  o.socket_path = dir.File("ckptd.sock");
  o.model_roots = {"relative/models"};
  EXPECT_NE(CheckServiceConfig(o).message().find("not an absolute path"), std::string::npos);
  o.model_roots = {dir.path()};
  o.metrics_file = "ckptd.prom";
  EXPECT_NE(CheckServiceConfig(o).message().find("metrics-file 'ckptd.prom' is not an absolute path"),
            std::string::npos);
  o.metrics_file.clear();
  o.metrics_file_group = "root";
  EXPECT_NE(CheckServiceConfig(o).message().find("metrics-file-group is set but metrics-file is not"),
            std::string::npos);
}

TEST(IsConfigurationErrorTest, ConfigurationCodesOnly) {
  EXPECT_TRUE(IsConfigurationError(InvalidArgument("x")));
  EXPECT_TRUE(IsConfigurationError(NotFound("x")));
  EXPECT_TRUE(IsConfigurationError(FailedPrecondition("x")));
  EXPECT_TRUE(IsConfigurationError(Corrupt("a generation file that holds no number")));
  EXPECT_FALSE(IsConfigurationError(AlreadyExists("socket served")));
  EXPECT_FALSE(IsConfigurationError(IoError("x")));
}

TEST(DescribeParseErrorTest, AnUnknownKeyNamesTheFileAndTheNearestOption) {
  CLI::App app;
  std::string budget;
  app.add_option("--memory-budget", budget);
  app.set_config("--config", "/etc/ckptd/ckptd.conf");
  const std::string described =
      DescribeParseError(app, CLI::ConfigError::Extras("memory-budgte"));
  EXPECT_NE(described.find("unknown key 'memory-budgte' in /etc/ckptd/ckptd.conf"), std::string::npos) << described;
  EXPECT_NE(described.find("did you mean 'memory-budget'"), std::string::npos) << described;
  // Nothing close: no suggestion.
  EXPECT_EQ(DescribeParseError(app, CLI::ConfigError::Extras("colour")).find("did you mean"), std::string::npos);
}

// A mistyped flag on the command line (CLI11 alone says only "not expected") names the
// option as typed and the closest known ones, in the same words as an unknown key.
TEST(DescribeParseErrorTest, AnUnknownFlagNamesTheClosestOptions) {
  CLI::App app;
  std::string budget, root, prefix;
  app.add_option("--memory-budget", budget);
  app.add_option("--model-root", root);
  app.add_option("--shm-prefix", prefix);
  auto describe = [&](const std::string& command_line) -> std::string {
    try {
      app.parse(command_line, false);
    } catch (const CLI::ParseError& e) {
      return DescribeParseError(app, e);
    }
    return "(parsed)";
  };
  std::string d = describe("--memory-budgte 64G");
  EXPECT_NE(d.find("unknown option '--memory-budgte' (did you mean '--memory-budget'?)"), std::string::npos) << d;
  d = describe("--shm-prefix p --modle-root=/srv/models");
  EXPECT_NE(d.find("unknown option '--modle-root' (did you mean '--model-root'?)"), std::string::npos) << d;
  d = describe("--colour");
  EXPECT_NE(d.find("unknown option '--colour'"), std::string::npos) << d;
  EXPECT_EQ(d.find("did you mean"), std::string::npos) << d;
  d = describe("serve");
  EXPECT_NE(d.find("unexpected argument 'serve'"), std::string::npos) << d;
}

}  // namespace
}  // namespace ckpt::daemon

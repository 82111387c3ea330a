// A service that fails well (issue 13): configuration errors stop the real ckptd once, with
// exit status 78 (EX_CONFIG, which the unit's RestartPreventExitStatus= names) and a
// message naming the key, the cause and the fix; a memory budget the node cannot hold is a
// warning at start; the metrics file's mode and group are configurable, 0644 by default
// whatever the umask.
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "integration/ops_helpers.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using testing::CommandResult;
using testing::DaemonProcess;
using testing::ReadFile;
using testing::ScratchDir;

constexpr int kExConfig = 78;

class ServiceTest : public ::testing::Test {
 protected:
  // Runs ckptd in the foreground on a private socket and prefix. `timeout` kills a daemon
  // that (wrongly) starts serving, so a missing refusal fails the test instead of hanging.
  CommandResult RunDaemon(std::vector<std::string> args) {
    std::vector<std::string> argv = {"timeout", "30", CKPTD_BIN, "--socket", dir_.File("s.sock"),
                                     "--shm-prefix", "cksvc" + std::to_string(::getpid())};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::RunCommand(argv);
  }
  CommandResult RunWithConfig(const std::string& text) {
    testing::WriteFile(dir_.File("ckptd.conf"), text);
    return RunDaemon({"--config", dir_.File("ckptd.conf")});
  }
  ScratchDir dir_;
};

TEST_F(ServiceTest, AnUnknownConfigKeyExits78NamingTheKeyAndTheClosestOne) {
  CommandResult r = RunWithConfig("memory-budget = \"1G\"\nmodle-root = [\"/srv\"]\n");
  EXPECT_EQ(r.exit_code, kExConfig) << r.err;
  EXPECT_NE(r.err.find("unknown key 'modle-root'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(dir_.File("ckptd.conf")), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("did you mean 'model-root'"), std::string::npos) << r.err;
  // Only one line of cause and one of consequence: nothing started, nothing listens.
  EXPECT_EQ(::access(dir_.File("s.sock").c_str(), F_OK), -1);
}

// CKPTD_CONFIG moves the default configuration (ctest points it at an empty file, so no
// test reads the node's): a file it names is read, one it names that does not exist is a
// configuration error, and --config wins over it.
TEST_F(ServiceTest, CkptdConfigNamesTheDefaultConfigurationAndMustExist) {
  testing::WriteFile(dir_.File("env.conf"), "modle-root = [\"/srv\"]\n");
  auto with_env = [&](const std::string& value, std::vector<std::string> args) {
    std::vector<std::string> argv = {"env", "CKPTD_CONFIG=" + value, "timeout", "30", CKPTD_BIN,
                                     "--socket", dir_.File("s.sock"), "--shm-prefix",
                                     "cksvc" + std::to_string(::getpid())};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::RunCommand(argv);
  };
  CommandResult read = with_env(dir_.File("env.conf"), {});
  EXPECT_EQ(read.exit_code, kExConfig) << read.err;
  EXPECT_NE(read.err.find("unknown key 'modle-root' in " + dir_.File("env.conf")), std::string::npos) << read.err;
  CommandResult missing = with_env(dir_.File("absent.conf"), {});
  EXPECT_EQ(missing.exit_code, kExConfig) << missing.err;
  EXPECT_NE(missing.err.find("CKPTD_CONFIG names " + dir_.File("absent.conf") + ", which does not exist"),
            std::string::npos) << missing.err;
  testing::WriteFile(dir_.File("other.conf"), "load-threads = \"many\"\n");
  CommandResult wins = with_env(dir_.File("env.conf"), {"--config", dir_.File("other.conf")});
  EXPECT_EQ(wins.exit_code, kExConfig) << wins.err;
  EXPECT_NE(wins.err.find("load-threads"), std::string::npos) << wins.err;
  EXPECT_EQ(wins.err.find("modle-root"), std::string::npos) << "--config did not win over CKPTD_CONFIG: " << wins.err;
  EXPECT_EQ(::access(dir_.File("s.sock").c_str(), F_OK), -1);
}


TEST_F(ServiceTest, AnUnknownFlagExits78NamingTheClosestOption) {
  CommandResult r = RunDaemon({"--memory-budgte", "1G"});
  EXPECT_EQ(r.exit_code, kExConfig) << r.err;
  EXPECT_NE(r.err.find("unknown option '--memory-budgte' (did you mean '--memory-budget'?)"), std::string::npos)
      << r.err;
  EXPECT_EQ(::access(dir_.File("s.sock").c_str(), F_OK), -1);
}

TEST_F(ServiceTest, VersionPrintsTheProjectVersion) {
  CommandResult r = RunDaemon({"--version"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, std::string("ckptd ") + CKPT_VERSION + "\n");
}

TEST_F(ServiceTest, AKeyInAnUnknownTableIsRefusedToo) {
  CommandResult r = RunWithConfig("[server]\nload-threads = 2\n");
  EXPECT_EQ(r.exit_code, kExConfig) << r.err;
  EXPECT_NE(r.err.find("unknown table [server]"), std::string::npos) << r.err;
}

TEST_F(ServiceTest, CommandLineOnlyKeysInTheFileExit78) {
  // "version = true" must not make the service print its version and exit 0 (a clean
  // stop that no one would notice), nor "help", nor "config".
  for (const char* key : {"version", "help"}) {
    CommandResult r = RunWithConfig(std::string(key) + " = true\n");
    EXPECT_EQ(r.exit_code, kExConfig) << key << r.out << r.err;
    EXPECT_NE(r.err.find("key '" + std::string(key) + "' in " + dir_.File("ckptd.conf") + " is a command-line option only"),
              std::string::npos) << r.err;
  }
}

TEST_F(ServiceTest, BadValuesExit78NamingTheOption) {
  struct Case {
    std::string config, needle;
  };
  for (const Case& c : std::vector<Case>{{"load-threads = \"many\"\n", "load-threads"},
                                         {"log-level = \"verbose\"\n", "log-level"},
                                         {"socket-mode = \"0668\"\n", "socket-mode"},
                                         {"shm-mode = \"640x\"\n", "shm-mode"},
                                         {"metrics-file-mode = \"rw-r--r--\"\n", "metrics-file-mode"},
                                         {"memory-budget = \"lots\"\n", "memory-budget"},
                                         {"load-threads = 0\n", "load threads"}}) {
    CommandResult r = RunWithConfig(c.config);
    EXPECT_EQ(r.exit_code, kExConfig) << c.config << r.err;
    EXPECT_NE(r.err.find("configuration error"), std::string::npos) << c.config << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.config << r.err;
  }
  CommandResult r = RunDaemon({"--no-such-flag"});
  EXPECT_EQ(r.exit_code, kExConfig) << r.err;
  EXPECT_NE(r.err.find("--no-such-flag"), std::string::npos) << r.err;
  r = RunDaemon({"--config", dir_.File("absent.conf")});
  EXPECT_EQ(r.exit_code, kExConfig) << r.err;
  EXPECT_NE(r.err.find("absent.conf"), std::string::npos) << r.err;
}

TEST_F(ServiceTest, AMissingModelRootExits78AndSaysWhatHidesIt) {
  CommandResult r = RunDaemon({"--model-root", dir_.File("no-models")});
  EXPECT_EQ(r.exit_code, kExConfig) << r.err;
  EXPECT_NE(r.err.find("model-root '" + dir_.File("no-models") + "' does not exist"), std::string::npos) << r.err;
  // Under /tmp the message names PrivateTmp=, which hides the host's /tmp from the unit.
  r = RunDaemon({"--model-root", "/tmp/ckpt-no-such-models-" + std::to_string(::getpid())});
  EXPECT_EQ(r.exit_code, kExConfig) << r.err;
  EXPECT_NE(r.err.find("PrivateTmp="), std::string::npos) << r.err;
  testing::WriteFile(dir_.File("file"), "x");
  r = RunDaemon({"--model-root", dir_.File("file")});
  EXPECT_EQ(r.exit_code, kExConfig) << r.err;
  EXPECT_NE(r.err.find("is not a directory"), std::string::npos) << r.err;
}

TEST_F(ServiceTest, AModelRootTheDaemonUserCannotReadExits78) {
  ASSERT_EQ(::geteuid(), 0u) << "needs root (setpriv)";
  ASSERT_EQ(::mkdir(dir_.File("private").c_str(), 0700), 0);
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
  CommandResult r = testing::RunCommand({"timeout", "5", "setpriv", "--reuid", "nobody", "--regid", "nogroup",
                                         "--clear-groups", CKPTD_BIN, "--socket", dir_.File("s.sock"),
                                         "--model-root", dir_.File("private")});
  EXPECT_EQ(r.exit_code, kExConfig) << r.err;
  EXPECT_NE(r.err.find("not readable by ckptd (user 'nobody')"), std::string::npos) << r.err;
}

TEST_F(ServiceTest, ASocketInADirectoryThatDoesNotExistExits78) {
  // Not an I/O error that a restart could cure: the unit would restart it forever.
  CommandResult r = testing::RunCommand({"timeout", "5", CKPTD_BIN, "--socket", "/run/ckpt-typo/ckptd.sock"});
  EXPECT_EQ(r.exit_code, kExConfig) << r.err;
  EXPECT_NE(r.err.find("socket '/run/ckpt-typo/ckptd.sock': its directory /run/ckpt-typo does not exist"),
            std::string::npos) << r.err;
  EXPECT_NE(r.err.find("RuntimeDirectory=ckptd"), std::string::npos) << r.err;
}

TEST_F(ServiceTest, AnUnknownGroupExits78NamingTheGroupAndSysusers) {
  for (const char* key : {"admin-group", "reader-group", "metrics-file-group"}) {
    std::vector<std::string> args = {std::string("--") + key, "ckpt-no-such-group"};
    if (std::string(key) == "metrics-file-group") args.insert(args.end(), {"--metrics-file", dir_.File("m.prom")});
    CommandResult r = RunDaemon(args);
    EXPECT_EQ(r.exit_code, kExConfig) << key << r.err;
    EXPECT_NE(r.err.find(std::string(key) + " 'ckpt-no-such-group' does not exist"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("systemd-sysusers"), std::string::npos) << r.err;
  }
}

TEST_F(ServiceTest, AMetricsFileTheDaemonCannotWriteOrGiveAwayExits78) {
  CommandResult r = RunDaemon({"--metrics-file", dir_.File("absent-dir/ckptd.prom")});
  EXPECT_EQ(r.exit_code, kExConfig) << r.err;
  EXPECT_NE(r.err.find("absent-dir does not exist"), std::string::npos) << r.err;
  // A group ckptd is not in: it could never chown the file to it.
  ASSERT_EQ(::geteuid(), 0u) << "needs root (setpriv, groupadd)";
  testing::TempGroup exporters;
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0777), 0);
  r = testing::RunCommand({"timeout", "5", "setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups",
                           CKPTD_BIN, "--socket", dir_.File("s.sock"), "--metrics-file", dir_.File("ckptd.prom"),
                           "--metrics-file-group", exporters.name()});
  EXPECT_EQ(r.exit_code, kExConfig) << r.err;
  EXPECT_NE(r.err.find("SupplementaryGroups=" + exporters.name()), std::string::npos) << r.err;
}

TEST_F(ServiceTest, ABudgetAboveShmAndMemoryIsAWarningAtStart) {
  DaemonProcess daemon({"--memory-budget", "64T"});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  const std::string log = ReadFile(daemon.log_path());
  EXPECT_NE(log.find("memory-budget 64.00 TiB (70368744177664 bytes) is larger than " + daemon.segment_dir() + ", "),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("larger than this node's physical memory"), std::string::npos) << log;
  // A budget that fits says nothing.
  DaemonProcess fits({"--memory-budget", "1M"});
  ASSERT_TRUE(fits.Start());
  EXPECT_EQ(ReadFile(fits.log_path()).find("is larger than"), std::string::npos) << ReadFile(fits.log_path());
}

// One size parser (issue 24): GB is 10^9 (as persist and transformers read it), G and GiB
// are 2^30 (as systemd reads MemoryMax=), in flags and in the configuration file alike.
TEST_F(ServiceTest, SizesMeanOneThingGbIsTenToTheNineGAndGibAreBinary) {
  struct Case {
    std::vector<std::string> args;
    uint64_t budget, per_uid;
  };
  testing::WriteFile(dir_.File("sizes.conf"), "memory-budget = \"3GiB\"\nmax-shm-bytes-per-uid = \"1.5GB\"\n");
  for (const Case& c : std::vector<Case>{
           {{"--memory-budget", "40GB"}, 40'000'000'000ull, 20'000'000'000ull},
           {{"--memory-budget", "40G", "--max-shm-bytes-per-uid", "512MB"}, 40ull << 30, 512'000'000ull},
           {{"--config", dir_.File("sizes.conf")}, 3ull << 30, 1'500'000'000ull}}) {
    DaemonProcess daemon(c.args);
    ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
    CommandResult r = daemon.Ctl({"status", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("\"memory_budget_bytes\": " + std::to_string(c.budget)), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\"max_shm_bytes_per_uid\": " + std::to_string(c.per_uid)), std::string::npos) << r.out;
  }
  CommandResult bad = RunDaemon({"--memory-budget", "40XB"});
  EXPECT_EQ(bad.exit_code, kExConfig) << bad.err;
  EXPECT_NE(bad.err.find("memory-budget: '40XB' is not a size: unknown unit 'XB'"), std::string::npos) << bad.err;
  bad = RunDaemon({"--memory-budget", "-5G"});
  EXPECT_EQ(bad.exit_code, kExConfig) << "a negative size used to wrap: " << bad.err;
}

TEST_F(ServiceTest, TheMetricsFileIs0644WhateverTheUmaskAndItsModeAndGroupAreConfigurable) {
  const std::string path = dir_.File("ckptd.prom");
  const mode_t old_umask = ::umask(027);  // the unit's UMask=0027, inherited by the daemon
  DaemonProcess daemon({"--metrics-file", path, "--metrics-interval", "1"});
  const bool started = daemon.Start();
  ::umask(old_umask);
  ASSERT_TRUE(started) << ReadFile(daemon.log_path());
  ASSERT_TRUE(testing::WaitFor([&] { return ReadFile(path).find("ckptd_up 1\n") != std::string::npos; }, 5000));
  struct stat st{};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  EXPECT_EQ(daemon.Stop(), 0);

  testing::TempGroup exporters;
  const group* gr = ::getgrnam(exporters.name().c_str());
  ASSERT_NE(gr, nullptr);
  const gid_t gid = gr->gr_gid;
  ::unlink(path.c_str());
  DaemonProcess grouped({"--metrics-file", path, "--metrics-interval", "1", "--metrics-file-mode", "0640",
                         "--metrics-file-group", exporters.name()});
  ASSERT_TRUE(grouped.Start()) << ReadFile(grouped.log_path());
  ASSERT_TRUE(testing::WaitFor([&] { return ReadFile(path).find("ckptd_up 1\n") != std::string::npos; }, 5000));
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(st.st_gid, gid);
}

}  // namespace
}  // namespace ckpt

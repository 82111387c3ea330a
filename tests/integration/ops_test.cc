// Operating ckptd: the memory budget, generations (--replace), evict --wait, status and
// metrics, readiness over NOTIFY_SOCKET, the systemd unit and the configuration file.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <future>
#include <nlohmann/json.hpp>

#include "ckpt/client.h"
#include "integration/ops_helpers.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using nlohmann::json;
using testing::ChildProcess;
using testing::CommandResult;
using testing::DaemonProcess;
using testing::ReadFile;
using testing::ScratchDir;

json CtlJson(const DaemonProcess& d, std::vector<std::string> args) {
  args.push_back("--json");
  CommandResult r = d.Ctl(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out, nullptr, false);
}

// Reads tensor "w" of an attached checkpoint and counts floats that differ from the
// pattern its "meta" announces.
uint64_t WrongFloats(const Checkpoint& c) {
  auto meta = c.Tensor("meta");
  auto w = c.Tensor("w");
  if (!meta.ok() || !w.ok()) return ~0ull;
  return testing::WrongFloats(reinterpret_cast<const int64_t*>(meta->data), reinterpret_cast<const float*>(w->data),
                              w->info->nbytes / 4);
}

int64_t VersionOf(const Checkpoint& c) { return reinterpret_cast<const int64_t*>(c.Tensor("meta")->data)[1]; }

class OpsTest : public ::testing::Test {
 protected:
  ScratchDir files_;
};

TEST_F(OpsTest, ALoadOverBudgetEvictsTheLeastRecentlyUsedUnattachedOrFails) {
  // 3 MiB checkpoints (768 rows of 1 KiB... 256 floats) under a 10 MiB budget.
  for (int i = 0; i < 4; ++i) testing::WritePatternCheckpoint(files_.File("c" + std::to_string(i)), i, 1, 3072);
  testing::WritePatternCheckpoint(files_.File("big"), 9, 1, 8192);  // 8 MiB
  DaemonProcess daemon({"--memory-budget", "10M"});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Load(files_.File("c0"), "a").ok());
  ASSERT_TRUE((*client)->Load(files_.File("c1"), "b").ok());
  auto a = (*client)->Attach("a");  // "a" is older but attached: it must survive
  ASSERT_TRUE(a.ok());

  json c = CtlJson(daemon, {"load", files_.File("c2"), "--name", "c"});
  ASSERT_EQ(c["evicted"], json::array({"b"})) << c.dump();
  json list = CtlJson(daemon, {"list"});
  ASSERT_EQ(list["checkpoints"].size(), 2u);
  EXPECT_EQ(list["checkpoints"][0]["name"], "a");
  EXPECT_EQ(list["checkpoints"][1]["name"], "c");

  // 8 MiB cannot fit while "a" (attached) holds 3 MiB: refused, and nothing is evicted.
  CommandResult big = daemon.Ctl({"load", files_.File("big"), "--name", "big"});
  EXPECT_EQ(big.exit_code, 1);
  EXPECT_NE(big.err.find("memory budget"), std::string::npos) << big.err;
  EXPECT_EQ(CtlJson(daemon, {"list"})["checkpoints"].size(), 2u);
  EXPECT_EQ(WrongFloats(**a), 0u);
  EXPECT_TRUE((*a)->Verify().ok());

  json status = CtlJson(daemon, {"status"});
  EXPECT_EQ(status["memory_budget_bytes"], 10u << 20);
  EXPECT_LE(status["memory_used_bytes"].get<uint64_t>(), 10u << 20);
  EXPECT_EQ(status["evictions"]["for_budget"], 1);

  // Once "a" is detached it may go too: then the big one fits.
  a->reset();
  ASSERT_TRUE(testing::WaitFor([&] { return CtlJson(daemon, {"status"})["attached"] == 0; }, 5000));
  json big_ok = CtlJson(daemon, {"load", files_.File("big"), "--name", "big"});
  EXPECT_EQ(big_ok["evicted"].size(), 2u) << big_ok.dump();
  EXPECT_EQ(testing::SegmentCount(daemon.shm_prefix()), 1u);
}

TEST_F(OpsTest, ReplacePublishesANewGenerationAndFreesTheOldOneAtItsLastDetach) {
  testing::WritePatternCheckpoint(files_.File("v1"), 5, 1, 256);
  testing::WritePatternCheckpoint(files_.File("v2"), 5, 2, 256);
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start());
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  auto g1 = (*client)->Load(files_.File("v1"), "m");
  ASSERT_TRUE(g1.ok());
  auto old = (*client)->Attach("m");
  ASSERT_TRUE(old.ok());

  // Without --replace a second load under the name is refused.
  CommandResult dup = daemon.Ctl({"load", files_.File("v2"), "--name", "m"});
  EXPECT_EQ(dup.exit_code, 1);
  EXPECT_NE(dup.err.find("--replace"), std::string::npos) << dup.err;

  json g2 = CtlJson(daemon, {"load", files_.File("v2"), "--name", "m", "--replace"});
  EXPECT_GT(g2["checkpoint"]["generation"].get<uint64_t>(), g1->generation);
  auto fresh = (*client)->Attach("m");
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(VersionOf(**fresh), 2);
  EXPECT_EQ(VersionOf(**old), 1);  // the old generation is untouched for its clients
  EXPECT_EQ(WrongFloats(**old), 0u);
  EXPECT_EQ(WrongFloats(**fresh), 0u);
  EXPECT_EQ(testing::SegmentCount(daemon.shm_prefix()), 2u);
  json status = CtlJson(daemon, {"status"});
  ASSERT_EQ(status["retired"].size(), 1u);
  EXPECT_EQ(status["retired"][0]["generation"], g1->generation);
  EXPECT_EQ(status["retired"][0]["attached"], 1);

  old->reset();  // last detach of generation 1: it is unlinked
  EXPECT_TRUE(testing::WaitFor([&] { return testing::SegmentCount(daemon.shm_prefix()) == 1u; }, 5000));
  EXPECT_TRUE(testing::WaitFor([&] { return CtlJson(daemon, {"status"})["retired"].empty(); }, 5000));
  EXPECT_EQ(WrongFloats(**fresh), 0u);
}

TEST_F(OpsTest, EvictWaitsForDetachOrForceLeavesMappingsValid) {
  testing::WritePatternCheckpoint(files_.File("m"), 3, 1, 256);
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start());
  ASSERT_EQ(daemon.Ctl({"load", files_.File("m"), "--name", "m"}).exit_code, 0);
  auto rank = std::make_unique<ChildProcess>(
      std::vector<std::string>{CKPT_SHARD_READER_BIN, daemon.socket(), "m", "0", "1"});
  ASSERT_TRUE(rank->WaitForOutput("attached", 10000));

  CommandResult quick = daemon.Ctl({"evict", "m", "--wait", "0.3"});
  EXPECT_EQ(quick.exit_code, 1);
  EXPECT_NE(quick.err.find("still attached after waiting"), std::string::npos) << quick.err;

  auto waiting = std::async(std::launch::async, [&] { return daemon.Ctl({"evict", "m", "--wait", "30"}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(testing::SegmentCount(daemon.shm_prefix()), 1u);
  rank->CloseStdin();  // the rank detaches; the waiting evict then succeeds
  CommandResult done = waiting.get();
  EXPECT_EQ(done.exit_code, 0) << done.err;
  EXPECT_EQ(testing::SegmentCount(daemon.shm_prefix()), 0u);

  // --force while attached: the client keeps its mapping, the bytes stay right.
  ASSERT_EQ(daemon.Ctl({"load", files_.File("m"), "--name", "m"}).exit_code, 0);
  auto client = Client::Connect(daemon.socket());
  auto ckpt = (*client)->Attach("m");
  ASSERT_TRUE(ckpt.ok());
  EXPECT_EQ(daemon.Ctl({"evict", "m", "--force"}).exit_code, 0);
  EXPECT_EQ(testing::SegmentCount(daemon.shm_prefix()), 0u);
  EXPECT_EQ(WrongFloats(**ckpt), 0u);
  json status = CtlJson(daemon, {"status"});
  EXPECT_EQ(status["retired"].size(), 1u) << "force-evicted memory still counts while attached";
}

TEST_F(OpsTest, StatusShowsAttachedPidsAndMetricsArePrometheusText) {
  testing::WritePatternCheckpoint(files_.File("m"), 4, 1, 64);
  DaemonProcess daemon({"--memory-budget", "1G"});
  ASSERT_TRUE(daemon.Start());
  ASSERT_EQ(daemon.Ctl({"load", files_.File("m"), "--name", "m"}).exit_code, 0);
  auto client = Client::Connect(daemon.socket());
  auto ckpt = (*client)->Attach("m");
  ASSERT_TRUE(ckpt.ok());

  json status = CtlJson(daemon, {"status"});
  ASSERT_EQ(status["checkpoint_list"].size(), 1u);
  EXPECT_EQ(status["checkpoint_list"][0]["attached_pids"], json::array({::getpid()}));
  EXPECT_GT(status["checkpoint_list"][0]["segment_bytes"].get<uint64_t>(), 64u * 1024);
  CommandResult table = daemon.Ctl({"status"});
  EXPECT_NE(table.out.find("memory budget  1.00 GiB"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find(std::to_string(::getpid())), std::string::npos) << table.out;

  CommandResult metrics = daemon.Ctl({"metrics"});
  ASSERT_EQ(metrics.exit_code, 0) << metrics.err;
  for (const char* needle : {"# TYPE ckptd_up gauge\nckptd_up 1\n", "ckptd_memory_budget_bytes 1073741824\n",
                             "ckptd_checkpoint_attached{name=\"m\",generation=\"1\"} 1\n", "ckptd_loads_total 1\n",
                             "ckptd_attaches_total 1\n", "# TYPE ckptd_requests_total counter\n"}) {
    EXPECT_NE(metrics.out.find(needle), std::string::npos) << needle << " not in\n" << metrics.out;
  }
}

TEST_F(OpsTest, MetricsFileIsWrittenPeriodically) {
  testing::WritePatternCheckpoint(files_.File("m"), 4, 1, 64);
  const std::string path = files_.File("ckptd.prom");
  DaemonProcess daemon({"--metrics-file", path, "--metrics-interval", "1"});
  ASSERT_TRUE(daemon.Start());
  EXPECT_TRUE(testing::WaitFor([&] { return ReadFile(path).find("ckptd_up 1\n") != std::string::npos; }, 5000));
  ASSERT_EQ(daemon.Ctl({"load", files_.File("m"), "--name", "m"}).exit_code, 0);
  EXPECT_TRUE(testing::WaitFor([&] { return ReadFile(path).find("ckptd_loads_total 1\n") != std::string::npos; }, 5000))
      << ReadFile(path);
}

TEST_F(OpsTest, ReadinessIsSentToTheNotifySocket) {
  const std::string path = files_.File("notify.sock");
  UniqueFd sock(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval tv{10, 0};
  ASSERT_EQ(::setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);

  ::setenv("NOTIFY_SOCKET", path.c_str(), 1);
  DaemonProcess daemon;
  const bool started = daemon.Start();
  ::unsetenv("NOTIFY_SOCKET");
  ASSERT_TRUE(started);
  char buf[4096];
  ssize_t n = ::recv(sock.get(), buf, sizeof(buf) - 1, 0);
  ASSERT_GT(n, 0) << "no readiness message";
  std::string message(buf, static_cast<size_t>(n));
  EXPECT_NE(message.find("READY=1"), std::string::npos) << message;
  EXPECT_NE(message.find("STATUS=serving on " + daemon.socket()), std::string::npos) << message;
  EXPECT_NE(message.find("MAINPID=" + std::to_string(daemon.pid())), std::string::npos) << message;
  // Then STATUS= lines as the state changes, and STOPPING=1 at the end.
  testing::WritePatternCheckpoint(files_.File("m"), 4, 1, 64);
  ASSERT_EQ(daemon.Ctl({"load", files_.File("m"), "--name", "m"}).exit_code, 0);
  auto receive_until = [&](const std::string& needle) {
    std::string got;
    ssize_t r;
    while ((r = ::recv(sock.get(), buf, sizeof(buf) - 1, 0)) > 0) {
      got += std::string(buf, static_cast<size_t>(r)) + "\n";
      if (got.find(needle) != std::string::npos) break;
    }
    return got;
  };
  std::string got = receive_until("STATUS=1 checkpoints");
  EXPECT_NE(got.find("STATUS=1 checkpoints"), std::string::npos) << got;
  EXPECT_EQ(daemon.Stop(), 0);
  got = receive_until("STOPPING=1");
  EXPECT_NE(got.find("STOPPING=1"), std::string::npos) << got;
}

TEST_F(OpsTest, TheUnitFilePassesSystemdAnalyzeVerify) {
  std::string unit = ReadFile(CKPT_UNIT_FILE);
  ASSERT_NE(unit.find("Type=notify"), std::string::npos);
  for (const char* directive : {"RuntimeDirectory=ckptd", "ProtectSystem=strict", "PrivateTmp=yes", "NoNewPrivileges=yes",
                                "ReadWritePaths=-/run/ckptd-segments /dev/shm", "User=ckptd", "RemoveIPC=no",
                                "RestartPreventExitStatus=78", "StateDirectory=ckptd",
                                "Environment=CKPTD_SEGMENT_DIR= "}) {
    EXPECT_NE(unit.find(directive), std::string::npos) << directive;
  }
  // verify checks that ExecStart and ExecStartPre exist: point them at what was just built.
  const size_t at = unit.find("ExecStart=");
  const size_t end = unit.find(' ', at);
  unit.replace(at, end - at, std::string("ExecStart=") + CKPTD_BIN);
  const size_t pre = unit.find("ExecStartPre=+");
  ASSERT_NE(pre, std::string::npos);
  const size_t pre_end = unit.find('\n', pre);
  unit.replace(pre, pre_end - pre, std::string("ExecStartPre=+") + CKPT_TOOLS_DIR + "/systemd/ckptd-mount-segments");
  testing::WriteFile(files_.File("ckptd.service"), unit);
  CommandResult r = testing::RunCommand({"systemd-analyze", "verify", files_.File("ckptd.service")});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.err, "");
}

TEST_F(OpsTest, TheConfigFileIsReadAndFlagsWin) {
  ScratchDir models;
  const std::string conf = files_.File("ckptd.conf");
  testing::WriteFile(conf, "# test configuration\n"
                           "socket = \"/nonexistent/ckptd.sock\"\n"
                           "memory-budget = \"5M\"\n"
                           "model-root = [\"" + models.path() + "\"]\n"
                           "load-threads = 2\n"
                           "log-level = \"debug\"\n");
  DaemonProcess daemon({"--config", conf});  // DaemonProcess passes --socket: the flag wins
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  json status = CtlJson(daemon, {"status"});
  EXPECT_EQ(status["socket"], daemon.socket());
  EXPECT_EQ(status["memory_budget_bytes"], 5u << 20);
  EXPECT_EQ(status["model_roots"], json::array({models.path()}));
  testing::WritePatternCheckpoint(files_.File("m"), 1, 1, 16);
  CommandResult r = daemon.Ctl({"load", files_.File("m")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("outside the model roots (" + models.path() + ")"), std::string::npos) << r.err;

  // A bad value in the file stops the daemon with a message.
  testing::WriteFile(conf, "memory-budget = \"lots\"\n");
  DaemonProcess bad({"--config", conf});
  EXPECT_FALSE(bad.Start());
  EXPECT_NE(ReadFile(bad.log_path()).find("memory-budget"), std::string::npos) << ReadFile(bad.log_path());
}

TEST_F(OpsTest, TheShippedConfigFileIsValid) {
  // The shipped file names groups and a model root this machine may not have: the flags
  // given here win over them; everything else comes from the file.
  ScratchDir models;
  testing::TempGroup admins, readers;
  DaemonProcess daemon({"--config", std::string(CKPT_TOOLS_DIR) + "/systemd/ckptd.conf", "--admin-group",
                        admins.name(), "--reader-group", readers.name(), "--model-root", models.path()});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  json status = CtlJson(daemon, {"status"});
  EXPECT_EQ(status["memory_budget_bytes"], 64ull << 30);
  EXPECT_EQ(status["model_roots"], json::array({models.path()}));
  EXPECT_EQ(status["max_connections"], 1024);
}

}  // namespace
}  // namespace ckpt

// Abuse of the control socket: random garbage, oversized and truncated frames, clients
// that vanish mid-request or mid-attach, descriptors pushed at the daemon, thousands of
// connections past max-connections. Expected: errors and closed connections; never a
// crash, a leak of descriptors or attachments, or a daemon that stops answering.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "ckpt/client.h"
#include "common/io.h"
#include "integration/ops_helpers.h"
#include "protocol/wire.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using nlohmann::json;
using testing::DaemonProcess;
using testing::ReadFile;
using testing::ScratchDir;

size_t OpenFds(pid_t pid) {
  size_t n = 0;
  DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (d == nullptr) return 0;
  while (::readdir(d) != nullptr) ++n;
  ::closedir(d);
  return n;
}

std::string Frame(const std::string& body) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((body.size() >> (8 * i)) & 0xff);
  return out + body;
}

// Sends `bytes` on a fresh connection, then reads until the daemon closes or answers.
void SendRaw(const std::string& socket, const std::string& bytes, bool wait_for_reply) {
  auto fd = protocol::ConnectUnix(socket);
  ASSERT_TRUE(fd.ok());
  (void)SendAll(fd->get(), bytes.data(), bytes.size());
  if (wait_for_reply) {
    pollfd p{fd->get(), POLLIN, 0};
    (void)::poll(&p, 1, 200);
  }
}

class SocketAbuseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::WritePatternCheckpoint(files_.File("m"), 1, 1, 256);
    ASSERT_TRUE(daemon_.Start()) << ReadFile(daemon_.log_path());
    ASSERT_EQ(daemon_.Ctl({"load", files_.File("m"), "--name", "m"}).exit_code, 0);
  }

  // The daemon answers, "m" verifies and no attachment is left over.
  void ExpectHealthy() {
    std::unique_ptr<Client> client;
    ASSERT_TRUE(testing::WaitFor([&] {
      auto c = Client::Connect(daemon_.socket());
      if (!c.ok()) return false;
      auto list = (*c)->List();
      if (!list.ok() || list->size() != 1 || (*list)[0].attached != 0) return false;
      client = std::move(c).value();
      return true;
    }, 10000)) << "daemon not serving, or attachments leaked: " << ReadFile(daemon_.log_path());
    auto ckpt = client->Attach("m");
    ASSERT_TRUE(ckpt.ok());
    EXPECT_TRUE((*ckpt)->Verify().ok());
    ASSERT_TRUE(daemon_.Running());
  }

  ScratchDir files_;
  DaemonProcess daemon_{{"--max-connections", "64"}};
};

TEST_F(SocketAbuseTest, GarbageOversizedTruncatedAndVanishingClients) {
  ExpectHealthy();
  const size_t fds_before = OpenFds(daemon_.pid());
  std::mt19937 rng(42);
  int cases = 0;
  for (int i = 0; i < 200; ++i, ++cases) {  // random bytes, random lengths
    std::string junk(1 + rng() % 64, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    SendRaw(daemon_.socket(), junk, i % 2 == 0);
  }
  for (int i = 0; i < 100; ++i, ++cases) {  // well-framed garbage bodies
    std::string body(rng() % 512, '\0');
    for (char& c : body) c = static_cast<char>(rng());
    SendRaw(daemon_.socket(), Frame(body), true);
  }
  SendRaw(daemon_.socket(), std::string("\xff\xff\xff\xff", 4) + "x", true);           // 4 GiB frame
  SendRaw(daemon_.socket(), Frame(std::string(2u << 20, '{')), true);                   // over the 1 MiB limit
  SendRaw(daemon_.socket(), Frame(R"({"v":1,"op":"list"})").substr(0, 10), false);      // cut short
  SendRaw(daemon_.socket(), Frame(R"({"v":1,"op":"attach","name":"m"})"), false);       // attach, then vanish
  SendRaw(daemon_.socket(), Frame(R"({"v":1,"op":"load","path":")" + std::string(100000, 'a') + "\"}"), true);
  SendRaw(daemon_.socket(), Frame(R"({"v":1,"op":"evict","name":"m","wait_s":-1})"), true);
  SendRaw(daemon_.socket(), Frame(R"({"v":1,"op":"evict","name":"m","wait_s":"x"})"), true);
  SendRaw(daemon_.socket(), Frame(R"({"v":1,"op":"load","path":"/x","replace":3})"), true);
  cases += 8;
  // Descriptors pushed at the daemon are closed, not kept.
  for (int i = 0; i < 50; ++i, ++cases) {
    auto fd = protocol::ConnectUnix(daemon_.socket());
    ASSERT_TRUE(fd.ok());
    UniqueFd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(protocol::WriteFrameWithFd(fd->get(), json{{"v", 1}, {"op", "list"}}, devnull.get()).ok());
    auto reply = protocol::ReadFrame(fd->get(), protocol::kMaxResponseBytes);
    ASSERT_TRUE(reply.ok());
    EXPECT_TRUE(protocol::StatusOf(*reply).ok());
  }
  // Many attaches whose clients disappear without a word.
  for (int i = 0; i < 100; ++i, ++cases) {
    SendRaw(daemon_.socket(), Frame(R"({"v":1,"op":"attach","name":"m"})"), i % 2 == 0);
  }
  ExpectHealthy();
  // Connections wind down asynchronously; the descriptor count returns to where it was.
  EXPECT_TRUE(testing::WaitFor([&] { return OpenFds(daemon_.pid()) <= fds_before + 2; }, 5000))
      << OpenFds(daemon_.pid()) << " descriptors open, " << fds_before << " before";
  std::printf("socket abuse: %d malformed or abandoned requests, daemon healthy\n", cases);
}

TEST_F(SocketAbuseTest, TwoThousandConnectionsAreBoundedByMaxConnections) {
  rlimit lim{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &lim), 0);
  lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, 8192);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &lim), 0);
  ASSERT_GE(lim.rlim_cur, 2100u);

  const auto start = std::chrono::steady_clock::now();
  std::vector<UniqueFd> held;
  int refused = 0, connect_failed = 0;
  for (int i = 0; i < 2000; ++i) {
    auto fd = protocol::ConnectUnix(daemon_.socket());
    if (!fd.ok()) {
      ++connect_failed;  // the listen backlog was full for a moment
      continue;
    }
    held.push_back(std::move(fd).value());
  }
  // Every connection past the limit is answered "too many connections" and closed; wait
  // until the daemon has accepted them all.
  auto readable = [&] {
    size_t n = 0;
    for (auto& fd : held) {
      pollfd p{fd.get(), POLLIN, 0};
      n += ::poll(&p, 1, 0) > 0;
    }
    return n;
  };
  EXPECT_TRUE(testing::WaitFor([&] { return readable() + 64 >= held.size(); }, 20000)) << readable();
  for (auto& fd : held) {
    pollfd p{fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) {
      auto reply = protocol::ReadFrame(fd.get(), protocol::kMaxResponseBytes);
      if (reply.ok() && protocol::StatusOf(*reply).code() == StatusCode::kResourceExhausted) ++refused;
    }
  }
  // Past the limit (the daemon's connections are at most 64) requests are still refused
  // cleanly, and the accepted ones still work.
  auto extra = Client::Connect(daemon_.socket());
  ASSERT_TRUE(extra.ok());
  const StatusCode code = (*extra)->List().status().code();
  EXPECT_TRUE(code == StatusCode::kResourceExhausted || code == StatusCode::kUnavailable) << StatusCodeName(code);
  int answered = 0;
  for (size_t i = 0; i < held.size() && answered < 10; ++i) {
    pollfd p{held[i].get(), POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) continue;  // refused and closed
    if (!protocol::WriteFrame(held[i].get(), json{{"v", 1}, {"op", "status"}}).ok()) continue;
    auto reply = protocol::ReadFrame(held[i].get(), protocol::kMaxResponseBytes);
    if (reply.ok() && protocol::StatusOf(*reply).ok()) {
      EXPECT_LE((*reply)["connections"].get<int>(), 64);
      ++answered;
    }
  }
  EXPECT_EQ(answered, 10);
  held.clear();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("2000 connections: %d refused over max-connections, %d connects failed, %.2f s\n", refused,
              connect_failed, secs);
  EXPECT_GE(refused + connect_failed, 2000 - 64 - 1);
  ExpectHealthy();
}

}  // namespace
}  // namespace ckpt

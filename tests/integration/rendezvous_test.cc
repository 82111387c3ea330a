// The rendezvous op against the real ckptd: ranks of one job exchange a 128-byte blob (an
// NCCL unique id) whatever order they come in; a rank 0 that never comes is a
// DeadlineExceeded after the timeout; bad requests get clear errors and the daemon keeps
// serving; a stopping daemon ends waits at once.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "ckpt/client.h"
#include "protocol/daemon_connection.h"
#include "protocol/wire.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using nlohmann::json;
using std::chrono::steady_clock;
using testing::DaemonProcess;
using testing::ReadFile;

double SecondsSince(steady_clock::time_point t) {
  return std::chrono::duration<double>(steady_clock::now() - t).count();
}

class RendezvousTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.Start()) << ReadFile(daemon_.log_path());
    client_ = Connect();
    ASSERT_NE(client_, nullptr);
  }
  std::unique_ptr<Client> Connect() {
    auto client = Client::Connect(daemon_.socket());
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::move(client).value() : nullptr;
  }
  // Sends a raw rendezvous request (fields as given) and returns the daemon's Status.
  Status Raw(json fields) {
    auto conn = protocol::DaemonConnection::Open(daemon_.socket());
    if (!conn.ok()) return conn.status();
    return (*conn)->Call("rendezvous", std::move(fields)).status();
  }
  DaemonProcess daemon_;
  std::unique_ptr<Client> client_;
};

TEST_F(RendezvousTest, FourRanksGetRankZerosBlobWhateverOrderTheyComeIn) {
  constexpr int kWorld = 4;
  std::mt19937_64 rng(std::random_device{}());
  std::string blob(128, '\0');
  for (char& c : blob) c = static_cast<char>(rng());
  blob[5] = '\0';  // binary-safe

  std::vector<Result<std::string>> got(kWorld, Result<std::string>(Internal("unset")));
  auto rank = [&](int r, Client* client) {
    got[r] = client->Rendezvous("train:run-42.a_b", r, kWorld, r == 0 ? blob : std::string(), 30);
  };
  // Ranks 1 and 2 share one Client (its waits must not block each other), rank 3 and
  // rank 0 have their own; 1 and 2 wait before rank 0 publishes, 3 comes after.
  auto own0 = Connect(), own3 = Connect();
  ASSERT_TRUE(own0 && own3);
  std::thread r1(rank, 1, client_.get()), r2(rank, 2, client_.get());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::thread r0(rank, 0, own0.get());
  r0.join();
  std::thread r3(rank, 3, own3.get());
  r1.join();
  r2.join();
  r3.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(got[r].ok()) << "rank " << r << ": " << got[r].status().ToString();
    EXPECT_EQ(*got[r], blob) << "rank " << r;
  }
  // Every other rank fetched it: the entry is gone, a late rank waits and times out.
  auto late = client_->Rendezvous("train:run-42.a_b", 1, kWorld, "", 0.2);
  EXPECT_EQ(late.status().code(), StatusCode::kDeadlineExceeded);

  auto metrics = protocol::DaemonConnection::Open(daemon_.socket());
  ASSERT_TRUE(metrics.ok());
  auto text = (*metrics)->Call("metrics");
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->value("text", "").find("ckptd_rendezvous_total 5"), std::string::npos) << text->dump();
}

TEST_F(RendezvousTest, RankZeroNeverComesIsDeadlineExceededAfterTheTimeout) {
  const auto start = steady_clock::now();
  auto r = client_->Rendezvous("orphan", 2, 4, "", 2.0);
  const double elapsed = SecondsSince(start);
  ASSERT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
  EXPECT_EQ(r.status().message(), "no rank 0 published job 'orphan' within 2 s");
  EXPECT_GE(elapsed, 2.0);
  EXPECT_LT(elapsed, 2.0 + 5);
  // The wait held up nobody, and the connection still serves.
  EXPECT_TRUE(client_->List().ok());
}

TEST_F(RendezvousTest, WorldMismatchAndRepublishAfterACrashedRun) {
  ASSERT_TRUE(client_->Rendezvous("job", 0, 4, "first", 5).ok());
  auto mismatch = client_->Rendezvous("job", 1, 2, "", 5);
  ASSERT_EQ(mismatch.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(mismatch.status().message(), "job 'job' was published for world 4, not 2");
  auto second = client_->Rendezvous("job", 0, 4, "second", 5);  // a new run's rank 0
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second, "second");
  EXPECT_EQ(*client_->Rendezvous("job", 3, 4, "", 5), "second");
}

TEST_F(RendezvousTest, BadRequestsGetClearErrorsAndTheDaemonKeepsServing) {
  struct Case {
    json fields;
    const char* expected;
  };
  const std::string hex128(256, 'a');
  const std::vector<Case> cases = {
      {{{"rank", 0}, {"world", 2}, {"value", "00"}}, "lacks 'job'"},
      {{{"job", ""}, {"rank", 0}, {"world", 2}, {"value", "00"}}, "job name must be 1 to 200"},
      {{{"job", "a b"}, {"rank", 0}, {"world", 2}, {"value", "00"}}, "job name must be"},
      {{{"job", "a/b"}, {"rank", 0}, {"world", 2}, {"value", "00"}}, "job name must be"},
      {{{"job", std::string(201, 'j')}, {"rank", 0}, {"world", 2}, {"value", "00"}}, "job name must be"},
      {{{"job", "j"}, {"rank", 4}, {"world", 4}}, "rank 4, world 4"},
      {{{"job", "j"}, {"rank", -1}, {"world", 4}}, "rank -1, world 4"},
      {{{"job", "j"}, {"rank", 0}, {"world", 0}, {"value", "00"}}, "'world' must be 1 to 65536, not 0"},
      {{{"job", "j"}, {"rank", 0}, {"world", 65537}, {"value", "00"}}, "not 65537"},
      {{{"job", "j"}, {"rank", "0"}, {"world", 2}, {"value", "00"}}, "'rank' must be an integer"},
      {{{"job", "j"}, {"rank", 0.5}, {"world", 2}, {"value", "00"}}, "'rank' must be an integer"},
      {{{"job", "j"}, {"rank", 0}, {"world", 2}}, "must publish a non-empty 'value'"},
      {{{"job", "j"}, {"rank", 0}, {"world", 2}, {"value", "zz"}}, "not lower-case hex"},
      {{{"job", "j"}, {"rank", 0}, {"world", 2}, {"value", "ABCD"}}, "not lower-case hex"},
      {{{"job", "j"}, {"rank", 0}, {"world", 2}, {"value", "abc"}}, "odd length"},
      {{{"job", "j"}, {"rank", 0}, {"world", 2}, {"value", 42}}, "'value' must be a string"},
      {{{"job", "j"}, {"rank", 0}, {"world", 2}, {"value", std::string(8194, '0')}}, "at most 8192"},
      {{{"job", "j"}, {"rank", 1}, {"world", 2}, {"value", "00"}}, "only rank 0 publishes"},
      {{{"job", "j"}, {"rank", 1}, {"world", 2}, {"timeout_s", 3601}}, "'timeout_s' must be"},
      {{{"job", "j"}, {"rank", 1}, {"world", 2}, {"timeout_s", -1}}, "'timeout_s' must be"},
      {{{"job", "j"}, {"rank", 1}, {"world", 2}, {"timeout_s", "5"}}, "'timeout_s' must be"},
  };
  for (const Case& c : cases) {
    Status st = Raw(c.fields);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.fields.dump() << ": " << st.ToString();
    EXPECT_NE(st.message().find(c.expected), std::string::npos) << c.fields.dump() << ": " << st.message();
  }
  // Through the client API too.
  EXPECT_EQ(client_->Rendezvous("bad job", 0, 2, "x", 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Rendezvous("j", 2, 2, "", 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Rendezvous("j", 0, 0, "x", 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Rendezvous("j", 0, 2, std::string(4097, 'x'), 1).status().code(), StatusCode::kInvalidArgument);
  // The largest value and the widest charset pass.
  EXPECT_TRUE(Raw({{"job", "A-z_0.9:x"}, {"rank", 0}, {"world", 65536}, {"value", std::string(8192, 'f')}}).ok());
  EXPECT_TRUE(Raw({{"job", "j"}, {"rank", 0}, {"world", 2}, {"value", hex128}}).ok());
  // Nothing was refused for good: the daemon still serves.
  auto list = client_->List();
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  auto fresh = Connect();
  ASSERT_TRUE(fresh && fresh->List().ok());
}

TEST_F(RendezvousTest, StoppingTheDaemonEndsWaitsPromptly) {
  Result<std::string> r = Internal("unset");
  const auto start = steady_clock::now();
  std::thread waiter([&] { r = client_->Rendezvous("never", 1, 2, "", 60); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  daemon_.Stop();
  waiter.join();
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  EXPECT_LT(SecondsSince(start), 10);
}

TEST_F(RendezvousTest, AClientThatHangsUpEndsItsWait) {
  auto connections = [&] {
    auto s = client_->GetStatus();
    return s.ok() ? s->connections : -1;
  };
  // Connections of earlier calls (the start-up probe) may still be closing: wait until only
  // client_'s own is left, so the count below is this test's alone.
  auto settle = [&](int64_t want) {
    const auto t0 = steady_clock::now();
    while (connections() != want && SecondsSince(t0) < 5) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return connections();
  };
  const int64_t before = settle(1);
  ASSERT_EQ(before, 1) << "connections other than the test's own client";
  {
    auto conn = protocol::ConnectUnix(daemon_.socket());
    ASSERT_TRUE(conn.ok());
    ASSERT_TRUE(protocol::WriteFrame(conn->get(), json{{"v", protocol::kProtocolVersion}, {"op", "rendezvous"},
                                                       {"job", "gone"}, {"rank", 1}, {"world", 2},
                                                       {"timeout_s", 3600}})
                    .ok());
    EXPECT_EQ(settle(before + 1), before + 1) << "the waiting connection was not counted";
  }  // hangs up while the daemon waits for it
  const auto start = steady_clock::now();
  while (connections() != before && SecondsSince(start) < 5) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(connections(), before) << "the daemon still waits for a client that left";
}

}  // namespace
}  // namespace ckpt

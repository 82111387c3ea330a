// Connections that cannot be starved, and clients that stay in step (issue 12), against
// the real ckptd: callers with no role refused at accept while admins and readers keep
// working, per-uid limits, the whole-frame deadline, idle connections closed (and the
// Client reconnecting on its own), rendezvous entries owned by their uid, SIGINT
// cancelling `ckptctl load`, and control characters escaped in ckptctl's tables.
#include <gtest/gtest.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <nlohmann/json.hpp>
#include <thread>

#include "ckpt/client.h"
#include "common/hex.h"
#include "common/io.h"
#include "integration/ops_helpers.h"
#include "protocol/wire.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using nlohmann::json;
using testing::ChildProcess;
using testing::CommandResult;
using testing::DaemonProcess;
using testing::ReadFile;
using testing::ScratchDir;
using testing::TempGroup;
using testing::TempUser;

// Opens `n` connections to `socket` and keeps them; prints "held N refused R codes..."
// (R: connections the daemon answered with an error frame and closed), then waits for
// stdin to close.
const char* kHolder = R"(
import socket, struct, sys, json, time
path, n = sys.argv[1], int(sys.argv[2])
socks = []
for i in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    socks.append(s)
time.sleep(1.0)
refused, codes = 0, set()
for s in socks:
    s.settimeout(0.05)
    try:
        head = s.recv(4)
    except socket.timeout:
        continue
    if len(head) == 4:
        body = s.recv(struct.unpack('<I', head)[0])
        codes.add(json.loads(body).get('code', '?'))
        refused += 1
print('held', n, 'refused', refused, 'codes', ','.join(sorted(codes)), flush=True)
sys.stdin.read()
)";

// Lets other users reach the daemon's socket (its scratch directory is 0700).
void OpenSocketDir(const DaemonProcess& daemon) {
  const std::string dir = daemon.socket().substr(0, daemon.socket().rfind('/'));
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
}

// `user` running the holder (ChildProcess execs argv[0] without a PATH search).
std::vector<std::string> HolderAs(const TempUser& user, const std::string& socket, int n) {
  std::vector<std::string> argv = user.As({"/usr/bin/python3", "-c", kHolder, socket, std::to_string(n)});
  argv[0] = "/usr/bin/setpriv";
  return argv;
}

class ConnsTest : public ::testing::Test {
 protected:
  ScratchDir files_;
};

TEST_F(ConnsTest, RolelessUserHoldingConnectionsStopsNeitherAdminNorReader) {
  TempGroup readers;
  TempUser outsider;
  TempUser reader({readers.name()});
  DaemonProcess daemon({"--reader-group", readers.name(), "--socket-mode", "0666", "--max-connections", "8",
                        "--max-connections-per-uid", "4"});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  OpenSocketDir(daemon);
  testing::WritePatternCheckpoint(files_.File("m"), 1, 1, 64);
  ASSERT_EQ(::chmod(files_.path().c_str(), 0755), 0);
  ASSERT_EQ(daemon.Ctl({"load", files_.File("m"), "--name", "m"}).exit_code, 0);

  // 40 connections of a user with no role: each gets one refusal and is closed at once.
  ChildProcess flood(HolderAs(outsider, daemon.socket(), 40));
  if (!flood.WaitForOutput("held 40 refused 40 codes permission_denied", 20000)) {
    CommandResult r = flood.Wait();
    FAIL() << r.out << r.err << ReadFile(daemon.log_path());
  }
  // A reader holding connections is capped by the per-uid limit (4 of the 8 slots).
  ChildProcess greedy(HolderAs(reader, daemon.socket(), 10));
  if (!greedy.WaitForOutput("held 10 refused 6 codes resource_exhausted", 20000)) {
    CommandResult r = greedy.Wait();
    FAIL() << r.out << r.err;
  }
  // While both hold on: root's status and a reader's attach work.
  CommandResult status = daemon.Ctl({"status", "--json"});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  EXPECT_EQ(json::parse(status.out)["max_connections_per_uid"], 4);
  TempUser other_reader({readers.name()});
  CommandResult attach =
      testing::RunCommand(other_reader.As({CKPT_SHARD_READER_BIN, daemon.socket(), "m", "0", "1"}));
  EXPECT_EQ(attach.exit_code, 0) << attach.err;
  EXPECT_NE(attach.out.find("attached 'm'"), std::string::npos) << attach.out;
  // Fill the remaining regular slots with a second reader: the admin still gets in.
  TempUser filler({readers.name()});
  ChildProcess fill(HolderAs(filler, daemon.socket(), 4));
  ASSERT_TRUE(fill.WaitForOutput("held 4 refused 0", 20000));
  auto admin = Client::Connect(daemon.socket());
  ASSERT_TRUE(admin.ok());
  auto s = (*admin)->GetStatus();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->connections, 9);  // 4 + 4 readers, and this admin in a reserved slot
  EXPECT_EQ(s->your_role, "admin");
  // A third reader now finds no slot: a clear refusal, not a hang.
  TempUser late({readers.name()});
  CommandResult late_list = testing::RunCommand(late.As({CKPTCTL_BIN, "--socket", daemon.socket(), "list"}));
  EXPECT_EQ(late_list.exit_code, 1);
  EXPECT_NE(late_list.err.find("too many connections"), std::string::npos) << late_list.err;
}

TEST_F(ConnsTest, ASlowFrameIsDroppedAtTheFrameDeadline) {
  DaemonProcess daemon({"--frame-timeout", "2"});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  auto fd = protocol::ConnectUnix(daemon.socket());
  ASSERT_TRUE(fd.ok());
  const std::string body = R"({"v":1,"op":"list"})";
  std::string frame(4, '\0');
  frame[0] = static_cast<char>(body.size());
  frame += body;
  // One byte a second: each recv alone is quick, the frame never completes.
  const auto start = std::chrono::steady_clock::now();
  bool closed = false;
  std::string reply;
  for (size_t i = 0; i < frame.size() && !closed; ++i) {
    if (!SendAll(fd->get(), &frame[i], 1).ok()) break;
    pollfd p{fd->get(), POLLIN, 0};
    if (::poll(&p, 1, 1000) > 0) {
      auto r = protocol::ReadFrame(fd->get(), protocol::kMaxResponseBytes, nullptr, protocol::DeadlineIn(1));
      if (r.ok()) reply = r->dump();
      closed = true;
    }
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(10)) break;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(closed) << "the daemon kept a trickling frame open for " << secs << " s";
  EXPECT_GE(secs, 1.8);
  EXPECT_LE(secs, 2.0 + 1.5) << "dropped late";
  EXPECT_NE(reply.find("deadline_exceeded"), std::string::npos) << reply;
  char byte;
  EXPECT_LE(::recv(fd->get(), &byte, 1, 0), 0) << "connection still open";
  // The daemon serves on.
  EXPECT_EQ(daemon.Ctl({"status"}).exit_code, 0);
  std::printf("a one-byte-a-second frame was dropped after %.2f s (frame timeout 2 s)\n", secs);
}

TEST_F(ConnsTest, IdleConnectionsAreClosedAndTheClientReconnectsTransparently) {
  DaemonProcess daemon({"--idle-timeout", "1"});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  testing::WritePatternCheckpoint(files_.File("a"), 1, 1, 64);
  testing::WritePatternCheckpoint(files_.File("b"), 2, 1, 64);
  // A raw idle connection is closed (after a "closing" event).
  auto raw = protocol::ConnectUnix(daemon.socket());
  ASSERT_TRUE(raw.ok());
  pollfd p{raw->get(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1) << "idle connection not closed";
  auto closing = protocol::ReadFrame(raw->get(), protocol::kMaxResponseBytes);
  ASSERT_TRUE(closing.ok());
  EXPECT_EQ((*closing)["event"], "closing");

  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Load(files_.File("a"), "a").ok());
  auto lease = (*client)->Attach("a");  // a lease is idle by design: it stays
  ASSERT_TRUE(lease.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // the client's own connection is closed meanwhile
  // A load over the closed connection is sent again on a new one: no "may have run".
  auto b = (*client)->Load(files_.File("b"), "b");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  auto list = (*client)->List();
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ(list->size(), 2u);
  for (const auto& c : *list) EXPECT_EQ(c.attached, c.name == "a" ? 1u : 0u) << c.name;
  EXPECT_EQ((*client)->Evict("nope").code(), StatusCode::kNotFound);
}

TEST_F(ConnsTest, RendezvousEntriesBelongToTheirUid) {
  TempUser mallory;
  DaemonProcess daemon({"--socket-mode", "0666", "--rendezvous-per-uid", "3"});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  OpenSocketDir(daemon);
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Rendezvous("job-1", 0, 2, "nccl-id-of-root").ok());
  // Another uid publishing the same job does not replace root's value, nor can it read it.
  auto as_mallory = [&](const std::string& py) {
    return testing::RunCommand(mallory.As({"/usr/bin/python3", "-c", py, daemon.socket()}));
  };
  const std::string frame_fn = R"(
import socket, struct, json, sys
def call(req):
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
    b = json.dumps(dict(req, v=1)).encode(); s.sendall(struct.pack('<I', len(b)) + b)
    n = struct.unpack('<I', s.recv(4))[0]; d = b''
    while len(d) < n: d += s.recv(n - len(d))
    return json.loads(d)
)";
  CommandResult forged = as_mallory(frame_fn + R"(
print(call({'op': 'rendezvous', 'job': 'job-1', 'rank': 0, 'world': 2, 'value': '66'}).get('ok'))
print(call({'op': 'rendezvous', 'job': 'job-1', 'rank': 1, 'world': 2, 'timeout_s': 0.2}))
)");
  ASSERT_EQ(forged.exit_code, 0) << forged.err;
  EXPECT_NE(forged.out.find("True"), std::string::npos) << forged.out;  // its own entry
  auto value = (*client)->Rendezvous("job-1", 1, 2, "", 1.0);
  ASSERT_TRUE(value.ok()) << value.status().ToString();
  EXPECT_EQ(*value, "nccl-id-of-root");
  // Mallory's waiter got its own value ("66" = 'f'), never root's.
  EXPECT_NE(forged.out.find("'value': '66'"), std::string::npos) << forged.out;
  EXPECT_EQ(forged.out.find(HexEncode("nccl-id-of-root")), std::string::npos);
  // A uid reading a job only another uid published: PermissionDenied at its timeout.
  ASSERT_TRUE((*client)->Rendezvous("job-2", 0, 2, "secret").ok());
  CommandResult peek = as_mallory(frame_fn + R"(
print(call({'op': 'rendezvous', 'job': 'job-2', 'rank': 1, 'world': 2, 'timeout_s': 0.2}).get('code'))
)");
  EXPECT_NE(peek.out.find("permission_denied"), std::string::npos) << peek.out << peek.err;
  // Per-uid limit (3): mallory's job-1 was fetched (gone), so 3 fit and the 4th is
  // refused; root is unaffected.
  CommandResult fill = as_mallory(frame_fn + R"(
for j in ['a', 'b', 'c', 'd']:
    print(call({'op': 'rendezvous', 'job': j, 'rank': 0, 'world': 2, 'value': '00'}).get('code', 'ok'))
)");
  EXPECT_EQ(fill.out, "ok\nok\nok\nresource_exhausted\n") << fill.err;
  EXPECT_TRUE((*client)->Rendezvous("job-3", 0, 2, "x").ok());
}

TEST_F(ConnsTest, SigintCancelsCtlLoadAndNothingIsPublished) {
  ASSERT_NO_FATAL_FAILURE(testing::WriteSparseCheckpoint(files_.File("big"), 2ull << 30));  // 2 GiB hole
  testing::WritePatternCheckpoint(files_.File("small"), 3, 1, 64);
  DaemonProcess daemon({"--load-threads", "1"});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  ChildProcess load({CKPTCTL_BIN, "--socket", daemon.socket(), "load", files_.File("big"), "--name", "big"});
  ASSERT_TRUE(testing::WaitFor([&] { return !testing::ListSegments(daemon.shm_prefix(), "big.").empty(); }, 20000))
      << "the load never started";
  ASSERT_EQ(::kill(load.pid(), SIGINT), 0);
  CommandResult r = load.Wait();
  EXPECT_EQ(r.exit_code, 130) << r.out << r.err;
  EXPECT_NE(r.err.find("cancelled"), std::string::npos) << r.err;
  EXPECT_TRUE(testing::WaitFor([&] { return testing::ListSegments(daemon.shm_prefix(), "big.").empty(); }, 5000))
      << "the cancelled load left its segment";
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  auto list = (*client)->ListAll();
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->checkpoints.empty());
  EXPECT_TRUE(list->loading.empty());
  EXPECT_TRUE((*client)->Load(files_.File("small"), "small").ok()) << "daemon stopped serving";
  EXPECT_NE(ReadFile(daemon.log_path()).find("cancelled by the client"), std::string::npos);
}

TEST_F(ConnsTest, ACppProgressCallbackCancelsByReturningFalseOrThrowing) {
  ASSERT_NO_FATAL_FAILURE(testing::WriteSparseCheckpoint(files_.File("big"), 1ull << 30));  // 1 GiB hole
  testing::WritePatternCheckpoint(files_.File("small"), 4, 1, 64);
  DaemonProcess daemon({"--load-threads", "1"});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  auto nothing_published = [&] {
    auto list = (*client)->ListAll();
    ASSERT_TRUE(list.ok()) << list.status().ToString();
    EXPECT_TRUE(list->checkpoints.empty());
    EXPECT_TRUE(list->loading.empty());
    EXPECT_TRUE(testing::ListSegments(daemon.shm_prefix(), "big.").empty());
    // In step: the next call gets its own answer.
    EXPECT_EQ((*client)->Evict("no-such").code(), StatusCode::kNotFound);
  };
  LoadOptions stop;
  stop.name = "big";
  int calls = 0;
  stop.progress = [&](uint64_t, uint64_t) { return ++calls < 2; };
  auto r = (*client)->Load(files_.File("big"), stop);
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled) << r.status().ToString();
  EXPECT_EQ(calls, 2);
  nothing_published();
  LoadOptions thrower;
  thrower.name = "big";
  thrower.progress = [](uint64_t, uint64_t) -> bool { throw std::runtime_error("user callback failed"); };
  EXPECT_THROW((void)(*client)->Load(files_.File("big"), thrower), std::runtime_error);
  nothing_published();
  auto small = (*client)->Load(files_.File("small"), "small");
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  EXPECT_EQ(small->name, "small");
}

TEST_F(ConnsTest, AConnectionWithoutAThreadIsRefusedAndTheDaemonServesOn) {
  // ckptd as a fresh user limited to 5 threads (RLIMIT_NPROC counts a uid's threads):
  // main, the signal thread and 3 connections. Root's connections past that find no
  // thread: each must be answered and closed, not terminate the daemon.
  TempUser owner;
  ScratchDir run;
  ASSERT_EQ(::chmod(run.path().c_str(), 0777), 0);
  const std::string socket = run.File("ckptd.sock");
  const std::string prefix = testing::UniqueName("ckptnproc");
  ScratchDir state;  // the fresh user's own state directory
  ASSERT_EQ(::chown(state.path().c_str(), ::getpwnam(owner.name().c_str())->pw_uid, 0), 0);
  ASSERT_EQ(::chmod(state.path().c_str(), 0700), 0);
  std::vector<std::string> argv = owner.As({CKPTD_BIN, "--socket", socket, "--shm-prefix", prefix, "--socket-mode",
                                            "0666", "--state-dir", state.path(), "--cleanup-on-exit"});
  argv[0] = "/usr/bin/setpriv";
  argv.insert(argv.begin(), {"/usr/bin/prlimit", "--nproc=5", "--"});
  ChildProcess daemon(argv);
  ASSERT_TRUE(testing::WaitFor([&] { return protocol::ConnectUnix(socket).ok(); }, 10000)) << "ckptd did not start";
  std::vector<UniqueFd> held;
  int refused = 0;
  std::string message;
  for (int i = 0; i < 12; ++i) {
    auto fd = protocol::ConnectUnix(socket);
    ASSERT_TRUE(fd.ok());
    pollfd p{fd->get(), POLLIN, 0};
    if (::poll(&p, 1, 300) > 0) {
      auto reply = protocol::ReadFrame(fd->get(), protocol::kMaxResponseBytes, nullptr, protocol::DeadlineIn(1));
      if (reply.ok() && protocol::StatusOf(*reply).code() == StatusCode::kResourceExhausted) {
        ++refused;
        message = protocol::StatusOf(*reply).message();
      }
    }
    held.push_back(std::move(fd).value());
  }
  EXPECT_GE(refused, 1) << "every connection got a thread: is RLIMIT_NPROC enforced here?";
  EXPECT_NE(message.find("cannot start a thread"), std::string::npos) << message;
  ASSERT_EQ(::kill(daemon.pid(), 0), 0) << "ckptd died";
  held.clear();  // their threads end; a new client is served again
  std::unique_ptr<Client> client;
  EXPECT_TRUE(testing::WaitFor([&] {
    auto c = Client::Connect(socket);
    if (!c.ok() || !(*c)->GetStatus().ok()) return false;
    client = std::move(c).value();
    return true;
  }, 10000));
  ::kill(daemon.pid(), SIGTERM);
  std::printf("ckptd limited to 5 threads refused %d of 12 connections cleanly\n", refused);
  (void)daemon.Wait();  // --cleanup-on-exit: its segment directory goes with it
}

TEST_F(ConnsTest, CtlEscapesControlCharactersInTensorNames) {
  // A safetensors header whose tensor names hold an ESC sequence, a newline and a C1 CSI.
  const std::string evil = "w\\u001b]0;pwned\\u0007\\u001b[2Jx\\nfake row\\u009b1m";
  std::string header = "{\"" + evil + "\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  while (header.size() % 8) header += ' ';
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  file += header + std::string(8, '\0');
  testing::WriteFile(files_.File("evil.safetensors"), file);
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  ASSERT_EQ(daemon.Ctl({"load", files_.File("evil.safetensors"), "--name", "evil"}).exit_code, 0);
  CommandResult info = daemon.Ctl({"info", "evil"});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_EQ(info.out.find('\x1b'), std::string::npos) << "raw ESC printed";
  EXPECT_EQ(info.out.find('\x07'), std::string::npos);
  EXPECT_EQ(info.out.find("\xc2\x9b"), std::string::npos) << "raw C1 CSI printed";
  EXPECT_NE(info.out.find("w\\x1b]0;pwned\\x07\\x1b[2Jx\\nfake row\\u009b1m"), std::string::npos) << info.out;
  // Every line of the tensor table is a row of its own: the newline did not split one.
  EXPECT_EQ(info.out.find("\nfake row"), std::string::npos);
  // --json keeps the exact name (JSON escapes it).
  CommandResult j = daemon.Ctl({"info", "evil", "--json"});
  EXPECT_EQ(json::parse(j.out)["tensors"][0]["name"], "w\x1b]0;pwned\x07\x1b[2Jx\nfake row\xc2\x9b" "1m");
}

}  // namespace
}  // namespace ckpt

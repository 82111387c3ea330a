// Issue 23: every checkpoint has an owner. Real users of the admin, writer and reader
// groups (and none) against the real ckptd, each playing the attacker: replacing or
// evicting someone else's checkpoint, evicting it through the budget, holding the budget
// with an idle write, exhausting the daemon's descriptors with tiny publishes, outgrowing
// a quota, and the owner surviving a restart. Every refusal names the owner or the limit,
// leaves nothing published, evicted or reserved, and the daemon keeps serving.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pwd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>

#include "ckpt/client.h"
#include "ckpt/writer.h"
#include "integration/ops_helpers.h"
#include "protocol/messages.h"
#include "protocol/wire.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using nlohmann::json;
using testing::CommandResult;
using testing::DaemonProcess;
using testing::ReadFile;
using testing::ScratchDir;
using testing::TempGroup;
using testing::TempUser;

uid_t UidOf(const TempUser& user) {
  passwd* pw = ::getpwnam(user.name().c_str());
  return pw ? pw->pw_uid : static_cast<uid_t>(-1);
}

// Runs `body` in a child process as `user` (its groups from the group database) and
// returns what it returned; "child failed: ..." if it could not become the user.
std::string AsUser(const TempUser& user, const std::function<std::string()>& body) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return "child failed: pipe";
  passwd* pw = ::getpwnam(user.name().c_str());
  if (pw == nullptr) return "child failed: no user";
  const uid_t uid = pw->pw_uid;
  const gid_t gid = pw->pw_gid;
  pid_t child = ::fork();
  if (child == 0) {
    ::close(pipe_fds[0]);
    std::string out = "child failed: cannot become " + user.name();
    if (::initgroups(user.name().c_str(), gid) == 0 && ::setgid(gid) == 0 && ::setuid(uid) == 0) out = body();
    (void)!::write(pipe_fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  return out;
}

std::string Text(const Status& st) { return st.ok() ? "ok" : std::string(StatusCodeName(st.code())) + ": " + st.message(); }

// Publishes `name`: one F32 tensor "t" of `floats` copies of `value`. "ok evicted=a,b," or
// the error.
std::string Publish(const std::string& socket, const std::string& name, float value, bool replace = false,
                    uint64_t floats = 256) {
  WriterOptions o;
  o.replace = replace;
  o.timeout_s = 60;
  auto w = Writer::Create(socket, name, o);
  if (!w.ok()) return Text(w.status());
  auto data = std::make_shared<std::vector<float>>(floats, value);
  Status added = (*w)->AddBox("t", DType::kF32, {static_cast<int64_t>(floats)}, {}, {},
                              [data](uint64_t offset, void* dst, uint64_t size) {
                                std::memcpy(dst, reinterpret_cast<const std::byte*>(data->data()) + offset, size);
                                return Status::Ok();
                              });
  if (!added.ok()) return Text(added);
  auto r = (*w)->Commit();
  if (!r.ok()) return Text(r.status());
  std::string out = "ok evicted=";
  for (const auto& e : r->evicted) out += e + ",";
  return out;
}

// The first float of tensor "t" (or "w") of `name`, attached by root; NAN if absent.
float FirstFloat(const std::string& socket, const std::string& name, const char* tensor = "t") {
  auto client = Client::Connect(socket);
  if (!client.ok()) return NAN;
  auto c = (*client)->Attach(name);
  if (!c.ok()) return NAN;
  auto t = (*c)->Tensor(tensor);
  return t.ok() ? *reinterpret_cast<const float*>(t->data) : NAN;
}

std::string EvictAs(const std::string& socket, const std::string& name, bool force) {
  auto client = Client::Connect(socket);
  if (!client.ok()) return Text(client.status());
  EvictOptions o;
  o.force = force;
  return Text((*client)->Evict(name, o).status());
}

class OwnershipTest : public ::testing::Test {
 protected:
  void StartDaemon(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--model-root", models_.path(),  "--admin-group",  admins_.name(),
                                     "--writer-group", writers_.name(), "--reader-group", readers_.name(),
                                     "--socket-mode", "0666"};
    args.insert(args.end(), extra.begin(), extra.end());
    daemon_ = std::make_unique<DaemonProcess>(args);
    ASSERT_TRUE(daemon_->Start()) << ReadFile(daemon_->log_path());
    ASSERT_EQ(::chmod(daemon_->socket().substr(0, daemon_->socket().rfind('/')).c_str(), 0755), 0);
  }
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to create users";
    ASSERT_EQ(::chmod(models_.path().c_str(), 0755), 0);
    testing::WritePatternCheckpoint(models_.File("llama.safetensors"), 7, 1, 64);
  }
  const std::string& socket() const { return daemon_->socket(); }
  std::unique_ptr<Client> Root() {
    auto c = Client::Connect(socket());
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return std::move(c).value();
  }
  // Nothing reserved or being written, and memory in use is what the checkpoints hold.
  void ExpectNothingHeld() {
    auto st = Root()->GetStatus();
    ASSERT_TRUE(st.ok());
    uint64_t held = 0;
    for (const auto& c : st->checkpoint_list) held += c.segment_bytes;
    for (const auto& c : st->retired) held += c.segment_bytes;
    EXPECT_EQ(st->loading, 0u);
    EXPECT_EQ(st->memory_used_bytes, held);
  }

  ScratchDir models_;
  TempGroup admins_, writers_, readers_;
  TempUser admin_{{admins_.name(), readers_.name()}};
  TempUser w1_{{writers_.name(), readers_.name()}};
  TempUser w2_{{writers_.name(), readers_.name()}};
  TempUser reader_{{readers_.name()}};
  TempUser nobody_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(OwnershipTest, AWriterReplacesNeitherAnAdminsNorAnotherWritersCheckpoint) {
  StartDaemon();
  const std::string s = socket();
  CommandResult loaded = testing::RunCommand(admin_.As({CKPTCTL_BIN, "--socket", s, "load",
                                                        models_.File("llama.safetensors"), "--name", "llama"}));
  ASSERT_EQ(loaded.exit_code, 0) << loaded.err;
  const float llama = FirstFloat(s, "llama", "w");

  // w1 tries to replace the admin's llama: refused, naming its owner; llama unchanged.
  std::string r = AsUser(w1_, [&] { return Publish(s, "llama", 666.0f, /*replace=*/true); });
  EXPECT_EQ(r.rfind("permission_denied", 0), 0u) << r;
  EXPECT_NE(r.find("owned by uid " + std::to_string(UidOf(admin_)) + " (" + admin_.name() + ", admin)"),
            std::string::npos) << r;
  EXPECT_EQ(FirstFloat(s, "llama", "w"), llama);
  EXPECT_TRUE(std::isnan(FirstFloat(s, "llama", "t"))) << "the writer's tensor must not be there";

  // w1 publishes its own; w2 may neither replace nor evict it (even with force).
  ASSERT_EQ(AsUser(w1_, [&] { return Publish(s, "w1-run", 1.0f); }).rfind("ok", 0), 0u);
  r = AsUser(w2_, [&] { return Publish(s, "w1-run", 2.0f, true); });
  EXPECT_EQ(r.rfind("permission_denied", 0), 0u) << r;
  EXPECT_NE(r.find("owned by uid " + std::to_string(UidOf(w1_)) + " (" + w1_.name() + ")"), std::string::npos) << r;
  r = AsUser(w2_, [&] { return EvictAs(s, "w1-run", /*force=*/true); });
  EXPECT_EQ(r.rfind("permission_denied", 0), 0u) << r;
  EXPECT_NE(r.find(w1_.name()), std::string::npos) << r;
  r = AsUser(w2_, [&] { return EvictAs(s, "llama", true); });
  EXPECT_EQ(r.rfind("permission_denied", 0), 0u) << r;
  r = AsUser(reader_, [&] { return EvictAs(s, "w1-run", true); });
  EXPECT_EQ(r.rfind("permission_denied", 0), 0u) << r;
  EXPECT_EQ(FirstFloat(s, "w1-run"), 1.0f);
  ExpectNothingHeld();

  // The owner replaces and evicts its own; the list shows who owns what.
  EXPECT_EQ(AsUser(w1_, [&] { return Publish(s, "w1-run", 3.0f, true); }).rfind("ok", 0), 0u);
  EXPECT_EQ(FirstFloat(s, "w1-run"), 3.0f);
  auto list = Root()->List();
  ASSERT_TRUE(list.ok());
  for (const auto& c : *list) {
    const TempUser& owner = c.name == "llama" ? admin_ : w1_;
    EXPECT_EQ(c.owner_uid, UidOf(owner)) << c.name;
    EXPECT_EQ(c.owner_user, owner.name()) << c.name;
    EXPECT_EQ(c.owner_admin, c.name == "llama") << c.name;
  }
  CommandResult table = daemon_->Ctl({"list"});
  EXPECT_NE(table.out.find("OWNER"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find(w1_.name() + " (uid " + std::to_string(UidOf(w1_)) + ")"), std::string::npos) << table.out;
  EXPECT_NE(daemon_->Ctl({"info", "llama"}).out.find("owner: " + admin_.name()), std::string::npos);
  EXPECT_EQ(AsUser(w1_, [&] { return EvictAs(s, "w1-run", false); }), "ok");
  // An admin may evict anything.
  EXPECT_EQ(AsUser(w1_, [&] { return Publish(s, "w1-again", 4.0f); }).rfind("ok", 0), 0u);
  EXPECT_EQ(AsUser(admin_, [&] { return EvictAs(s, "w1-again", false); }), "ok");
}

TEST_F(OwnershipTest, NamesInAUidSpaceCannotBeSquatted) {
  StartDaemon();
  const std::string s = socket();
  const std::string mine = "u" + std::to_string(UidOf(w1_)) + ".cache-x";
  std::string r = AsUser(w2_, [&] { return Publish(s, mine, 9.0f); });
  EXPECT_EQ(r.rfind("permission_denied", 0), 0u) << r;
  EXPECT_NE(r.find("reserved for uid " + std::to_string(UidOf(w1_))), std::string::npos) << r;
  EXPECT_EQ(AsUser(w1_, [&] { return Publish(s, mine, 1.0f); }).rfind("ok", 0), 0u);
  EXPECT_EQ(FirstFloat(s, mine), 1.0f);
}

TEST_F(OwnershipTest, AWritersBudgetEvictionTakesOnlyItsOwnAndReportsIt) {
  // Segments of 64 Ki floats are 256 KiB + 8 KiB; a write reserves about 1 MiB more than
  // its data until it is published (shm::EstimateSegmentBytes). The budget holds three
  // published and one being written, not a fourth being written.
  StartDaemon({"--memory-budget", "1950K", "--max-shm-bytes-per-uid", "0"});
  const std::string s = socket();
  const uint64_t floats = 64 * 1024;
  const std::string admin_model = AsUser(admin_, [&] { return Publish(s, "admin-model", 5.0f, false, floats); });
  ASSERT_EQ(admin_model.rfind("ok", 0), 0u) << admin_model;
  ASSERT_EQ(AsUser(w1_, [&] { return Publish(s, "w1-a", 1.0f, false, floats); }), "ok evicted=");
  ASSERT_EQ(AsUser(w2_, [&] { return Publish(s, "w2-a", 2.0f, false, floats); }), "ok evicted=");
  // The budget is full: w1's next one may evict only w1-a (the admin's is the oldest).
  EXPECT_EQ(AsUser(w1_, [&] { return Publish(s, "w1-b", 1.5f, false, floats); }), "ok evicted=w1-a,");
  EXPECT_EQ(FirstFloat(s, "admin-model"), 5.0f);
  EXPECT_EQ(FirstFloat(s, "w2-a"), 2.0f);
  // Twice that cannot fit by evicting only its own: refused, nothing evicted or held.
  std::string r = AsUser(w1_, [&] { return Publish(s, "w1-c", 1.0f, false, 2 * floats); });
  EXPECT_EQ(r.rfind("resource_exhausted", 0), 0u) << r;
  EXPECT_NE(r.find("memory budget"), std::string::npos) << r;
  EXPECT_NE(r.find("a user evicts only its own"), std::string::npos) << r;
  auto list = Root()->List();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 3u);
  ExpectNothingHeld();
  // An admin's load may evict a writer's, and says which.
  LoadOptions llama;
  llama.name = "llama";
  auto loaded = Root()->Load(models_.File("llama.safetensors"), llama);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
}

TEST_F(OwnershipTest, QuotasBoundAWriterButNotAnAdminOrAnotherWriter) {
  StartDaemon({"--max-segments-per-uid", "2", "--max-writes-per-uid", "1", "--max-shm-bytes-per-uid", "4M"});
  const std::string s = socket();
  std::string r = AsUser(w1_, [&] {
    std::string out = Publish(s, "w1-a", 1.0f) + "|" + Publish(s, "w1-b", 1.0f) + "|";
    // Hold both: the third cannot evict them.
    auto client = Client::Connect(s);
    if (!client.ok()) return Text(client.status());
    auto a = (*client)->Attach("w1-a");
    auto b = (*client)->Attach("w1-b");
    if (!a.ok() || !b.ok()) return "attach failed after " + out + ": " + Text(a.status()) + " / " + Text(b.status());
    out += Publish(s, "w1-c", 1.0f) + "|";
    // More bytes than its limit at once.
    return out + Publish(s, "w1-big", 1.0f, false, 1024 * 1024);  // 4 MiB of data
  });
  auto parts = [](const std::string& text) {
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t bar; (bar = text.find('|', start)) != std::string::npos; start = bar + 1) out.push_back(text.substr(start, bar - start));
    out.push_back(text.substr(start));
    return out;
  };
  auto got = parts(r);
  ASSERT_EQ(got.size(), 4u) << r;
  EXPECT_EQ(got[0].rfind("ok", 0), 0u) << r;
  EXPECT_EQ(got[1].rfind("ok", 0), 0u) << r;
  EXPECT_EQ(got[2].rfind("resource_exhausted", 0), 0u) << r;
  EXPECT_NE(got[2].find("max-segments-per-uid"), std::string::npos) << r;
  EXPECT_NE(got[2].find(w1_.name()), std::string::npos) << r;
  EXPECT_EQ(got[3].rfind("resource_exhausted", 0), 0u) << r;
  EXPECT_NE(got[3].find("max-shm-bytes-per-uid"), std::string::npos) << r;
  ExpectNothingHeld();
  // Another writer and an admin are not bound by w1's use.
  EXPECT_EQ(AsUser(w2_, [&] { return Publish(s, "w2-a", 2.0f); }).rfind("ok", 0), 0u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(AsUser(admin_, [&] { return Publish(s, "adm" + std::to_string(i), 3.0f); }).rfind("ok", 0), 0u);
  }
  // One write at a time for w1: a second, while a two-part write waits for its other part.
  r = AsUser(w1_, [&] {
    auto sock = protocol::ConnectUnix(s);
    if (!sock.ok()) return Text(sock.status());
    protocol::WriteRequest first;
    first.name = "w1-pending";
    first.job = "job-1";
    first.parts = 2;
    first.pieces = {protocol::WritePiece{"t", DType::kF32, {16}, false, {0}, {8}, 0, 0}};
    json j = protocol::Encode(first);
    j["v"] = protocol::kProtocolVersion;
    j["op"] = "write";
    if (!protocol::WriteFrame(sock->get(), j).ok()) return std::string("send failed");
    // Wait until the daemon counts that write (the writer's own usage in its status).
    auto client = Client::Connect(s);
    if (!client.ok()) return Text(client.status());
    for (int i = 0; i < 500; ++i) {
      auto st = (*client)->GetStatus();
      if (st.ok() && st->your_writes == 1) break;
      ::usleep(10000);
    }
    return Publish(s, "w1-second", 1.0f);
  });
  EXPECT_EQ(r.rfind("resource_exhausted", 0), 0u) << r;
  EXPECT_NE(r.find("max-writes-per-uid"), std::string::npos) << r;
  ExpectNothingHeld();
}

TEST_F(OwnershipTest, AnIdleWriteIsReapedAndFreesItsBudgetForTheAdmin) {
  // A 400 KiB write reserves about 1.4 MiB: the budget holds one of them, not two.
  StartDaemon({"--memory-budget", "2000K", "--max-shm-bytes-per-uid", "0", "--write-idle-timeout", "1"});
  const std::string s = socket();
  std::string r = AsUser(w1_, [&] {
    auto sock = protocol::ConnectUnix(s);
    if (!sock.ok()) return Text(sock.status());
    protocol::WriteRequest w;
    w.name = "idle";
    w.timeout_s = 86400;  // the whole-write deadline would hold it a day
    w.pieces = {protocol::WritePiece{"t", DType::kF32, {100 * 1024}, false, {0}, {100 * 1024}, 0, 0}};
    json j = protocol::Encode(w);
    j["v"] = protocol::kProtocolVersion;
    j["op"] = "write";
    if (!protocol::WriteFrame(sock->get(), j).ok()) return std::string("send failed");
    auto ready = protocol::ReadFrame(sock->get(), protocol::kMaxResponseBytes, nullptr, protocol::DeadlineIn(20));
    if (!ready.ok()) return "no write_ready: " + Text(ready.status());
    if (protocol::EventName(*ready) != protocol::kWriteReadyEvent) return "no write_ready: " + ready->dump();
    // Now send nothing: the daemon fails the write on its own.
    auto answer = protocol::ReadFrame(sock->get(), protocol::kMaxResponseBytes, nullptr, protocol::DeadlineIn(30));
    if (!answer.ok()) return "no answer: " + answer.status().ToString();
    return Text(protocol::StatusOf(*answer));
  });
  EXPECT_EQ(r.rfind("deadline_exceeded", 0), 0u) << r;
  EXPECT_NE(r.find("write-idle-timeout"), std::string::npos) << r;
  EXPECT_NE(r.find("nothing was published"), std::string::npos) << r;
  ExpectNothingHeld();
  EXPECT_TRUE(testing::ListSegments(daemon_->shm_prefix(), "idle.").empty());
  // The admin's write that needs most of the budget gets it.
  r = AsUser(admin_, [&] { return Publish(s, "big", 1.0f, false, 100 * 1024); });
  EXPECT_EQ(r.rfind("ok", 0), 0u) << r;
}

TEST_F(OwnershipTest, TinyPublishesDoNotExhaustTheDaemonsDescriptors) {
  StartDaemon();  // 160 generations: within the default max-segments-per-uid (256)
  const std::string s = socket();
  // The daemon's descriptors: far fewer than the publishes below.
  CommandResult limited = testing::RunCommand(
      {"prlimit", "--pid", std::to_string(daemon_->pid()), "--nofile=96:96"});
  ASSERT_EQ(limited.exit_code, 0) << limited.err;
  const int count = 160;
  std::string r = AsUser(w1_, [&] {
    for (int i = 0; i < count; ++i) {
      std::string one = Publish(s, "tiny-" + std::to_string(i), static_cast<float>(i), false, 1);
      if (one.rfind("ok", 0) != 0) return "publish " + std::to_string(i) + ": " + one;
    }
    return std::string("ok");
  });
  EXPECT_EQ(r, "ok");
  // Every one attaches (one at a time: the attach's descriptor is not kept by the daemon).
  r = AsUser(reader_, [&] {
    for (int i = 0; i < count; i += 7) {
      if (FirstFloat(s, "tiny-" + std::to_string(i)) != static_cast<float>(i)) return "attach " + std::to_string(i);
    }
    return std::string("ok");
  });
  EXPECT_EQ(r, "ok");
  EXPECT_TRUE(daemon_->Running());
}

TEST_F(OwnershipTest, ADaemonOutOfDescriptorsRefusesClearlyAndServesOnceTheyAreFree) {
  StartDaemon();
  ASSERT_EQ(AsUser(w1_, [&] { return Publish(socket(), "m", 1.0f); }).rfind("ok", 0), 0u);
  CommandResult limited = testing::RunCommand({"prlimit", "--pid", std::to_string(daemon_->pid()), "--nofile=48:48"});
  ASSERT_EQ(limited.exit_code, 0) << limited.err;
  // Hold connections until the daemon has no descriptor left for the next one.
  std::vector<UniqueFd> held;
  std::string refusal;
  for (int i = 0; i < 80 && refusal.empty(); ++i) {
    auto fd = protocol::ConnectUnix(socket());
    ASSERT_TRUE(fd.ok()) << fd.status().ToString();
    pollfd p{fd->get(), POLLIN, 0};
    if (::poll(&p, 1, 300) == 1) {  // admitted connections stay silent; a refusal is one frame
      auto frame = protocol::ReadFrame(fd->get(), protocol::kMaxResponseBytes, nullptr, protocol::DeadlineIn(5));
      refusal = frame.ok() ? Text(protocol::StatusOf(*frame)) : Text(frame.status());
    }
    held.push_back(std::move(fd).value());
  }
  EXPECT_EQ(refusal.rfind("resource_exhausted", 0), 0u) << refusal;
  EXPECT_NE(refusal.find("out of file descriptors"), std::string::npos) << refusal;
  held.clear();
  // Descriptors free again: a reader attaches (the daemon closed the refused ones itself).
  std::string r;
  for (int i = 0; i < 100; ++i) {
    r = AsUser(reader_, [&] { return std::to_string(FirstFloat(socket(), "m")); });
    if (r == std::to_string(1.0f)) break;
    ::usleep(50000);  // the daemon notices the closed connections within its poll interval
  }
  EXPECT_EQ(r, std::to_string(1.0f));
}

TEST_F(OwnershipTest, AReaderOutOfDescriptorsIsToldSoNotCorrupt) {
  StartDaemon();
  ASSERT_EQ(AsUser(w1_, [&] { return Publish(socket(), "m", 1.0f); }).rfind("ok", 0), 0u);
  const std::string s = socket();
  std::string r = AsUser(reader_, [&] {
    auto client = Client::Connect(s);
    if (!client.ok()) return Text(client.status());
    // Room for the attach's own connection, none for the descriptor passed with it.
    int lowest = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    ::close(lowest);
    rlimit lim{static_cast<rlim_t>(lowest + 1), static_cast<rlim_t>(lowest + 1)};
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) return std::string("setrlimit failed");
    return Text((*client)->Attach("m").status());
  });
  EXPECT_EQ(r.rfind("resource_exhausted", 0), 0u) << r;
  EXPECT_NE(r.find("RLIMIT_NOFILE"), std::string::npos) << r;
  EXPECT_EQ(FirstFloat(s, "m"), 1.0f) << "the daemon serves the others";
}

TEST_F(OwnershipTest, TheOwnerSurvivesARestart) {
  StartDaemon();
  ASSERT_EQ(AsUser(w1_, [&] { return Publish(socket(), "kept", 1.0f); }).rfind("ok", 0), 0u);
  ASSERT_EQ(daemon_->Stop(), 0);
  ASSERT_TRUE(daemon_->Start()) << ReadFile(daemon_->log_path());
  ASSERT_EQ(::chmod(socket().substr(0, socket().rfind('/')).c_str(), 0755), 0);
  auto list = Root()->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].format, "adopted");
  EXPECT_EQ((*list)[0].owner_uid, UidOf(w1_));
  EXPECT_FALSE((*list)[0].owner_admin);
  const std::string s = socket();
  std::string r = AsUser(w2_, [&] { return Publish(s, "kept", 2.0f, true); });
  EXPECT_EQ(r.rfind("permission_denied", 0), 0u) << r;
  EXPECT_EQ(AsUser(w1_, [&] { return Publish(s, "kept", 3.0f, true); }).rfind("ok", 0), 0u);
  EXPECT_EQ(FirstFloat(s, "kept"), 3.0f);
}

TEST_F(OwnershipTest, OpsTheDaemonDoesNotListAreRefusedForEveryRole) {
  StartDaemon();
  const std::string s = socket();
  for (const TempUser* user : {&reader_, &w1_, &admin_}) {
    std::string r = AsUser(*user, [&] {
      auto sock = protocol::ConnectUnix(s);
      if (!sock.ok()) return Text(sock.status());
      if (!protocol::WriteFrame(sock->get(), json{{"v", protocol::kProtocolVersion}, {"op", "frobnicate"}}).ok()) {
        return std::string("send failed");
      }
      auto answer = protocol::ReadFrame(sock->get(), protocol::kMaxResponseBytes, nullptr, protocol::DeadlineIn(10));
      return answer.ok() ? Text(protocol::StatusOf(*answer)) : Text(answer.status());
    });
    EXPECT_EQ(r.rfind("invalid_argument: unknown op 'frobnicate'", 0), 0u) << user->name() << ": " << r;
  }
  // A user with no role gets nothing at all.
  std::string r = AsUser(nobody_, [&] { return EvictAs(s, "x", true); });
  EXPECT_EQ(r.rfind("permission_denied", 0), 0u) << r;
}

}  // namespace
}  // namespace ckpt

// `ensure` (issue 13) against the real ckptd: N processes at once share exactly one load
// and attach to one generation; a changed source (even with its mtime put back) loads a
// new generation; a name loaded from another path is refused; waiters get their peer's
// error; a first caller that disconnects or cancels does not strand the others; every
// caller withdrawing cancels the load; adopted generations; a stopping daemon; the C API.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "ckpt/ckpt.h"
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

// The value of an unlabelled series in the daemon's metrics (-1 if absent).
double Metric(Client& client, const std::string& series) {
  auto text = client.Metrics();
  if (!text.ok()) return -1;
  const std::string needle = "\n" + series + " ";
  const size_t at = text->find(needle);
  if (at == std::string::npos) return -1;
  return std::stod(text->substr(at + needle.size()));
}

// Occurrences of `needle` in `text`.
size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

class EnsureTest : public ::testing::Test {
 protected:
  ScratchDir files_;
};

TEST_F(EnsureTest, EightProcessesAtOnceShareOneLoadAndOneGeneration) {
  ASSERT_NO_FATAL_FAILURE(testing::WriteSparseCheckpoint(files_.File("m.safetensors"), 256ull << 20));
  DaemonProcess daemon({"--load-threads", "1"});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  constexpr int kRanks = 8;
  int go[2], results[2], hold[2];
  ASSERT_EQ(::pipe(go), 0);
  ASSERT_EQ(::pipe(results), 0);
  ASSERT_EQ(::pipe(hold), 0);
  std::vector<pid_t> children;
  for (int rank = 0; rank < kRanks; ++rank) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(go[1]);
      ::close(results[0]);
      ::close(hold[1]);
      char byte;
      if (::read(go[0], &byte, 1) != 0) _exit(3);  // every rank starts when the pipe closes
      char line[256];
      auto client = Client::Connect(daemon.socket());
      if (!client.ok()) _exit(4);
      EnsureOptions options;
      options.name = "m";
      auto ensured = (*client)->Ensure(files_.File("m.safetensors"), options);
      if (!ensured.ok()) {
        std::snprintf(line, sizeof(line), "error %s\n", ensured.status().ToString().substr(0, 200).c_str());
        (void)!::write(results[1], line, std::strlen(line));
        _exit(5);
      }
      auto attached = (*client)->Attach("m");
      std::snprintf(line, sizeof(line), "%s %llu %llu\n", ensured->action.c_str(),
                    static_cast<unsigned long long>(ensured->checkpoint.generation),
                    static_cast<unsigned long long>(attached.ok() ? (*attached)->generation() : 0));
      (void)!::write(results[1], line, std::strlen(line));
      if (::read(hold[0], &byte, 1) != 0) _exit(6);  // hold the attachment until the parent looked
      _exit(0);
    }
    children.push_back(pid);
  }
  ::close(go[0]);
  ::close(results[1]);
  ::close(hold[0]);
  ::close(go[1]);  // go
  std::string out;
  char buf[4096];
  while (std::count(out.begin(), out.end(), '\n') < kRanks) {
    const ssize_t n = ::read(results[0], buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(results[0]);
  std::map<std::string, int> actions;
  std::set<std::string> generations;
  std::istringstream lines(out);
  for (std::string action, ensured_gen, attached_gen; lines >> action >> ensured_gen >> attached_gen;) {
    ++actions[action];
    generations.insert(ensured_gen);
    EXPECT_EQ(ensured_gen, attached_gen) << "a rank attached to another generation than ensure reported";
  }
  EXPECT_EQ(actions["loaded"], 1) << out;
  EXPECT_EQ(actions["joined"] + actions["current"], kRanks - 1) << out;
  EXPECT_GE(actions["joined"], 1) << "no rank waited for the load in progress: " << out;
  EXPECT_EQ(generations.size(), 1u) << out;
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  auto list = (*client)->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].attached, static_cast<uint32_t>(kRanks)) << "all ranks hold the one generation";
  ::close(hold[1]);
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  // Counted by the daemon: one load, one "loading" line in its log.
  EXPECT_EQ(Metric(**client, "ckptd_loads_total"), 1) << *(*client)->Metrics();
  EXPECT_EQ(Count(ReadFile(daemon.log_path()), "loading 'm' generation"), 1u) << ReadFile(daemon.log_path());
}

TEST_F(EnsureTest, AChangedSourceLoadsANewGenerationAndAnUnchangedOneLoadsNothing) {
  const std::string path = files_.File("p.safetensors");
  testing::WritePatternCheckpoint(path, 3, 1, 64);
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  auto first = (*client)->Ensure(path);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->action, "loaded");
  EXPECT_EQ(first->checkpoint.name, "p");
  EXPECT_EQ(first->checkpoint.source_fingerprint.size(), 16u);
  auto again = (*client)->Ensure(path);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->action, "current");
  EXPECT_EQ(again->checkpoint.generation, first->checkpoint.generation);
  EXPECT_EQ(Metric(**client, "ckptd_loads_total"), 1);
  auto old = (*client)->Attach("p");
  ASSERT_TRUE(old.ok());

  // Same size, new bytes, and the mtime put back as it was: ctime still tells.
  struct stat before {};
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  testing::WritePatternCheckpoint(path, 3, 2, 64);
  const struct timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  auto changed = (*client)->Ensure(path);
  ASSERT_TRUE(changed.ok()) << changed.status().ToString();
  EXPECT_EQ(changed->action, "reloaded");
  EXPECT_GT(changed->checkpoint.generation, first->checkpoint.generation);
  EXPECT_NE(changed->checkpoint.source_fingerprint, first->checkpoint.source_fingerprint);
  auto now = (*client)->Attach("p");
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(reinterpret_cast<const int64_t*>((*now)->Tensor("meta")->data)[1], 2) << "the new content";
  EXPECT_EQ(reinterpret_cast<const int64_t*>((*old)->Tensor("meta")->data)[1], 1) << "the old mapping is kept";

  // Replaced by a rename (another inode): loads again; then nothing changes: current.
  testing::WritePatternCheckpoint(files_.File("p.tmp"), 3, 3, 64);
  ASSERT_EQ(::rename(files_.File("p.tmp").c_str(), path.c_str()), 0);
  auto renamed = (*client)->Ensure(path);
  ASSERT_TRUE(renamed.ok()) << renamed.status().ToString();
  EXPECT_EQ(renamed->action, "reloaded");
  auto settled = (*client)->Ensure(path);
  ASSERT_TRUE(settled.ok());
  EXPECT_EQ(settled->action, "current");
  EXPECT_EQ(settled->checkpoint.generation, renamed->checkpoint.generation);
  EXPECT_EQ(Metric(**client, "ckptd_loads_total"), 3);

  // A plain load records the fingerprint too: ensure after it finds it current.
  testing::WritePatternCheckpoint(files_.File("q.safetensors"), 4, 1, 64);
  ASSERT_TRUE((*client)->Load(files_.File("q.safetensors"), "q").ok());
  EnsureOptions q;
  q.name = "q";
  auto after_load = (*client)->Ensure(files_.File("q.safetensors"), q);
  ASSERT_TRUE(after_load.ok());
  EXPECT_EQ(after_load->action, "current");
}

TEST_F(EnsureTest, AGenerationAdoptedAfterARestartIsReloadedOnce) {
  const std::string path = files_.File("r.safetensors");
  testing::WritePatternCheckpoint(path, 8, 1, 64);
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  uint64_t before = 0;
  {
    auto client = Client::Connect(daemon.socket());
    ASSERT_TRUE(client.ok());
    auto first = (*client)->Ensure(path);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    before = first->checkpoint.generation;
  }
  ASSERT_EQ(daemon.Stop(), 0);
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  auto adopted = (*client)->List();
  ASSERT_TRUE(adopted.ok());
  ASSERT_EQ(adopted->size(), 1u) << "the segment was adopted";
  EXPECT_TRUE((*adopted)[0].source_fingerprint.empty()) << "what it was loaded from is not known";
  // Unknown is not taken for unchanged: one reload, then current.
  auto again = (*client)->Ensure(path);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->action, "reloaded");
  EXPECT_GT(again->checkpoint.generation, before);
  auto settled = (*client)->Ensure(path);
  ASSERT_TRUE(settled.ok());
  EXPECT_EQ(settled->action, "current");
}

TEST_F(EnsureTest, ANameLoadedFromAnotherPathIsRefusedAndLeftAlone) {
  testing::WritePatternCheckpoint(files_.File("a.safetensors"), 5, 1, 64);
  testing::WritePatternCheckpoint(files_.File("b.safetensors"), 6, 1, 64);
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  auto loaded = (*client)->Load(files_.File("a.safetensors"), "m");
  ASSERT_TRUE(loaded.ok());
  EnsureOptions options;
  options.name = "m";
  auto other = (*client)->Ensure(files_.File("b.safetensors"), options);
  EXPECT_EQ(other.status().code(), StatusCode::kFailedPrecondition) << other.status().ToString();
  EXPECT_NE(other.status().message().find("is loaded from " + files_.File("a.safetensors")), std::string::npos)
      << other.status().message();
  auto list = (*client)->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].generation, loaded->generation);
  EXPECT_EQ((*list)[0].source, files_.File("a.safetensors"));
  // The same through ckptctl, with a JSON error.
  CommandResult r = daemon.Ctl({"ensure", files_.File("b.safetensors"), "--name", "m", "--json"});
  EXPECT_EQ(r.exit_code, 1);
  json error = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(error.is_object()) << r.out;
  EXPECT_EQ(error["code"], "failed_precondition");
  // Bad input: a relative path (from the wire), a missing file, a bad name.
  EXPECT_EQ((*client)->Ensure(files_.File("missing.safetensors")).status().code(), StatusCode::kNotFound);
  EnsureOptions bad;
  bad.name = "../x";
  EXPECT_EQ((*client)->Ensure(files_.File("a.safetensors"), bad).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE((*client)->Ensure(files_.File("a.safetensors"), options).ok()) << "the daemon keeps serving";
}

// Ensure callers in threads, each on its own connection, that note when their first
// progress event arrived (then they have joined the load).
struct Waiter {
  std::thread thread;
  std::atomic<bool> joined{false};
  Result<EnsureResult> result = Internal("not run");
};

void StartWaiter(Waiter* w, const std::string& socket, const std::string& path) {
  w->thread = std::thread([w, socket, path] {
    auto client = Client::Connect(socket);
    if (!client.ok()) {
      w->result = client.status();
      return;
    }
    EnsureOptions options;
    options.name = "big";
    options.progress = [w](uint64_t, uint64_t) {
      w->joined = true;
      return true;
    };
    w->result = (*client)->Ensure(path, options);
  });
}

TEST_F(EnsureTest, WaitersGetTheErrorOfTheLoadTheyWaitedFor) {
  const std::string path = files_.File("big.safetensors");
  ASSERT_NO_FATAL_FAILURE(testing::WriteSparseCheckpoint(path, 2ull << 30));
  DaemonProcess daemon({"--load-threads", "1"});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  Waiter first;
  StartWaiter(&first, daemon.socket(), path);
  ASSERT_TRUE(testing::WaitFor([&] { return first.joined.load(); }, 20000)) << "the load never started";
  Waiter others[3];
  for (Waiter& w : others) StartWaiter(&w, daemon.socket(), path);
  const bool all_joined = testing::WaitFor(
      [&] { return others[0].joined && others[1].joined && others[2].joined; }, 20000);
  // The file shrinks under the load: it fails (the loader checks every file's identity).
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
  first.thread.join();
  for (Waiter& w : others) w.thread.join();
  ASSERT_TRUE(all_joined) << "the waiters never joined";
  ASSERT_FALSE(first.result.ok());
  EXPECT_NE(first.result.status().code(), StatusCode::kCancelled) << first.result.status().ToString();
  for (Waiter& w : others) {
    ASSERT_FALSE(w.result.ok()) << w.result->action;
    EXPECT_EQ(w.result.status().code(), first.result.status().code()) << w.result.status().ToString();
    EXPECT_EQ(w.result.status().message(), first.result.status().message());
  }
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  auto list = (*client)->ListAll();
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->checkpoints.empty());
  EXPECT_TRUE(list->loading.empty());
  EXPECT_TRUE(testing::WaitFor([&] { return testing::ListSegments(daemon.shm_prefix(), "big.").empty(); }, 5000));
  EXPECT_EQ(Metric(**client, "ckptd_loads_total"), 0);
  // The next ensure starts afresh (and fails on the truncated file on its own).
  EnsureOptions options;
  options.name = "big";
  EXPECT_FALSE((*client)->Ensure(path, options).ok());
  testing::WritePatternCheckpoint(files_.File("small.safetensors"), 1, 1, 16);
  EXPECT_TRUE((*client)->Ensure(files_.File("small.safetensors")).ok()) << "the daemon keeps serving";
}

TEST_F(EnsureTest, AFirstCallerThatDisconnectsDoesNotStrandTheOthers) {
  const std::string path = files_.File("big.safetensors");
  ASSERT_NO_FATAL_FAILURE(testing::WriteSparseCheckpoint(path, 1ull << 30));
  DaemonProcess daemon({"--load-threads", "1"});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  ChildProcess first({CKPTCTL_BIN, "--socket", daemon.socket(), "ensure", path, "--name", "big"});
  ASSERT_TRUE(testing::WaitFor([&] { return !testing::ListSegments(daemon.shm_prefix(), "big.").empty(); }, 20000))
      << "the load never started";
  Waiter others[2];
  for (Waiter& w : others) StartWaiter(&w, daemon.socket(), path);
  ASSERT_TRUE(testing::WaitFor([&] { return others[0].joined && others[1].joined; }, 20000))
      << "the waiters never joined";
  ASSERT_EQ(::kill(first.pid(), SIGKILL), 0);  // the first caller's connection drops
  (void)first.Wait();
  for (Waiter& w : others) w.thread.join();
  for (Waiter& w : others) {
    ASSERT_TRUE(w.result.ok()) << w.result.status().ToString();
    EXPECT_EQ(w.result->action, "joined");
    EXPECT_EQ(w.result->checkpoint.generation, others[0].result->checkpoint.generation);
  }
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  EXPECT_EQ(Metric(**client, "ckptd_loads_total"), 1);
  EXPECT_EQ(Metric(**client, "ckptd_loads_cancelled_total"), 0);
  // The first caller withdrew alone; the two others kept the load going.
  EXPECT_TRUE(testing::WaitFor(
      [&] { return ReadFile(daemon.log_path()).find("ensure of 'big': a caller withdrew (2 still waiting)") != std::string::npos; }, 5000))
      << ReadFile(daemon.log_path());
  auto attached = (*client)->Attach("big");
  ASSERT_TRUE(attached.ok()) << attached.status().ToString();
  EXPECT_EQ((*attached)->generation(), others[0].result->checkpoint.generation);
  attached->reset();
  EvictOptions evict;
  evict.wait_s = 10;  // the daemon sees the detach when the lease connection closes
  EXPECT_TRUE((*client)->Evict("big", evict).ok());
}

TEST_F(EnsureTest, CtrlCOnTheFirstCallerAnswersItAtOnceWhileTheLoadGoesOnForTheOthers) {
  const std::string path = files_.File("big.safetensors");
  ASSERT_NO_FATAL_FAILURE(testing::WriteSparseCheckpoint(path, 2ull << 30));
  DaemonProcess daemon({"--load-threads", "1"});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  ChildProcess first({CKPTCTL_BIN, "--socket", daemon.socket(), "ensure", path, "--name", "big"});
  ASSERT_TRUE(testing::WaitFor([&] { return !testing::ListSegments(daemon.shm_prefix(), "big.").empty(); }, 20000))
      << "the load never started";
  Waiter other;
  StartWaiter(&other, daemon.socket(), path);
  ASSERT_TRUE(testing::WaitFor([&] { return other.joined.load(); }, 20000)) << "the waiter never joined";
  ASSERT_EQ(::kill(first.pid(), SIGINT), 0);  // a cancel frame: this caller withdraws
  CommandResult r = first.Wait();
  EXPECT_EQ(r.exit_code, 130) << r.out << r.err;
  EXPECT_NE(r.err.find("ensure cancelled"), std::string::npos) << r.err;
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  auto list = (*client)->ListAll();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->loading, std::vector<std::string>{"big"}) << "ckptctl waited for the whole load";
  other.thread.join();
  ASSERT_TRUE(other.result.ok()) << other.result.status().ToString();
  EXPECT_EQ(other.result->action, "joined");
  EXPECT_EQ(Metric(**client, "ckptd_loads_total"), 1);
  EvictOptions evict;
  evict.wait_s = 10;
  EXPECT_TRUE((*client)->Evict("big", evict).ok());
}

TEST_F(EnsureTest, WhenEveryCallerWithdrawsTheLoadIsCancelledAndNothingPublished) {
  const std::string path = files_.File("big.safetensors");
  ASSERT_NO_FATAL_FAILURE(testing::WriteSparseCheckpoint(path, 2ull << 30));
  DaemonProcess daemon({"--load-threads", "1"});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  std::atomic<bool> stop{false};
  auto caller = [&](Result<EnsureResult>* out, std::atomic<bool>* started) {
    auto client = Client::Connect(daemon.socket());
    if (!client.ok()) return;
    EnsureOptions options;
    options.name = "big";
    options.progress = [&](uint64_t, uint64_t) {
      *started = true;
      return !stop.load();
    };
    *out = (*client)->Ensure(path, options);
  };
  Result<EnsureResult> a = Internal("not run"), b = Internal("not run");
  std::atomic<bool> a_started{false}, b_started{false};
  std::thread ta(caller, &a, &a_started);
  ASSERT_TRUE(testing::WaitFor([&] { return a_started.load(); }, 20000));
  std::thread tb(caller, &b, &b_started);
  const bool joined = testing::WaitFor([&] { return b_started.load(); }, 20000);
  stop = true;
  ta.join();
  tb.join();
  ASSERT_TRUE(joined);
  EXPECT_EQ(a.status().code(), StatusCode::kCancelled) << a.status().ToString();
  EXPECT_EQ(b.status().code(), StatusCode::kCancelled) << b.status().ToString();
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  auto list = (*client)->ListAll();
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(testing::WaitFor([&] {
    auto l = (*client)->ListAll();
    return l.ok() && l->checkpoints.empty() && l->loading.empty();
  }, 30000)) << ReadFile(daemon.log_path());
  EXPECT_TRUE(testing::WaitFor([&] { return testing::ListSegments(daemon.shm_prefix(), "big.").empty(); }, 5000));
  EXPECT_EQ(Metric(**client, "ckptd_loads_total"), 0);
  EXPECT_EQ(Metric(**client, "ckptd_loads_cancelled_total"), 1);
  EXPECT_NE(ReadFile(daemon.log_path()).find("cancelled (every caller withdrew)"), std::string::npos)
      << ReadFile(daemon.log_path());
}

TEST_F(EnsureTest, AStoppingDaemonCancelsTheSharedLoadAndExitsPromptly) {
  const std::string path = files_.File("big.safetensors");
  ASSERT_NO_FATAL_FAILURE(testing::WriteSparseCheckpoint(path, 4ull << 30));
  DaemonProcess daemon({"--load-threads", "1"});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  Waiter first, second;
  StartWaiter(&first, daemon.socket(), path);
  ASSERT_TRUE(testing::WaitFor([&] { return first.joined.load(); }, 20000)) << "the load never started";
  StartWaiter(&second, daemon.socket(), path);
  const bool joined = testing::WaitFor([&] { return second.joined.load(); }, 20000);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(daemon.Stop(), 0) << ReadFile(daemon.log_path());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  first.thread.join();
  second.thread.join();
  ASSERT_TRUE(joined);
  EXPECT_LT(seconds, 10) << "the daemon waited for the whole load";
  for (Waiter* w : {&first, &second}) {
    EXPECT_FALSE(w->result.ok()) << "published while stopping";
  }
  const std::string log = ReadFile(daemon.log_path());
  EXPECT_NE(log.find("cancelled (ckptd is stopping)"), std::string::npos) << log;
  EXPECT_EQ(log.find("loaded 'big'"), std::string::npos) << log;
  EXPECT_TRUE(testing::ListSegments(daemon.shm_prefix(), "big.").empty()) << "the cancelled segment was left";
}

TEST_F(EnsureTest, TheCApiEnsures) {
  testing::WritePatternCheckpoint(files_.File("c.safetensors"), 7, 1, 64);
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  ckpt_client* client = nullptr;
  ASSERT_EQ(ckpt_connect(daemon.socket().c_str(), &client), 0) << ckpt_last_error();
  uint64_t generation = 0, again = 0;
  int loaded = -1;
  ASSERT_EQ(ckpt_ensure(client, files_.File("c.safetensors").c_str(), "c", &generation, &loaded), 0)
      << ckpt_last_error();
  EXPECT_EQ(loaded, 1);
  EXPECT_GT(generation, 0u);
  ASSERT_EQ(ckpt_ensure(client, files_.File("c.safetensors").c_str(), "c", &again, &loaded), 0);
  EXPECT_EQ(loaded, 0);
  EXPECT_EQ(again, generation);
  EXPECT_EQ(ckpt_ensure(client, files_.File("nope.safetensors").c_str(), "c2", nullptr, nullptr), 2 /* not_found */);
  EXPECT_EQ(ckpt_ensure(client, nullptr, "c", nullptr, nullptr), 1 /* invalid_argument */);
  ckpt_client_free(client);
}

}  // namespace
}  // namespace ckpt

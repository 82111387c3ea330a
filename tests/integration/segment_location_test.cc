// Issue 23 (and issue 22's empty directories), against the real ckptd: a segment
// directory no other user can squat, and none left behind.
//
//  - A local user with no role plants, before the daemon ever starts, every path it can
//    predict: the old /dev/shm/<prefix> (a directory of its own, mode 0777), guesses of
//    the new /dev/shm/<prefix>.<random> (a link to its own directory, a FIFO). The daemon
//    starts, serves and loads; a kill -9 and a start re-adopt its segments from the same
//    directory. Then, each time the directory is gone (a reboot), the attacker, who saw
//    its name in /dev/shm, plants at that name a directory, a link, a FIFO or a file: the
//    daemon starts in a new directory of a random name every time. inotify shows that
//    none of the planted objects was ever opened (on main the first start exits 78).
//  - --segment-dir whose parents others can write (/dev/shm, a 0777 directory, another
//    user's directory) is a configuration error (78) that names the parent; one the
//    daemon may not create (a non-root daemon under /run) falls back to /dev/shm with a
//    warning; one in a safe place is created and its segments re-adopted.
//  - --cleanup-on-exit removes the directory the daemon created (a mount point stays), and
//    a failed start leaves no directory at all (on main both leave /dev/shm/<prefix>).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "ckpt/client.h"
#include "daemon/segment_location.h"
#include "integration/ops_helpers.h"
#include "protocol/wire.h"
#include "shm/huge_tmpfs.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::CommandResult;
using testing::DaemonProcess;
using testing::ReadFile;
using testing::RunCommand;
using testing::ScratchDir;
using testing::TempUser;

constexpr int kExConfig = 78;

// inotify watches on planted objects: any open, read or change of one is reported.
class OpenWatch {
 public:
  OpenWatch() : fd_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {}
  ~OpenWatch() {
    if (fd_ >= 0) ::close(fd_);
  }
  // Watches `path` itself (a link is not followed).
  void Add(const std::string& path) {
    const int wd = ::inotify_add_watch(fd_, path.c_str(),
                                       IN_OPEN | IN_ACCESS | IN_MODIFY | IN_CREATE | IN_DELETE | IN_DONT_FOLLOW);
    ASSERT_GE(wd, 0) << path << ": " << std::strerror(errno);
    paths_[wd] = path;
  }
  // What happened since the last call, one "<path>: <event>" per line.
  std::string Drain() {
    std::string out;
    alignas(inotify_event) char buf[4096];
    ssize_t n;
    while ((n = ::read(fd_, buf, sizeof(buf))) > 0) {
      for (char* p = buf; p < buf + n;) {
        const auto* e = reinterpret_cast<const inotify_event*>(p);
        out += paths_[e->wd] + (e->len ? "/" + std::string(e->name) : "") + ": " +
               (e->mask & IN_OPEN ? "open" : e->mask & IN_ACCESS ? "read" : "changed") + "\n";
        p += sizeof(inotify_event) + e->len;
      }
    }
    return out;
  }

 private:
  int fd_;
  std::map<int, std::string> paths_;
};

// Paths planted under /dev/shm, removed (as root) at the end.
struct Planted {
  std::vector<std::string> paths;
  ~Planted() {
    std::error_code ec;
    for (const auto& p : paths) fs::remove_all(p, ec);
  }
};

bool IsOurPrivateDirectory(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() &&
         (st.st_mode & 07777) == 0750;
}

std::string Basename(const std::string& path) { return path.substr(path.rfind('/') + 1); }

// The entries of /dev/shm whose names start with `prefix`.
std::vector<std::string> ShmEntries(const std::string& prefix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(shm::kShmRoot, ec)) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().string());
  }
  return out;
}

class SegmentLocationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::geteuid(), 0u) << "needs root (a second user, setpriv)";
    ASSERT_EQ(::chmod(files_.path().c_str(), 0755), 0);
    testing::WritePatternCheckpoint(files_.File("m.safetensors"), 3, 1, 256);  // 256 KiB
  }
  json CtlJson(const DaemonProcess& d, const std::vector<std::string>& args) {
    std::vector<std::string> a = args;
    a.push_back("--json");
    CommandResult r = d.Ctl(a);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return json::parse(r.out, nullptr, false);
  }
  // Loads m.safetensors as "m"; returns its generation (0 on failure).
  uint64_t LoadM(const DaemonProcess& d) {
    json c = CtlJson(d, {"load", files_.File("m.safetensors"), "--name", "m", "--replace"});
    return c.is_object() && c["checkpoint"].is_object() ? c["checkpoint"]["generation"].get<uint64_t>() : 0;
  }
  // Attaches to "m" and checks every float.
  void ReadsM(const DaemonProcess& d) {
    auto client = Client::Connect(d.socket());
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    auto m = (*client)->Attach("m");
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    auto meta = (*m)->Tensor("meta");
    auto w = (*m)->Tensor("w");
    ASSERT_TRUE(meta.ok() && w.ok());
    EXPECT_EQ(testing::WrongFloats(reinterpret_cast<const int64_t*>(meta->data),
                                   reinterpret_cast<const float*>(w->data), w->info->nbytes / 4),
              0u);
  }
  // ckptd in the foreground on a private socket, prefix and state directory, with `extra`.
  CommandResult RunDaemon(const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {"timeout", "20", CKPTD_BIN, "--socket", files_.File("run.sock"),
                                     "--shm-prefix", testing::UniqueName("ckloc"), "--state-dir",
                                     files_.File("run-state")};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return RunCommand(argv);
  }
  ScratchDir files_;
};

TEST_F(SegmentLocationTest, AnOutsiderWhoPlantsEveryPredictablePathNeitherStopsTheDaemonNorGetsAnythingOpened) {
  TempUser attacker;
  passwd* pw = ::getpwnam(attacker.name().c_str());
  ASSERT_NE(pw, nullptr);
  ScratchDir theirs;  // the attacker's own directory, where its links point
  ASSERT_EQ(::chown(theirs.path().c_str(), pw->pw_uid, pw->pw_gid), 0);
  ASSERT_EQ(::chmod(theirs.path().c_str(), 0777), 0);
  DaemonProcess daemon;
  const std::string prefix = daemon.shm_prefix();
  Planted planted;
  OpenWatch watch;
  auto as_attacker = [&](const std::vector<std::string>& command) {
    CommandResult r = RunCommand(attacker.As(command));
    EXPECT_EQ(r.exit_code, 0) << r.err;
  };
  // The watch sees opens of a directory and of a FIFO (so silence below means something).
  {
    ASSERT_EQ(::mkfifo(files_.File("canary").c_str(), 0600), 0);
    watch.Add(theirs.path());
    watch.Add(files_.File("canary"));
    ::close(::open(theirs.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ::close(::open(files_.File("canary").c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    const std::string seen = watch.Drain();
    ASSERT_NE(seen.find(theirs.path() + ": open"), std::string::npos) << seen;
    ASSERT_NE(seen.find(files_.File("canary") + ": open"), std::string::npos) << seen;
  }

  // 1. Before the first start: the old predictable directory (the attacker's, open to
  // all) and guesses of the new names.
  const std::string legacy = std::string(shm::kShmRoot) + "/" + prefix;
  const std::string guess_link = legacy + "." + std::string(32, '0');
  const std::string guess_fifo = legacy + "." + std::string(32, 'f');
  planted.paths = {legacy, guess_link, guess_fifo};
  as_attacker({"mkdir", "-m", "0777", legacy});
  as_attacker({"ln", "-s", theirs.path(), guess_link});
  as_attacker({"mkfifo", "-m", "0666", guess_fifo});
  watch.Add(legacy);
  watch.Add(guess_fifo);
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());  // main: exit 78 ("owned by uid")
  std::string dir = daemon.segment_dir();
  ASSERT_TRUE(IsOurPrivateDirectory(dir)) << dir;
  EXPECT_EQ(Basename(dir).rfind(prefix + ".", 0), 0u) << dir;
  EXPECT_NE(dir, guess_link);
  EXPECT_NE(dir, guess_fifo);
  const uint64_t gen = LoadM(daemon);
  ASSERT_GT(gen, 0u);
  ReadsM(daemon);
  EXPECT_NE(RunCommand(attacker.As({"touch", dir + "/m.99.x"})).exit_code, 0) << "the attacker wrote into it";
  EXPECT_EQ(CtlJson(daemon, {"status"})["segment_dir"], dir);

  // 2. kill -9 and start: the same directory, its segment re-adopted.
  daemon.Kill();
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  EXPECT_EQ(daemon.segment_dir(), dir);
  json list = CtlJson(daemon, {"list"})["checkpoints"];
  ASSERT_EQ(list.size(), 1u) << list.dump();
  EXPECT_EQ(list[0]["generation"], gen);
  ReadsM(daemon);

  // 3. The directory is gone (a reboot) and the attacker, who saw its name, takes it first.
  const std::vector<std::pair<std::string, std::vector<std::string>>> plants = {
      {"a directory", {"mkdir", "-m", "0777"}},
      {"a symbolic link", {"ln", "-s", theirs.path()}},
      {"a FIFO", {"mkfifo", "-m", "0666"}},
      {"a file", {"touch"}}};
  for (const auto& [kind, command] : plants) {
    SCOPED_TRACE(kind);
    CommandResult ls = RunCommand(attacker.As({"ls", shm::kShmRoot}));
    EXPECT_NE(ls.out.find(Basename(dir)), std::string::npos) << "the name is visible: " << ls.out;
    daemon.Kill();
    testing::RemoveSegmentDirectory(prefix);
    ASSERT_FALSE(fs::exists(dir));
    std::vector<std::string> plant = command;
    plant.push_back(dir);
    as_attacker(plant);
    planted.paths.push_back(dir);
    if (kind != "a symbolic link") watch.Add(dir);  // a link's target is watched already
    ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
    const std::string next = daemon.segment_dir();
    EXPECT_NE(next, dir);
    EXPECT_TRUE(IsOurPrivateDirectory(next)) << next;
    const std::string log = ReadFile(daemon.log_path());
    EXPECT_NE(log.find("the recorded segment directory " + dir + " is now " + kind + " of uid " +
                       std::to_string(pw->pw_uid)),
              std::string::npos)
        << log;
    EXPECT_GT(LoadM(daemon), gen);
    ReadsM(daemon);
    dir = next;
  }

  // 4. Nothing planted was ever opened, read or changed, and all of it is still there.
  EXPECT_EQ(watch.Drain(), "");
  EXPECT_TRUE(fs::is_empty(theirs.path())) << "something was created through a link";
  EXPECT_TRUE(fs::is_empty(legacy));
  struct stat st;
  ASSERT_EQ(::lstat(legacy.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, pw->pw_uid);
  EXPECT_EQ(st.st_mode & 07777, 0777u);
  ASSERT_EQ(::lstat(guess_fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(ReadFile(daemon.log_path()).find("cannot start"), std::string::npos);
}

TEST_F(SegmentLocationTest, ASegmentDirOthersCouldCreateFirstIsAConfigurationError) {
  TempUser other;
  // Directly in /dev/shm (mode 1777).
  const std::string in_shm = std::string(shm::kShmRoot) + "/" + testing::UniqueName("ckloc-dir");
  CommandResult r = RunDaemon({"--segment-dir", in_shm});
  EXPECT_EQ(r.exit_code, kExConfig) << r.err;
  EXPECT_NE(r.err.find("segment-dir '" + in_shm + "': /dev/shm is writable by group or others (mode 1777)"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(in_shm));
  // In a directory anyone may write.
  ScratchDir open;
  ASSERT_EQ(::chmod(open.path().c_str(), 0777), 0);
  r = RunDaemon({"--segment-dir", open.File("segments")});
  EXPECT_EQ(r.exit_code, kExConfig) << r.err;
  EXPECT_NE(r.err.find(open.path() + " is writable by group or others (mode 0777)"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(open.File("segments")));
  // In another user's directory (which that user may empty and refill at will).
  ScratchDir theirs;
  ASSERT_EQ(::chown(theirs.path().c_str(), ::getpwnam(other.name().c_str())->pw_uid, 0), 0);
  r = RunDaemon({"--segment-dir", theirs.File("segments")});
  EXPECT_EQ(r.exit_code, kExConfig) << r.err;
  EXPECT_NE(r.err.find(theirs.path() + " belongs to uid"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(theirs.File("segments")));
}

TEST_F(SegmentLocationTest, ASegmentDirInASafePlaceIsCreatedAndItsSegmentsReadopted) {
  DaemonProcess daemon({}, /*own_segment_dir=*/true);
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  EXPECT_TRUE(IsOurPrivateDirectory(daemon.segment_dir())) << daemon.segment_dir();
  EXPECT_EQ(CtlJson(daemon, {"status"})["segment_dir"], daemon.segment_dir());
  const uint64_t gen = LoadM(daemon);
  ASSERT_GT(gen, 0u);
  EXPECT_EQ(testing::ListSegments(daemon.shm_prefix(), "m.").size(), 1u);
  daemon.Kill();
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  json list = CtlJson(daemon, {"list"})["checkpoints"];
  ASSERT_EQ(list.size(), 1u) << list.dump();
  EXPECT_EQ(list[0]["generation"], gen);
  ReadsM(daemon);
  EXPECT_TRUE(ShmEntries(daemon.shm_prefix()).empty()) << "nothing in /dev/shm";
}

TEST_F(SegmentLocationTest, ADaemonThatMayNotCreateItsSegmentDirFallsBackToARandomNameInDevShm) {
  // ckptd as an unprivileged user told to use a directory under /run (root's): the
  // unit's mount failed, say. It warns and serves from /dev/shm/<prefix>.<random>.
  TempUser owner;
  passwd* pw = ::getpwnam(owner.name().c_str());
  ASSERT_NE(pw, nullptr);
  ScratchDir run;
  ASSERT_EQ(::chmod(run.path().c_str(), 0777), 0);
  ScratchDir state;
  ASSERT_EQ(::chown(state.path().c_str(), pw->pw_uid, 0), 0);
  ASSERT_EQ(::chmod(state.path().c_str(), 0700), 0);
  const std::string prefix = testing::UniqueName("ckfallback");
  const std::string wanted = "/run/" + testing::UniqueName("ckpt-segments-absent");
  const std::string socket = run.File("ckptd.sock");
  std::vector<std::string> argv = owner.As({CKPTD_BIN, "--socket", socket, "--socket-mode", "0666", "--shm-prefix",
                                            prefix, "--state-dir", state.path(), "--segment-dir", wanted,
                                            "--cleanup-on-exit"});
  argv[0] = "/usr/bin/setpriv";  // ChildProcess does not search PATH
  testing::ChildProcess daemon(argv);
  struct KillOnFailure {  // so that a failed assertion does not wait for a daemon forever
    pid_t pid;
    ~KillOnFailure() {
      if (pid > 0) ::kill(pid, SIGKILL);
    }
  } guard{daemon.pid()};
  if (!testing::WaitFor([&] { return protocol::ConnectUnix(socket).ok(); }, 10000)) {
    ::kill(daemon.pid(), SIGKILL);
    guard.pid = -1;
    FAIL() << "the daemon did not serve: " << daemon.Wait().err;
  }
  auto client = Client::Connect(socket);
  ASSERT_TRUE(client.ok());
  auto status = (*client)->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  const std::string dir = status->segment_dir;
  EXPECT_EQ(dir.rfind(std::string(shm::kShmRoot) + "/" + prefix + ".", 0), 0u) << dir;
  struct stat st;
  ASSERT_EQ(::lstat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, pw->pw_uid);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_EQ(ReadFile(state.File(daemon::kSegmentDirectoryRecord)), Basename(dir) + "\n");
  EXPECT_FALSE(fs::exists(wanted));
  client->reset();
  ::kill(daemon.pid(), SIGTERM);
  CommandResult r = daemon.Wait();
  guard.pid = -1;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("cannot create segment directory " + wanted), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("segments go to a directory of a random name in /dev/shm instead"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir)) << "--cleanup-on-exit left the directory";
}

TEST_F(SegmentLocationTest, CleanupOnExitAndAFailedStartLeaveNoDirectoryBehind) {
  // 1. --cleanup-on-exit: the segments and the directory go.
  {
    DaemonProcess daemon({"--cleanup-on-exit"});
    ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
    ASSERT_GT(LoadM(daemon), 0u);
    const std::string dir = daemon.segment_dir();
    ASSERT_TRUE(IsOurPrivateDirectory(dir)) << dir;
    EXPECT_EQ(daemon.Stop(), 0);
    EXPECT_FALSE(fs::exists(dir)) << "main: the empty directory stays";
    EXPECT_TRUE(ShmEntries(daemon.shm_prefix()).empty());
    EXPECT_NE(ReadFile(daemon.log_path()).find("removed segment directory " + dir), std::string::npos);
    // The next start makes a new one.
    ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
    EXPECT_TRUE(IsOurPrivateDirectory(daemon.segment_dir()));
    EXPECT_NE(daemon.segment_dir(), dir);
    EXPECT_EQ(daemon.Stop(), 0);
    EXPECT_TRUE(ShmEntries(daemon.shm_prefix()).empty());
  }
  // 2. The same with --segment-dir: the directory the daemon made goes; a mount point stays.
  {
    DaemonProcess daemon({"--cleanup-on-exit"}, /*own_segment_dir=*/true);
    ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
    ASSERT_GT(LoadM(daemon), 0u);
    EXPECT_EQ(daemon.Stop(), 0);
    EXPECT_FALSE(fs::exists(daemon.segment_dir()));
    testing::TmpfsMount mount(daemon.segment_dir(), "size=16m");
    if (mount.mounted()) {
      ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
      ASSERT_GT(LoadM(daemon), 0u);
      EXPECT_EQ(daemon.Stop(), 0);
      EXPECT_TRUE(fs::exists(daemon.segment_dir()));
      EXPECT_TRUE(fs::is_empty(daemon.segment_dir())) << "the segments were not removed";
      EXPECT_NE(ReadFile(daemon.log_path()).find("is a mount point; left in place"), std::string::npos);
    }
  }
  // 3. A start that fails after the directory was made (the socket is another daemon's).
  DaemonProcess running;
  ASSERT_TRUE(running.Start()) << ReadFile(running.log_path());
  const std::string prefix = testing::UniqueName("ckfailed");
  CommandResult r = RunCommand({"timeout", "20", CKPTD_BIN, "--socket", running.socket(), "--shm-prefix", prefix,
                                "--state-dir", files_.File("failed-state")});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("created segment directory"), std::string::npos) << r.err;
  EXPECT_TRUE(ShmEntries(prefix).empty()) << "main: /dev/shm/" << prefix << " stays";
  EXPECT_TRUE(running.Ctl({"status"}).exit_code == 0) << "the running daemon kept serving";
}

}  // namespace
}  // namespace ckpt

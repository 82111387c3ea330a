// Access control against the real ckptd: roles from the peer's uid and groups, model
// roots (symlink and ".." escapes), and read-only attachments passed over the socket.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <nlohmann/json.hpp>

#include "ckpt/client.h"
#include "integration/ops_helpers.h"
#include "protocol/daemon_connection.h"
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

std::string Dir(const std::string& path) { return path.substr(0, path.rfind('/')); }

class AccessTest : public ::testing::Test {
 protected:
  AccessTest()
      : daemon_({"--model-root", models_.path(), "--admin-group", admins_.name(), "--reader-group",
                 readers_.name(), "--socket-mode", "0666"}) {}

  void SetUp() override {
    ASSERT_EQ(::chmod(models_.path().c_str(), 0755), 0);
    testing::WritePatternCheckpoint(models_.File("m.safetensors"), 1, 1, 64);
    ASSERT_TRUE(daemon_.Start()) << ReadFile(daemon_.log_path());
    // Let other users reach the socket in the daemon's private directory.
    ASSERT_EQ(::chmod(Dir(daemon_.socket()).c_str(), 0755), 0);
  }

  CommandResult CtlAs(const TempUser& user, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {CKPTCTL_BIN, "--socket", daemon_.socket()};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::RunCommand(user.As(argv));
  }

  ScratchDir models_;
  TempGroup admins_, readers_;
  DaemonProcess daemon_;
};

TEST_F(AccessTest, UsersOutsideTheGroupsAreRefusedReadersMayOnlyReadAdminsMayLoad) {
  TempUser outsider;
  TempUser reader({readers_.name()});
  TempUser admin({admins_.name()});
  const std::string path = models_.File("m.safetensors");

  // Outsider: nothing at all, with a clear message.
  for (const auto& args : std::vector<std::vector<std::string>>{{"list"}, {"status"}, {"load", path, "--name", "x"}}) {
    CommandResult r = CtlAs(outsider, args);
    EXPECT_EQ(r.exit_code, 1) << args[0] << ": " << r.out;
    EXPECT_NE(r.err.find("neither the reader nor the admin group"), std::string::npos) << r.err;
  }

  // Admin (by group membership, not root) loads.
  CommandResult load = CtlAs(admin, {"load", path, "--name", "m"});
  ASSERT_EQ(load.exit_code, 0) << load.err;

  // Reader: may list and attach, may not load or evict.
  EXPECT_EQ(CtlAs(reader, {"list"}).exit_code, 0);
  CommandResult refused = CtlAs(reader, {"load", path, "--name", "y"});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("only a reader"), std::string::npos) << refused.err;
  EXPECT_EQ(CtlAs(reader, {"evict", "m"}).exit_code, 1);
  CommandResult attach = testing::RunCommand(reader.As({CKPT_SHARD_READER_BIN, daemon_.socket(), "m", "0", "1"}));
  EXPECT_EQ(attach.exit_code, 0) << attach.err;
  EXPECT_NE(attach.out.find("attached 'm'"), std::string::npos) << attach.out;
  // The outsider cannot attach either.
  CommandResult no_attach = testing::RunCommand(outsider.As({CKPT_SHARD_READER_BIN, daemon_.socket(), "m", "0", "1"}));
  EXPECT_NE(no_attach.exit_code, 0);
  EXPECT_NE(no_attach.err.find("permission_denied"), std::string::npos) << no_attach.err;

  // The segment: owned by the daemon's user, group readers, mode 0640, so an outsider
  // cannot open it by name either.
  auto names = testing::ListSegments(daemon_.shm_prefix());
  ASSERT_EQ(names.size(), 1u);
  const std::string segment = daemon_.segment_dir() + "/" + names[0];
  struct stat st;
  ASSERT_EQ(::stat(segment.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  group* g = ::getgrnam(readers_.name().c_str());
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(st.st_gid, g->gr_gid);
  CommandResult cat = testing::RunCommand(outsider.As({"cat", segment}));
  EXPECT_NE(cat.exit_code, 0);
  // The directory: the daemon's, group readers, 0750: outsiders cannot even list it.
  ASSERT_EQ(::stat(daemon_.segment_dir().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_EQ(st.st_gid, g->gr_gid);
  EXPECT_NE(testing::RunCommand(outsider.As({"ls", daemon_.segment_dir()})).exit_code, 0);
}

TEST_F(AccessTest, PathsOutsideTheModelRootsAreRefused) {
  ScratchDir elsewhere;
  testing::WritePatternCheckpoint(elsewhere.File("secret.safetensors"), 2, 1, 16);
  ASSERT_EQ(::mkdir(models_.File("sub").c_str(), 0755), 0);
  ASSERT_EQ(::symlink(elsewhere.File("secret.safetensors").c_str(), models_.File("escape.safetensors").c_str()), 0);
  ASSERT_EQ(::symlink(elsewhere.path().c_str(), models_.File("dirlink").c_str()), 0);
  ASSERT_EQ(::symlink(models_.File("m.safetensors").c_str(), models_.File("sub/inside.safetensors").c_str()), 0);

  struct Case {
    std::string path, expected;
  };
  const std::vector<Case> refused = {
      {elsewhere.File("secret.safetensors"), "outside the model roots"},
      {models_.File("escape.safetensors"), "symbolic link"},
      {models_.File("dirlink/secret.safetensors"), "symbolic link"},
      // No link is followed beneath the roots, even one that stays inside them.
      {models_.File("sub/inside.safetensors"), "symbolic link"},
      {models_.File("sub/../../") + elsewhere.path().substr(elsewhere.path().rfind('/') + 1) + "/secret.safetensors",
       "'..' component"},
      {models_.File("sub/../m.safetensors"), "'..' component"},
      {"/etc/passwd", "outside the model roots"},
  };
  for (const Case& c : refused) {
    CommandResult r = daemon_.Ctl({"load", c.path, "--name", "x"});
    EXPECT_EQ(r.exit_code, 1) << c.path;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << c.path << ": " << r.err;
  }
  // Model folders inside the roots whose files are links: refused before anything is read
  // through them, so the error says nothing about their targets (junk that would not parse).
  testing::WriteFile(elsewhere.File("junk.bin"), std::string(64, '#'));
  ASSERT_EQ(::mkdir(models_.File("sharded").c_str(), 0755), 0);
  ASSERT_EQ(::symlink(elsewhere.File("junk.bin").c_str(), models_.File("sharded/model-00001.safetensors").c_str()), 0);
  testing::WriteFile(models_.File("sharded/model.safetensors.index.json"),
                     R"({"metadata": {}, "weight_map": {"w": "model-00001.safetensors"}})");
  ASSERT_EQ(::mkdir(models_.File("folder").c_str(), 0755), 0);
  ASSERT_EQ(::symlink(elsewhere.File("junk.bin").c_str(), models_.File("folder/model.safetensors").c_str()), 0);
  for (const std::string& folder : {models_.File("sharded"), models_.File("folder")}) {
    CommandResult r = daemon_.Ctl({"load", folder, "--name", "x"});
    EXPECT_EQ(r.exit_code, 1) << folder;
    EXPECT_NE(r.err.find("symbolic link"), std::string::npos) << folder << ": " << r.err;
    EXPECT_EQ(r.err.find("junk"), std::string::npos) << r.err;
  }
  EXPECT_EQ(testing::SegmentCount(daemon_.shm_prefix()), 0u);
  CommandResult ok = daemon_.Ctl({"load", models_.File("m.safetensors"), "--name", "inside"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

TEST_F(AccessTest, ClientsGetAReadOnlyDescriptorAndCannotWriteTheCheckpoint) {
  ASSERT_EQ(daemon_.Ctl({"load", models_.File("m.safetensors"), "--name", "m"}).exit_code, 0);

  // The raw protocol: the attach response carries an O_RDONLY descriptor.
  auto connection = protocol::DaemonConnection::Open(daemon_.socket());
  ASSERT_TRUE(connection.ok());
  UniqueFd fd;
  auto response = (*connection)->Call("attach", json{{"name", "m"}}, nullptr, &fd);
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  ASSERT_TRUE(fd.valid()) << "no descriptor passed with the attach response";
  EXPECT_EQ(::fcntl(fd.get(), F_GETFL) & O_ACCMODE, O_RDONLY);
  EXPECT_NE(::fcntl(fd.get(), F_GETFD) & FD_CLOEXEC, 0);
  struct stat st;
  ASSERT_EQ(::fstat(fd.get(), &st), 0);
  void* w = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  EXPECT_EQ(w, MAP_FAILED);
  EXPECT_EQ(errno, EACCES);
  EXPECT_EQ(::write(fd.get(), "x", 1), -1);
  EXPECT_EQ(::ftruncate(fd.get(), 0), -1);

  // The client library's mapping: read-only, and cannot be made writable.
  auto client = Client::Connect(daemon_.socket());
  ASSERT_TRUE(client.ok());
  auto ckpt = (*client)->Attach("m");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  auto data = (*ckpt)->TensorData("w");
  ASSERT_TRUE(data.ok());
  const long page = ::sysconf(_SC_PAGESIZE);
  void* page_start = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(*data) & ~static_cast<uintptr_t>(page - 1));
  EXPECT_EQ(::mprotect(page_start, static_cast<size_t>(page), PROT_READ | PROT_WRITE), -1);
  EXPECT_EQ(errno, EACCES);
  // A write through the mapping kills the writer with SIGSEGV (checked in a child).
  pid_t child = ::fork();
  if (child == 0) {
    *const_cast<std::byte*>(*data) = std::byte{1};
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) << "status " << status;
  EXPECT_TRUE((*ckpt)->Verify().ok());
}

}  // namespace
}  // namespace ckpt

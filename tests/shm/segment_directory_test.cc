// SegmentDirectory: the daemon's private directory of segments and its refusals.
#include "shm/segment_directory.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "shm/huge_tmpfs.h"
#include "support/test_env.h"

namespace ckpt::shm {
namespace {

using testing::ScratchSegmentDirectory;

std::string FreshPath(const char* tag) {
  static int n = 0;
  return std::string(kShmRoot) + "/ckpttest-dir-" + std::to_string(::getpid()) + "-" + tag + std::to_string(n++);
}

struct PathRemover {
  std::string path;
  ~PathRemover() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

TEST(SegmentDirectoryTest, CreatesAPrivateDirectoryAndFixesTheModeOfOurOwn) {
  const std::string path = FreshPath("new");
  PathRemover cleanup{path};
  {
    std::string fixed;
    auto dir = SegmentDirectory::Open(path, {}, &fixed);
    ASSERT_TRUE(dir.ok()) << dir.status().ToString();
    struct stat st;
    ASSERT_EQ(::lstat(path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(st.st_mode & 07777, 0750u);
    EXPECT_EQ(st.st_uid, ::geteuid());
    EXPECT_EQ(fixed, "") << "a directory just created needs no fixing";
    // A second user of the same directory is refused while the first holds it.
    auto second = SegmentDirectory::Open(path);
    EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition) << second.status().ToString();
    EXPECT_NE(second.status().message().find("in use by another ckptd"), std::string::npos);
  }
  ASSERT_EQ(::chmod(path.c_str(), 0777), 0);
  std::string fixed;
  auto dir = SegmentDirectory::Open(path, {}, &fixed);
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  EXPECT_NE(fixed.find("from 0777 to 0750"), std::string::npos) << fixed;
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
}

TEST(SegmentDirectoryTest, RefusesSymlinksFilesAndOtherOwners) {
  ScratchSegmentDirectory target;
  const std::string link = FreshPath("link");
  PathRemover cleanup{link};
  ASSERT_EQ(::symlink(target.dir().path().c_str(), link.c_str()), 0);
  auto r = SegmentDirectory::Open(link, {false});
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("symbolic link"), std::string::npos) << r.status().ToString();

  const std::string file = FreshPath("file");
  PathRemover cleanup_file{file};
  testing::WriteFile(file, "x");
  r = SegmentDirectory::Open(file);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("not a directory"), std::string::npos) << r.status().ToString();

  if (::geteuid() != 0) GTEST_SKIP() << "needs root to create a directory owned by another user";
  const std::string theirs = FreshPath("theirs");
  PathRemover cleanup_theirs{theirs};
  ASSERT_EQ(::mkdir(theirs.c_str(), 0750), 0);
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
  r = SegmentDirectory::Open(theirs);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("owned by uid 65534"), std::string::npos) << r.status().ToString();
}

TEST(SegmentDirectoryTest, MustCreateAndMustExistAreHonouredAndAFifoIsNeverOpened) {
  using Create = SegmentDirectoryOptions::Create;
  const std::string path = FreshPath("modes");
  PathRemover cleanup{path};
  auto absent = SegmentDirectory::Open(path, {std::nullopt, true, Create::kMustExist});
  EXPECT_EQ(absent.status().code(), StatusCode::kNotFound) << absent.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(path)) << "kMustExist created it";
  {
    auto made = SegmentDirectory::Open(path, {std::nullopt, true, Create::kMustCreate});
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    EXPECT_TRUE((*made)->created());
    // Taken (by ourselves, here): kMustCreate never uses an existing name.
    auto again = SegmentDirectory::Open(path, {std::nullopt, false, Create::kMustCreate});
    EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists) << again.status().ToString();
  }
  auto found = SegmentDirectory::Open(path, {std::nullopt, true, Create::kMustExist});
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_FALSE((*found)->created());
  // A FIFO where the directory should be: refused at once, never opened (no block).
  const std::string fifo = FreshPath("fifo");
  PathRemover cleanup_fifo{fifo};
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0666), 0);
  const auto start = std::chrono::steady_clock::now();
  auto r = SegmentDirectory::Open(fifo, {std::nullopt, true, Create::kMustExist});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_NE(r.status().message().find("not a directory"), std::string::npos) << r.status().ToString();
}

TEST(SegmentDirectoryTest, RemoveIfEmptyRemovesOnlyAnEmptyDirectoryThatIsNotAMountPoint) {
  const std::string path = FreshPath("remove");
  PathRemover cleanup{path};
  auto dir = SegmentDirectory::Open(path);
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  ASSERT_TRUE((*dir)->Create("a", 4096, 0640).ok());
  Status st = (*dir)->RemoveIfEmpty();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("not empty"), std::string::npos) << st.ToString();
  EXPECT_TRUE(std::filesystem::exists(path));
  ASSERT_TRUE((*dir)->Remove("a").ok());
  EXPECT_TRUE((*dir)->RemoveIfEmpty().ok());
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_TRUE((*dir)->RemoveIfEmpty().ok()) << "gone already: OK";
  // Another directory now at the path is not ours to remove.
  ASSERT_EQ(::mkdir(path.c_str(), 0750), 0);
  st = (*dir)->RemoveIfEmpty();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_TRUE(std::filesystem::exists(path));
  ASSERT_EQ(::rmdir(path.c_str()), 0);
  // A mount point (the unit's tmpfs) stays.
  testing::TmpfsMount mount(path, "size=1m");
  if (!mount.mounted()) GTEST_SKIP() << "cannot mount a tmpfs: " << mount.error();
  auto mounted = SegmentDirectory::Open(path);
  ASSERT_TRUE(mounted.ok()) << mounted.status().ToString();
  st = (*mounted)->RemoveIfEmpty();
  EXPECT_NE(st.message().find("is a mount point"), std::string::npos) << st.ToString();
  EXPECT_TRUE(std::filesystem::exists(path));
}

TEST(SegmentDirectoryTest, CreateIsExclusiveAndNeverFollowsALink) {
  ScratchSegmentDirectory dir;
  auto fd = dir.dir().Create("a", 4096, 0640);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  struct stat st;
  ASSERT_EQ(::fstat(fd->get(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(st.st_size, 4096);
  EXPECT_EQ(dir.dir().Create("a", 4096, 0640).status().code(), StatusCode::kAlreadyExists);
  testing::ScratchDir elsewhere;
  const std::string victim = elsewhere.File("victim");
  testing::WriteFile(victim, "keep");
  ASSERT_EQ(::symlinkat(victim.c_str(), dir.dir().fd(), "link"), 0);
  EXPECT_EQ(dir.dir().Create("link", 4096, 0640).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(testing::ReadFile(victim), "keep");
  for (const char* bad : {"", ".", "..", "a/b"}) {
    EXPECT_EQ(dir.dir().Create(bad, 4096, 0640).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(dir.dir().Create("z", 0, 0640).status().code(), StatusCode::kInvalidArgument);
}

TEST(SegmentDirectoryTest, OpenOwnedAcceptsOnlyOurRegularFilesWithTheMode) {
  ScratchSegmentDirectory dir;
  ASSERT_TRUE(dir.dir().Create("good", 8192, 0640).ok());
  EXPECT_TRUE(dir.dir().OpenOwned("good", 0640, 8192).ok());
  auto check = [&](const std::string& name, const std::string& why) {
    const auto start = std::chrono::steady_clock::now();
    auto r = dir.dir().OpenOwned(name, 0640);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2)) << name << " blocked";
    EXPECT_FALSE(r.ok()) << name;
    EXPECT_NE(r.status().message().find(why), std::string::npos) << name << ": " << r.status().ToString();
  };
  EXPECT_EQ(dir.dir().OpenOwned("good", 0600).status().code(), StatusCode::kFailedPrecondition);
  check("good2", "no segment");
  ASSERT_EQ(::mkfifoat(dir.dir().fd(), "fifo", 0640), 0);
  check("fifo", "not a regular file");
  ASSERT_EQ(::symlinkat("good", dir.dir().fd(), "link"), 0);
  check("link", "symbolic link");
  ASSERT_EQ(::mkdirat(dir.dir().fd(), "sub", 0750), 0);
  check("sub", "not a regular file");
  ASSERT_TRUE(dir.dir().Create("small", 10, 0640).ok());
  EXPECT_NE(dir.dir().OpenOwned("small", 0640, 4096).status().message().find("smaller than"), std::string::npos);
  ASSERT_EQ(::linkat(dir.dir().fd(), "small", dir.dir().fd(), "hardlink", 0), 0);
  check("hardlink", "2 links");
  if (::geteuid() == 0) {
    ASSERT_TRUE(dir.dir().Create("theirs", 8192, 0640).ok());
    ASSERT_EQ(::fchownat(dir.dir().fd(), "theirs", 65534, 65534, 0), 0);
    check("theirs", "owned by uid 65534");
  }
}

TEST(SegmentDirectoryTest, RemoveReportsFailuresAndListSeesEverything) {
  ScratchSegmentDirectory dir;
  ASSERT_TRUE(dir.dir().Create("a", 4096, 0640).ok());
  ASSERT_EQ(::mkfifoat(dir.dir().fd(), "f", 0640), 0);
  ASSERT_EQ(::mkdirat(dir.dir().fd(), "d", 0750), 0);
  ASSERT_EQ(::mkdirat(dir.dir().fd(), "full", 0750), 0);
  ASSERT_EQ(::mkdirat(dir.dir().fd(), "full/x", 0750), 0);
  auto list = dir.dir().List();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 4u);
  EXPECT_TRUE(dir.dir().Remove("a").ok());
  EXPECT_TRUE(dir.dir().Remove("a").ok()) << "already gone is fine";
  EXPECT_TRUE(dir.dir().Remove("f").ok());
  EXPECT_TRUE(dir.dir().Remove("d").ok()) << "an empty directory goes too";
  Status st = dir.dir().Remove("full");
  EXPECT_EQ(st.code(), StatusCode::kIoError) << "a removal that fails says so";
  EXPECT_NE(st.message().find("full"), std::string::npos) << st.ToString();
  EXPECT_EQ(dir.dir().Remove("../x").code(), StatusCode::kInvalidArgument);
  ASSERT_EQ(::rmdir((dir.dir().path() + "/full/x").c_str()), 0);
}

}  // namespace
}  // namespace ckpt::shm

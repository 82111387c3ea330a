// GenerationStore: the persisted generation high-water mark and its refusals.
#include "daemon/generation_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "support/test_env.h"

namespace ckpt::daemon {
namespace {

using testing::ScratchDir;

TEST(GenerationStoreTest, PersistsTheMarkAtomicallyAndNeverLowersIt) {
  ScratchDir scratch;
  const std::string state = scratch.File("state");
  {
    auto store = GenerationStore::Open(state);  // created
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_EQ((*store)->last(), 0u);
    struct stat st;
    ASSERT_EQ(::stat(state.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0700u);
    ASSERT_TRUE((*store)->Persist(5).ok());
    ASSERT_TRUE((*store)->Persist(3).ok());  // lower: no change
    EXPECT_EQ((*store)->last(), 5u);
    EXPECT_EQ(testing::ReadFile(state + "/generation"), "5\n");
    EXPECT_FALSE(std::ifstream(state + "/generation.tmp").good()) << "no temporary file left";
    // A second daemon on the same state directory is refused while this one holds it.
    auto second = GenerationStore::Open(state);
    EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition) << second.status().ToString();
    EXPECT_NE(second.status().message().find("in use"), std::string::npos) << second.status().ToString();
  }
  auto again = GenerationStore::Open(state);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->last(), 5u);
}

TEST(GenerationStoreTest, UnusableStateDirectoriesAreClearErrors) {
  ScratchDir scratch;
  EXPECT_EQ(GenerationStore::Open("relative/dir").status().code(), StatusCode::kInvalidArgument);
  // A file where the directory should be.
  testing::WriteFile(scratch.File("file"), "x");
  auto r = GenerationStore::Open(scratch.File("file"));
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  EXPECT_NE(r.status().message().find("not a directory"), std::string::npos) << r.status().ToString();
  // No parent.
  r = GenerationStore::Open(scratch.File("no/such/dir"));
  EXPECT_EQ(r.status().code(), StatusCode::kIoError) << r.status().ToString();
  // Writable by others.
  ASSERT_EQ(::mkdir(scratch.File("open").c_str(), 0700), 0);
  ASSERT_EQ(::chmod(scratch.File("open").c_str(), 0777), 0);
  r = GenerationStore::Open(scratch.File("open"));
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  EXPECT_NE(r.status().message().find("writable by group or others"), std::string::npos) << r.status().ToString();
  // Owned by another user.
  if (::geteuid() == 0) {
    ASSERT_EQ(::mkdir(scratch.File("theirs").c_str(), 0700), 0);
    ASSERT_EQ(::chown(scratch.File("theirs").c_str(), 65534, 65534), 0);
    r = GenerationStore::Open(scratch.File("theirs"));
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
    EXPECT_NE(r.status().message().find("owned by uid 65534"), std::string::npos) << r.status().ToString();
  }
  // A mark that is not a number is never guessed at.
  ASSERT_EQ(::mkdir(scratch.File("bad").c_str(), 0700), 0);
  for (const char* text : {"", "12x\n", "-1\n", "99999999999999999999999\n"}) {
    testing::WriteFile(scratch.File("bad/generation"), text);
    r = GenerationStore::Open(scratch.File("bad"));
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << text << ": " << r.status().ToString();
  }
  ASSERT_EQ(::unlink(scratch.File("bad/generation").c_str()), 0);
  ASSERT_EQ(::mkfifo(scratch.File("bad/generation").c_str(), 0600), 0);
  r = GenerationStore::Open(scratch.File("bad"));  // a FIFO: refused, never blocks
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << r.status().ToString();
}

}  // namespace
}  // namespace ckpt::daemon

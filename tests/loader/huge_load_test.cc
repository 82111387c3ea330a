// LoadIntoSegment onto a real tmpfs mounted huge=within_size: the segment is on 2 MiB
// pages (the loader reports what the kernel mapped) with every populate strategy and
// both engines, and bytes and checksums are right; onto a tmpfs too small for the
// checkpoint, every strategy fails with ResourceExhausted (kDeferred mid-load, at the read
// whose pages do not fit), leaves nothing behind, and the process never gets a SIGBUS.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "format/checkpoint_formats.h"
#include "integration/ops_helpers.h"
#include "loader/checkpoint_loader.h"
#include "shm/huge_tmpfs.h"
#include "shm/segment_reader.h"
#include "support/test_env.h"

namespace ckpt::loader {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;
using testing::TmpfsMount;

struct Case {
  shm::PagePopulate populate;
  ReadEngine engine;
};
const Case kCases[] = {{shm::PagePopulate::kFallocate, ReadEngine::kPread},
                       {shm::PagePopulate::kParallel, ReadEngine::kPread},
                       {shm::PagePopulate::kDeferred, ReadEngine::kPread},
                       {shm::PagePopulate::kFallocate, ReadEngine::kUring},
                       {shm::PagePopulate::kDeferred, ReadEngine::kUring}};

class HugeLoadTest : public ::testing::Test {
 protected:
  void Mount(const std::string& options) {
    mount_ = std::make_unique<TmpfsMount>(scratch_.File("mnt"), options);
    if (!mount_->mounted()) GTEST_SKIP() << "cannot mount a tmpfs: " << mount_->error();
    auto dir = shm::SegmentDirectory::Open(mount_->dir() + "/segments");
    ASSERT_TRUE(dir.ok()) << dir.status().ToString();
    dir_ = std::move(dir).value();
    testing::WritePatternCheckpoint(scratch_.File("c.safetensors"), 3, 1, 12 * 1024);  // 12 MiB
    auto plan = format::PlanCheckpoint(scratch_.File("c.safetensors"));
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    plan_ = std::move(plan).value();
  }
  shm::SegmentSpec Spec() const {
    shm::SegmentSpec spec;
    spec.directory = dir_.get();
    spec.checkpoint_name = "c";
    spec.generation = 1;
    return spec;
  }
  size_t Entries() const { return static_cast<size_t>(std::distance(fs::directory_iterator(dir_->path()), {})); }
  // LoadIntoSegment of the checkpoint with case c's strategy and engine (3 threads, 1 MiB reads).
  Result<LoadedSegment> Load(const Case& c) const {
    LoadOptions options;
    options.threads = 3;
    options.engine = c.engine;
    options.populate = c.populate;
    options.chunk_bytes = 1 << 20;
    return LoadIntoSegment(plan_, Spec(), options);
  }

  ScratchDir scratch_;
  std::unique_ptr<TmpfsMount> mount_;
  std::unique_ptr<shm::SegmentDirectory> dir_;
  format::LoadPlan plan_;
};

TEST_F(HugeLoadTest, LoadsOntoHugePagesWithEveryStrategy) {
  Mount("huge=within_size,size=64m");
  if (IsSkipped()) return;
  const bool kernel_huge = mount_->KernelGivesHugePages();
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::to_string(static_cast<int>(c.populate)) + " " + ReadEngineName(c.engine));
    auto loaded = Load(c);
    if (!loaded.ok() && loaded.status().code() == StatusCode::kUnsupported) continue;  // no io_uring here
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    EXPECT_EQ(loaded->page_bytes, 2u << 20);
    EXPECT_EQ(loaded->segment_bytes % (2u << 20), 0u);
    if (kernel_huge) EXPECT_GE(loaded->huge_bytes, 10u << 20) << loaded->populate_summary;
    // Every page allocated: a client's fault can never need a page a full tmpfs lacks.
    EXPECT_EQ(::lseek(loaded->fd.get(), 0, SEEK_HOLE), static_cast<off_t>(loaded->segment_bytes))
        << loaded->populate_summary;
    auto reader = shm::SegmentReader::FromFd(loaded->fd.get(), loaded->file_name);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    ASSERT_TRUE((*reader)->VerifyChecksums().ok());
    const auto* meta = reinterpret_cast<const int64_t*>((*reader)->tensor_data((*reader)->Find("meta")));
    const size_t w = (*reader)->Find("w");
    EXPECT_EQ(testing::WrongFloats(meta, reinterpret_cast<const float*>((*reader)->tensor_data(w)),
                                   (*reader)->tensors()[w].nbytes / 4),
              0u);
    ASSERT_TRUE(dir_->Remove(loaded->file_name).ok());
  }
}

TEST_F(HugeLoadTest, OnSmallPagesEveryStrategyLeavesNoHole) {
  // 4 KiB pages: whatever the strategy, no page of the segment is left a hole.
  Mount("size=64m");
  if (IsSkipped()) return;
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::to_string(static_cast<int>(c.populate)) + " " + ReadEngineName(c.engine));
    auto loaded = Load(c);
    if (!loaded.ok() && loaded.status().code() == StatusCode::kUnsupported) continue;  // no io_uring here
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    EXPECT_EQ(loaded->page_bytes, 4096u);
    EXPECT_EQ(::lseek(loaded->fd.get(), 0, SEEK_HOLE), static_cast<off_t>(loaded->segment_bytes))
        << loaded->populate_summary;
    auto reader = shm::SegmentReader::FromFd(loaded->fd.get(), loaded->file_name);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    EXPECT_TRUE((*reader)->VerifyChecksums().ok());
    ASSERT_TRUE(dir_->Remove(loaded->file_name).ok());
  }
}

TEST_F(HugeLoadTest, ATmpfsTooSmallFailsEveryStrategyCleanly) {
  Mount("huge=within_size,size=8m");
  if (IsSkipped()) return;
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::to_string(static_cast<int>(c.populate)) + " " + ReadEngineName(c.engine));
    auto loaded = Load(c);
    ASSERT_FALSE(loaded.ok());
    if (loaded.status().code() == StatusCode::kUnsupported) continue;  // no io_uring here
    EXPECT_EQ(loaded.status().code(), StatusCode::kResourceExhausted) << loaded.status().ToString();
    if (c.populate == shm::PagePopulate::kDeferred && c.engine == ReadEngine::kPread) {
      // Failed while reading, at the first read whose pages did not fit.
      EXPECT_NE(loaded.status().message().find("no room in shared memory for the bytes of"), std::string::npos)
          << loaded.status().ToString();
    }
    EXPECT_EQ(Entries(), 0u) << "nothing left behind";
  }
}

}  // namespace
}  // namespace ckpt::loader

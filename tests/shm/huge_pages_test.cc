// Huge-page segments: detection of what a segment directory's file system offers (from
// mountinfo and the THP sysfs files), segments on a real tmpfs mounted huge=within_size
// (2 MiB-multiple sizes, 2 MiB-aligned mappings, PMD entries in a reader's mapping), and
// a tmpfs too small for the segment with every populate strategy: a clear
// ResourceExhausted, nothing left behind, never a SIGBUS.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "shm/huge_pages.h"
#include "shm/huge_tmpfs.h"
#include "shm/segment_directory.h"
#include "shm/segment_reader.h"
#include "shm/segment_writer.h"
#include "support/test_env.h"

namespace ckpt::shm {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;
using testing::TmpfsMount;

// A fake mountinfo and THP directory describing the real tmpfs /dev/shm.
struct FakeProc {
  ScratchDir dir;
  std::string mountinfo = dir.File("mountinfo");
  std::string thp = dir.File("thp");
  void Write(const std::string& super_options, const std::string& shmem_enabled, bool pmd = true) {
    struct stat st;
    ASSERT_EQ(::stat("/dev/shm", &st), 0);
    std::ofstream(mountinfo) << "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"
                             << "999 1 " << major(st.st_dev) << ":" << minor(st.st_dev)
                             << " / /dev/shm rw,nosuid - tmpfs tmpfs " << super_options << "\n";
    fs::create_directories(thp);
    std::ofstream(thp + "/shmem_enabled") << shmem_enabled << "\n";
    if (pmd) {
      std::ofstream(thp + "/hpage_pmd_size") << "2097152\n";
    } else {
      fs::remove(thp + "/hpage_pmd_size");
    }
  }
  PageSupport Detect() {
    int fd = ::open("/dev/shm", O_RDONLY | O_DIRECTORY);
    // Matched by device: the fake file's mount id is not the real one.
    PageSupport s = DetectPageSupportByDevice(fd);
    ::close(fd);
    return s;
  }
  PageSupport DetectPageSupportByDevice(int fd) { return DetectPageSupport(fd, "/dev/shm", mountinfo, thp, false); }
};

TEST(PageSupportTest, ReadsTheMountsHugeOptionAndTheKernelOverride) {
  FakeProc p;
  p.Write("rw,size=1024k,huge=within_size", "always within_size advise [never] deny force");
  PageSupport s = p.Detect();
  EXPECT_EQ(s.fs_type, "tmpfs");
  EXPECT_EQ(s.mount_huge, "within_size");
  EXPECT_TRUE(s.huge);
  EXPECT_FALSE(s.advise);
  EXPECT_EQ(s.segment_alignment(), 2u << 20);
  EXPECT_NE(s.Describe().find("tmpfs huge=within_size: 2 MiB pages"), std::string::npos) << s.Describe();

  p.Write("rw,huge=always", "always within_size advise never [deny] force");  // deny beats the mount
  s = p.Detect();
  EXPECT_FALSE(s.huge);
  EXPECT_EQ(s.segment_alignment(), 4096u);
  EXPECT_NE(s.Describe().find("shmem_enabled=deny"), std::string::npos) << s.Describe();

  p.Write("rw,size=10g", "always within_size advise never deny [force]");  // force beats no option
  EXPECT_TRUE(p.Detect().huge);

  p.Write("rw,huge=advise", "always within_size advise [never] deny force");
  s = p.Detect();
  EXPECT_TRUE(s.huge);
  EXPECT_TRUE(s.advise);

  p.Write("rw,size=10g", "always within_size advise [never] deny force");  // /dev/shm as shipped
  s = p.Detect();
  EXPECT_FALSE(s.huge);
  EXPECT_EQ(s.mount_huge, "never");
  EXPECT_NE(s.Describe().find("4 KiB pages"), std::string::npos);
  EXPECT_NE(s.Describe().find("huge=within_size"), std::string::npos) << "says what to do: " << s.Describe();

  p.Write("rw,huge=always", "always within_size advise [never] deny force", /*pmd=*/false);  // no THP kernel
  s = p.Detect();
  EXPECT_FALSE(s.huge);
  EXPECT_NE(s.note.find("no transparent huge pages"), std::string::npos) << s.note;
}

TEST(PageSupportTest, ADirectoryNotOnTmpfsGetsSmallPages) {
  ScratchDir d;  // under /tmp: not a tmpfs on most machines; skip where it is
  int fd = ::open(d.path().c_str(), O_RDONLY | O_DIRECTORY);
  PageSupport s = DetectPageSupport(fd, d.path());
  ::close(fd);
  if (s.fs_type == "tmpfs") GTEST_SKIP() << "/tmp is a tmpfs here";
  EXPECT_FALSE(s.huge);
  EXPECT_EQ(s.segment_alignment(), 4096u);
  EXPECT_NE(s.note.find("not on a tmpfs"), std::string::npos) << s.note;
}

// A tmpfs of `options` under a scratch directory, with a segment directory in it.
struct HugeDir {
  ScratchDir scratch;
  TmpfsMount mount;
  std::unique_ptr<SegmentDirectory> dir;
  explicit HugeDir(const std::string& options) : mount(scratch.File("mnt"), options) {
    if (!mount.mounted()) return;
    auto d = SegmentDirectory::Open(mount.dir() + "/segments");
    if (d.ok()) dir = std::move(d).value();
  }
  size_t Entries() const {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(dir->path())) n += e.path().filename() != ".thp-probe";
    return n;
  }
};

SegmentSpec BigSpec(const SegmentDirectory& dir, uint64_t mib, PagePopulate populate) {
  SegmentSpec spec;
  spec.directory = &dir;
  spec.checkpoint_name = "big";
  spec.generation = 1;
  spec.tensors.push_back({"w", DType::kU8, {static_cast<int64_t>(mib << 20)}, mib << 20, 0});
  spec.tensors.push_back({"b", DType::kU8, {5}, 5, 0});
  spec.populate = populate;
  spec.populate_threads = 3;
  return spec;
}

TEST(HugeSegmentTest, ASegmentOnAHugeTmpfsIsSizedAlignedAndMappedWithPmdEntries) {
  HugeDir h("huge=within_size,size=64m");
  if (!h.mount.mounted()) GTEST_SKIP() << "cannot mount a tmpfs: " << h.mount.error();
  ASSERT_TRUE(h.dir) << "segment directory on the tmpfs";
  if (!h.mount.KernelGivesHugePages()) GTEST_SKIP() << "the kernel offers no shmem THP";
  EXPECT_TRUE(h.dir->pages().huge) << h.dir->pages().Describe();
  for (PagePopulate populate : {PagePopulate::kFallocate, PagePopulate::kParallel, PagePopulate::kDeferred}) {
    SCOPED_TRACE(static_cast<int>(populate));
    auto writer = SegmentWriter::Create(BigSpec(*h.dir, 7, populate));
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    EXPECT_EQ((*writer)->segment_bytes() % (2u << 20), 0u) << "sized to whole huge pages";
    std::memset((*writer)->tensor_data(0), 0x5a, 7u << 20);
    std::memcpy((*writer)->tensor_data(1), "hello", 5);
    ASSERT_TRUE((*writer)->Populate(2).ok());
    ASSERT_TRUE((*writer)
                    ->Publish({Checksum((*writer)->tensor_data(0), 7u << 20), Checksum("hello", 5)}, 1)
                    .ok());
    EXPECT_GT((*writer)->HugeMappedBytes(), 0u);
    UniqueFd ro = (*writer)->TakeReadOnlyFd();
    const std::string name = (*writer)->file_name();
    writer->reset();
    // A client's view: a read-only mapping of the descriptor the daemon passes.
    auto reader = SegmentReader::FromFd(ro.get(), name);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    const std::byte* base = reinterpret_cast<const std::byte*>(&(*reader)->header());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % (2u << 20), 0u) << "the client's mapping is 2 MiB-aligned";
    ASSERT_TRUE((*reader)->VerifyChecksums().ok());  // touches every data page
    auto pmd = PmdMappedBytes(base);
    ASSERT_TRUE(pmd.ok()) << pmd.status().ToString();
    EXPECT_GE(*pmd, 6u << 20) << "the client maps the segment with 2 MiB entries";
    ASSERT_TRUE(h.dir->Remove(name).ok());
  }
}

TEST(HugeSegmentTest, ATmpfsTooSmallFailsCleanlyWithEveryPopulateStrategy) {
  HugeDir h("huge=within_size,size=6m");
  if (!h.mount.mounted()) GTEST_SKIP() << "cannot mount a tmpfs: " << h.mount.error();
  ASSERT_TRUE(h.dir);
  for (PagePopulate populate : {PagePopulate::kFallocate, PagePopulate::kParallel}) {
    SCOPED_TRACE(static_cast<int>(populate));
    auto writer = SegmentWriter::Create(BigSpec(*h.dir, 9, populate));
    ASSERT_FALSE(writer.ok());
    EXPECT_EQ(writer.status().code(), StatusCode::kResourceExhausted) << writer.status().ToString();
    EXPECT_NE(writer.status().message().find("room"), std::string::npos) << writer.status().ToString();
    EXPECT_EQ(h.Entries(), 0u) << "nothing left behind";
  }
  // Deferred: the header's pages fit; the data's do not. Populate() says so, Publish()
  // refuses a segment with holes, and the abandoned writer removes the file.
  {
    auto writer = SegmentWriter::Create(BigSpec(*h.dir, 9, PagePopulate::kDeferred));
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    EXPECT_EQ(h.Entries(), 1u);
    Status st = (*writer)->Populate(2);
    EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
    Status pub = (*writer)->Publish({0, 0}, 1);
    EXPECT_EQ(pub.code(), StatusCode::kInternal) << pub.ToString();
  }
  EXPECT_EQ(h.Entries(), 0u) << "the unpublished segment is removed";
  // And the directory still works for a segment that fits.
  auto small = SegmentWriter::Create(BigSpec(*h.dir, 1, PagePopulate::kFallocate));
  ASSERT_TRUE(small.ok()) << small.status().ToString();
}

TEST(HugeSegmentTest, DeferredTensorsWrittenThroughTheDescriptorLeaveOnlyTheTailToPopulate) {
  // kDeferred on tmpfs (4 KiB and 2 MiB pages): the tensors' bytes pwritten to data_fd()
  // allocate their pages; PopulateAroundTensors allocates the rest; no hole is left, the
  // bytes read back through the mapping, and Publish accepts the segment.
  for (const char* options : {"size=32m", "huge=within_size,size=32m"}) {
    SCOPED_TRACE(options);
    HugeDir h(options);
    if (!h.mount.mounted()) GTEST_SKIP() << "cannot mount a tmpfs: " << h.mount.error();
    ASSERT_TRUE(h.dir);
    auto writer = SegmentWriter::Create(BigSpec(*h.dir, 3, PagePopulate::kDeferred));
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    SegmentWriter& w = **writer;
    ASSERT_GE(w.data_fd(), 0);
    const std::vector<char> big(3u << 20, 'x');
    ASSERT_EQ(::pwrite(w.data_fd(), big.data(), big.size(), static_cast<off_t>(w.tensor_offset(0))),
              static_cast<ssize_t>(big.size()));
    ASSERT_EQ(::pwrite(w.data_fd(), "hello", 5, static_cast<off_t>(w.tensor_offset(1))), 5);
    EXPECT_EQ(std::memcmp(w.tensor_data(1), "hello", 5), 0);  // the mapping sees the writes
    ASSERT_TRUE(w.PopulateAroundTensors(2).ok());
    UniqueFd ro = w.TakeReadOnlyFd();
    EXPECT_EQ(::lseek(ro.get(), 0, SEEK_HOLE), static_cast<off_t>(w.segment_bytes()));
    ASSERT_TRUE(w.Publish({Checksum(w.tensor_data(0), 3u << 20), Checksum("hello", 5)}, 1).ok());
    EXPECT_EQ(w.data_fd(), -1) << "the writable descriptor is closed once published";
    const std::string name = w.file_name();
    writer->reset();
    ASSERT_TRUE(h.dir->Remove(name).ok());
  }
}

TEST(HugeSegmentTest, PopulateWriteReportsAFullFileSystemInsteadOfRaisingSigbus) {
  HugeDir h("size=1m");
  if (!h.mount.mounted()) GTEST_SKIP() << "cannot mount a tmpfs: " << h.mount.error();
  const std::string path = h.mount.dir() + "/f";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 4u << 20), 0);  // a sparse file larger than the tmpfs
  auto map = ShmMapping::MapFd(fd, "f", /*writable=*/true);
  ::close(fd);
  ASSERT_TRUE(map.ok());
  Status st = PopulateWrite((*map)->data(), (*map)->size(), 4, 4096, "file f");
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find("file f"), std::string::npos);
}

}  // namespace
}  // namespace ckpt::shm

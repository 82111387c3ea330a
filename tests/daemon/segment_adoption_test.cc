// AdoptSegments in-process: the newest generation whose data verifies wins, a corrupt
// newer one falls back to the older, superseded ones are removed, and the catalog numbers
// new generations above the adopted ones.
#include "daemon/segment_adoption.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>

#include "shm/segment_writer.h"
#include "support/test_env.h"

namespace ckpt::daemon {
namespace {

// Writes and publishes a one-tensor segment of `name` at `gen` filled with `fill`.
std::string WriteSegment(const shm::SegmentDirectory& dir, const std::string& name, uint64_t gen, char fill) {
  shm::SegmentSpec spec;
  spec.directory = &dir;
  spec.checkpoint_name = name;
  spec.source_path = "/models/" + name;
  spec.generation = gen;
  spec.mode = 0640;
  spec.tensors.push_back({"w", DType::kU8, {8192}, 8192, 0});
  auto writer = shm::SegmentWriter::Create(spec);
  EXPECT_TRUE(writer.ok()) << writer.status().ToString();
  if (!writer.ok()) return "";
  std::memset((*writer)->tensor_data(0), fill, 8192);
  EXPECT_TRUE((*writer)->Publish({shm::Checksum((*writer)->tensor_data(0), 8192)}, 1).ok());
  return (*writer)->file_name();
}

AdoptionOptions Options() {
  AdoptionOptions o;
  o.segment_mode = 0640;
  o.verify_threads = 2;
  return o;
}

TEST(SegmentAdoptionTest, NewestValidGenerationWinsAndCorruptDataIsNeverAdopted) {
  testing::ScratchSegmentDirectory dir;
  const std::string g1 = WriteSegment(dir.dir(), "m", 1, 'a');
  const std::string g2 = WriteSegment(dir.dir(), "m", 2, 'b');
  const std::string g3 = WriteSegment(dir.dir(), "m", 3, 'c');
  const std::string other = WriteSegment(dir.dir(), "other", 7, 'x');
  {
    // Generation 3's data changed after it was published.
    int fd = ::openat(dir.dir().fd(), g3.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, "Z", 1, 4096 * 2 + 100), 1);
    ::close(fd);
  }
  Catalog catalog(0, &dir.dir());
  auto report = AdoptSegments(dir.dir(), Options(), &catalog);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->adopted, 2u);
  EXPECT_EQ(report->removed, 2u);  // corrupt generation 3, superseded generation 1
  EXPECT_EQ(report->remove_failures, 0u);
  EXPECT_EQ(report->verified_bytes, 3u * 8192);  // 3 (corrupt), 2 (wins), other; never 1
  auto m = catalog.Get("m");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->generation, 2u);
  EXPECT_EQ(m->shm_name, g2);
  EXPECT_EQ(m->segment_id, g2.substr(g2.rfind('.') + 1));
  EXPECT_NE(m->ino, 0u) << "the file's identity, checked when attach opens it again (no descriptor is kept)";
  EXPECT_EQ(dir.List(), (std::vector<std::string>{g2, other}));
  // New generations come above every adopted one.
  auto next = catalog.BeginLoad("new", false, 1, Owner{0, true, "root"});
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, 8u);
}

TEST(SegmentAdoptionTest, AForeignModeOrABadNameIsRemovedAndTheRestStillAdopted) {
  testing::ScratchSegmentDirectory dir;
  const std::string good = WriteSegment(dir.dir(), "good", 1, 'g');
  const std::string loose = WriteSegment(dir.dir(), "loose", 2, 'l');
  ASSERT_EQ(::fchmodat(dir.dir().fd(), loose.c_str(), 0644, 0), 0);
  const std::string bad_name = WriteSegment(dir.dir(), "bad", 3, 'b');
  const std::string renamed = ".hidden" + bad_name.substr(3);  // a name the daemon would refuse
  ASSERT_EQ(::renameat(dir.dir().fd(), bad_name.c_str(), dir.dir().fd(), renamed.c_str()), 0);
  Catalog catalog(0, &dir.dir());
  AdoptionOptions options = Options();
  options.validate_name = [](const std::string& n) {
    return n[0] == '.' ? InvalidArgument("starts with '.'") : Status::Ok();
  };
  auto report = AdoptSegments(dir.dir(), options, &catalog);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->adopted, 1u);
  EXPECT_EQ(report->removed, 2u);
  EXPECT_EQ(catalog.List().size(), 1u);
  EXPECT_TRUE(catalog.Get("good").ok());
  EXPECT_EQ(dir.List(), std::vector<std::string>{good});
}

}  // namespace
}  // namespace ckpt::daemon

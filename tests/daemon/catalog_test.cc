// Catalog: budget with LRU eviction of unattached entries, generations (replace, retire,
// free at the last detach), attach by generation and segment id, generations persisted
// and never reused. Segments are real files in a private segment directory.
#include "daemon/catalog.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support/test_env.h"

namespace ckpt::daemon {
namespace {

const Owner kAdmin{0, true, "root"};  // ownership itself: tests/daemon/ownership_test.cc

class CatalogTest : public ::testing::Test {
 protected:
  // Loads `name` of `bytes` through BeginLoad/Publish, with a real object to unlink.
  Result<uint64_t> Load(Catalog& c, const std::string& name, uint64_t bytes, bool replace = false,
                        std::vector<std::string>* evicted = nullptr) {
    CKPT_ASSIGN_OR_RETURN(uint64_t gen, c.BeginLoad(name, replace, bytes, kAdmin, evicted));
    CatalogEntry e;
    e.name = name;
    e.generation = gen;
    e.shm_name = name + "." + std::to_string(gen);
    e.segment_id = "id-" + e.shm_name;
    e.segment_bytes = bytes;
    auto fd = segments_.dir().Create(e.shm_name, 4096, 0600);
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    c.Publish(std::move(e));
    return gen;
  }
  bool Exists(const std::string& name, uint64_t gen) {
    return !testing::ListSegments(segments_.prefix(), name + "." + std::to_string(gen)).empty();
  }
  const shm::SegmentDirectory* dir() const { return &segments_.dir(); }
  testing::ScratchSegmentDirectory segments_;
};

TEST_F(CatalogTest, OverBudgetEvictsLeastRecentlyUsedUnattachedOnly) {
  Catalog c(100, dir());
  ASSERT_TRUE(Load(c, "a", 30).ok());
  ASSERT_TRUE(Load(c, "b", 30).ok());
  ASSERT_TRUE(Load(c, "c", 30).ok());
  ASSERT_TRUE(c.Attach("a").ok());  // a: oldest but attached
  std::vector<std::string> evicted;
  ASSERT_TRUE(Load(c, "d", 30, false, &evicted).ok());
  EXPECT_EQ(evicted, std::vector<std::string>{"b"});
  EXPECT_FALSE(Exists("b", 2));
  EXPECT_EQ(c.UsedBytes(), 90u);
  // 80 bytes fit only by evicting "a" (attached): refused, and nothing is evicted.
  auto big = c.BeginLoad("e", false, 80, kAdmin);
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(c.List().size(), 3u);
  EXPECT_EQ(c.evictions().for_budget, 1u);
}

// Budget errors are read by people: sizes in binary units, with the exact bytes beside
// them (to compare with the configured value), and what to do.
TEST_F(CatalogTest, OverBudgetErrorSaysTheSizesForPeople) {
  Catalog c(12ull << 30, dir());
  auto big = c.BeginLoad("big", false, 13ull << 30, kAdmin);
  ASSERT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  const std::string m = big.status().message();
  EXPECT_NE(m.find("needs 13.00 GiB (13958643712 bytes)"), std::string::npos) << m;
  EXPECT_NE(m.find("the memory budget is 12.00 GiB (12884901888 bytes)"), std::string::npos) << m;
  EXPECT_NE(m.find("0 bytes in use"), std::string::npos) << m;
  EXPECT_NE(m.find("--memory-budget"), std::string::npos) << m;
}

TEST_F(CatalogTest, ReplaceRetiresTheAttachedGenerationUntilItsLastDetach) {
  Catalog c(0, dir());
  auto g1 = Load(c, "m", 10);
  ASSERT_TRUE(g1.ok());
  EXPECT_EQ(c.BeginLoad("m", false, 10, kAdmin).status().code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(c.Attach("m", 11).ok());
  ASSERT_TRUE(c.Attach("m", 12).ok());
  auto g2 = Load(c, "m", 10, /*replace=*/true);
  ASSERT_TRUE(g2.ok());
  EXPECT_GT(*g2, *g1);
  EXPECT_EQ(c.Get("m")->generation, *g2);
  ASSERT_EQ(c.Retired().size(), 1u);
  EXPECT_EQ(c.Retired()[0].attached_pids, (std::vector<int32_t>{11, 12}));
  EXPECT_TRUE(Exists("m", *g1));
  c.Detach("m", *g1, 11);
  EXPECT_TRUE(Exists("m", *g1));
  c.Detach("m", *g1, 12);
  EXPECT_FALSE(Exists("m", *g1));
  EXPECT_TRUE(c.Retired().empty());
  // Unattached generations are unlinked at once by a replace.
  auto g3 = Load(c, "m", 10, true);
  ASSERT_TRUE(g3.ok());
  EXPECT_FALSE(Exists("m", *g2));
  EXPECT_TRUE(c.Retired().empty());
}

TEST_F(CatalogTest, AttachByGenerationAndForcedEvict) {
  Catalog c(0, dir());
  auto g = Load(c, "m", 10);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(c.Attach("m", 1, *g).ok());
  EXPECT_EQ(c.Attach("m", 1, *g + 5).status().code(), StatusCode::kNotFound);
  // A lease names the content: the same generation with another segment id is refused.
  EXPECT_EQ(c.Attach("m", 1, *g, "id-other").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(c.Attach("m", 1, *g, "id-m." + std::to_string(*g)).ok());
  c.Detach("m", *g, 1);
  EXPECT_EQ(c.Evict("m", false, kAdmin).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(c.Evict("m", true, kAdmin).ok());
  EXPECT_FALSE(Exists("m", *g));          // unlinked now
  EXPECT_EQ(c.Retired().size(), 1u);      // but its memory counts until the detach
  EXPECT_EQ(c.UsedBytes(), 10u);
  c.Detach("m", *g, 1);
  EXPECT_EQ(c.UsedBytes(), 0u);
}

TEST_F(CatalogTest, GenerationsArePersistedBeforeUseAndNeverReused) {
  testing::ScratchDir state;
  uint64_t last = 0;
  {
    auto store = GenerationStore::Open(state.path());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    Catalog c(0, dir(), store->get());
    auto g1 = Load(c, "a", 1);
    auto g2 = Load(c, "b", 1);
    ASSERT_TRUE(g1.ok() && g2.ok());
    EXPECT_EQ(*g1, 1u);
    EXPECT_EQ(*g2, 2u);
    EXPECT_EQ((*store)->last(), 2u);
    EXPECT_EQ(testing::ReadFile(state.File("generation")), "2\n");
    last = *g2;
    ASSERT_TRUE(c.Evict("a", false, kAdmin).ok());
    ASSERT_TRUE(c.Evict("b", false, kAdmin).ok());
  }
  // A new catalog (a restart with no segment left) continues above the mark.
  auto store = GenerationStore::Open(state.path());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  Catalog c(0, dir(), store->get());
  auto g = Load(c, "a", 1);
  ASSERT_TRUE(g.ok());
  EXPECT_GT(*g, last);
}

TEST_F(CatalogTest, AGenerationThatCannotBePersistedFailsTheLoadAndEvictsNothing) {
  testing::ScratchDir state;
  auto store = GenerationStore::Open(state.path());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  Catalog c(100, dir(), store->get());
  ASSERT_TRUE(Load(c, "a", 60).ok());
  // The mark's temporary name taken by a directory: the write fails.
  ASSERT_EQ(::mkdir(state.File("generation.tmp").c_str(), 0700), 0);
  ASSERT_EQ(::mkdir(state.File("generation.tmp/x").c_str(), 0700), 0);
  auto refused = c.BeginLoad("b", false, 60, kAdmin);  // would evict "a"
  EXPECT_EQ(refused.status().code(), StatusCode::kIoError) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("generation"), std::string::npos) << refused.status().ToString();
  EXPECT_TRUE(Exists("a", 1)) << "nothing evicted for a load that never started";
  EXPECT_EQ(c.List().size(), 1u);
  EXPECT_TRUE(c.Loading().empty());
  ASSERT_EQ(::rmdir(state.File("generation.tmp/x").c_str()), 0);
  ASSERT_EQ(::rmdir(state.File("generation.tmp").c_str()), 0);
  auto g = Load(c, "b", 30);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(*g, 2u);
}

}  // namespace
}  // namespace ckpt::daemon

// Catalog: budget with LRU eviction of unattached entries, generations (replace, retire,
// free at the last detach), attach by generation. Segments are real shm objects.
#include "daemon/catalog.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "shm/shm_object.h"

namespace ckpt::daemon {
namespace {

class CatalogTest : public ::testing::Test {
 protected:
  ~CatalogTest() override {
    for (const auto& n : shm::ListShmObjects(prefix_)) (void)shm::RemoveShmObject(n);
  }
  // Loads `name` of `bytes` through BeginLoad/Publish, with a real object to unlink.
  Result<uint64_t> Load(Catalog& c, const std::string& name, uint64_t bytes, bool replace = false,
                        std::vector<std::string>* evicted = nullptr) {
    CKPT_ASSIGN_OR_RETURN(uint64_t gen, c.BeginLoad(name, replace, bytes, evicted));
    CatalogEntry e;
    e.name = name;
    e.generation = gen;
    e.shm_name = prefix_ + name + "." + std::to_string(gen);
    e.segment_bytes = bytes;
    auto m = shm::ShmMapping::Create(e.shm_name, 4096, 0600);
    EXPECT_TRUE(m.ok());
    c.Publish(std::move(e));
    return gen;
  }
  bool Exists(const std::string& name, uint64_t gen) {
    return !shm::ListShmObjects(prefix_ + name + "." + std::to_string(gen)).empty();
  }
  std::string prefix_ = "ckptcattest-" + std::to_string(::getpid()) + ".";
};

TEST_F(CatalogTest, OverBudgetEvictsLeastRecentlyUsedUnattachedOnly) {
  Catalog c(100);
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
  auto big = c.BeginLoad("e", false, 80);
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(c.List().size(), 3u);
  EXPECT_EQ(c.evictions().for_budget, 1u);
}

TEST_F(CatalogTest, ReplaceRetiresTheAttachedGenerationUntilItsLastDetach) {
  Catalog c;
  auto g1 = Load(c, "m", 10);
  ASSERT_TRUE(g1.ok());
  EXPECT_EQ(c.BeginLoad("m", false, 10).status().code(), StatusCode::kAlreadyExists);
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
  Catalog c;
  auto g = Load(c, "m", 10);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(c.Attach("m", 1, *g).ok());
  EXPECT_EQ(c.Attach("m", 1, *g + 5).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c.Evict("m", false).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(c.Evict("m", true).ok());
  EXPECT_FALSE(Exists("m", *g));          // unlinked now
  EXPECT_EQ(c.Retired().size(), 1u);      // but its memory counts until the detach
  EXPECT_EQ(c.UsedBytes(), 10u);
  c.Detach("m", *g, 1);
  EXPECT_EQ(c.UsedBytes(), 0u);
}

}  // namespace
}  // namespace ckpt::daemon

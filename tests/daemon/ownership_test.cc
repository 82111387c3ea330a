// Ownership in the Catalog (daemon/ownership.h): who may replace, evict and take names,
// budget evictions on a user's behalf, per-uid quotas; and the table of operations
// (daemon/request_handler.cc) against every op the protocol knows, failing closed.
#include "daemon/ownership.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "daemon/catalog.h"
#include "daemon/request_handler.h"
#include "protocol/messages.h"
#include "support/test_env.h"

namespace ckpt::daemon {
namespace {

const Owner kAdmin{0, true, "root"};
const Owner kAlice{1001, false, "alice"};
const Owner kBob{1002, false, "bob"};

class OwnershipTest : public ::testing::Test {
 protected:
  Result<uint64_t> Load(Catalog& c, const std::string& name, uint64_t bytes, const Owner& actor,
                        bool replace = false, std::vector<std::string>* evicted = nullptr) {
    CKPT_ASSIGN_OR_RETURN(uint64_t gen, c.BeginLoad(name, replace, bytes, actor, evicted));
    CatalogEntry e;
    e.name = name;
    e.generation = gen;
    e.shm_name = name + "." + std::to_string(gen);
    e.segment_bytes = bytes;
    auto fd = segments_.dir().Create(e.shm_name, 4096, 0600);
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    c.Publish(std::move(e));
    return gen;
  }
  testing::ScratchSegmentDirectory segments_;
};

TEST_F(OwnershipTest, OnlyTheOwnerOrAnAdminReplacesOrEvictsAndTheOwnerIsWhoReserved) {
  Catalog c(0, &segments_.dir());
  ASSERT_TRUE(Load(c, "llama", 10, kAdmin).ok());
  ASSERT_TRUE(Load(c, "alice-run", 10, kAlice).ok());
  EXPECT_EQ(c.Get("llama")->owner.uid, 0u);
  EXPECT_TRUE(c.Get("llama")->owner.admin);
  EXPECT_EQ(c.Get("alice-run")->owner.uid, 1001u);

  // A writer cannot replace or evict the admin's, nor another writer's.
  for (const char* name : {"llama", "alice-run"}) {
    const Owner& other = std::string(name) == "llama" ? kAlice : kBob;
    auto replaced = c.BeginLoad(name, true, 10, other);
    EXPECT_EQ(replaced.status().code(), StatusCode::kPermissionDenied) << name;
    EXPECT_NE(replaced.status().message().find("owned by uid"), std::string::npos) << replaced.status().ToString();
    auto evicted = c.Evict(name, /*force=*/true, other);
    EXPECT_EQ(evicted.status().code(), StatusCode::kPermissionDenied) << name;
  }
  EXPECT_TRUE(c.Loading().empty()) << "a refused replace reserves nothing";
  EXPECT_EQ(c.List().size(), 2u);
  // The owner replaces its own; an admin replaces anything and becomes its owner.
  ASSERT_TRUE(Load(c, "alice-run", 10, kAlice, true).ok());
  EXPECT_EQ(c.Get("alice-run")->owner.uid, 1001u);
  ASSERT_TRUE(Load(c, "alice-run", 10, kAdmin, true).ok());
  EXPECT_TRUE(c.Get("alice-run")->owner.admin);
  EXPECT_EQ(c.BeginLoad("alice-run", true, 10, kAlice).status().code(), StatusCode::kPermissionDenied);
  // A name being written by one uid is not another's to take, nor to evict.
  ASSERT_TRUE(c.BeginLoad("pending", false, 10, kAlice).ok());
  EXPECT_EQ(c.BeginLoad("pending", true, 10, kBob).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(c.Evict("pending", true, kBob).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(c.BeginLoad("pending", false, 10, kAlice).status().code(), StatusCode::kAlreadyExists);
  c.AbortLoad("pending");
  ASSERT_TRUE(c.Evict("llama", false, kAdmin).ok());
}

TEST_F(OwnershipTest, NamesOfAUidSpaceAreThatUidsAndAdmins) {
  EXPECT_EQ(ReservedFor("u1001.cache-x"), std::optional<uint32_t>(1001));
  EXPECT_EQ(ReservedFor("u0.x"), std::optional<uint32_t>(0));
  EXPECT_EQ(ReservedFor("u01001.x"), std::optional<uint32_t>(kNoUid));
  EXPECT_EQ(ReservedFor("u99999999999.x"), std::optional<uint32_t>(kNoUid));
  EXPECT_EQ(ReservedFor("u1001"), std::nullopt);
  EXPECT_EQ(ReservedFor("user.x"), std::nullopt);
  EXPECT_EQ(ReservedFor("llama"), std::nullopt);
  Catalog c(0, &segments_.dir());
  EXPECT_EQ(c.BeginLoad("u1001.mine", false, 1, kBob).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(c.BeginLoad("u01001.mine", false, 1, kAlice).status().code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(c.Loading().empty());
  EXPECT_TRUE(Load(c, "u1001.mine", 1, kAlice).ok());
  EXPECT_TRUE(Load(c, "u1002.theirs", 1, kAdmin).ok());
}

TEST_F(OwnershipTest, ABudgetEvictionForAUserTakesOnlyItsOwnAndSaysWhat) {
  Catalog c(100, &segments_.dir());
  ASSERT_TRUE(Load(c, "admin-a", 40, kAdmin).ok());
  ASSERT_TRUE(Load(c, "alice-a", 20, kAlice).ok());
  ASSERT_TRUE(Load(c, "bob-a", 20, kBob).ok());
  // 80 used; alice needs 45: only her own 20 may go, which is not enough: nothing goes.
  auto refused = c.BeginLoad("alice-b", false, 45, kAlice);
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("uid 1001"), std::string::npos) << refused.status().ToString();
  EXPECT_EQ(c.List().size(), 3u);
  // 30 fits after evicting her own 20 (and only that).
  std::vector<std::string> evicted;
  ASSERT_TRUE(Load(c, "alice-b", 30, kAlice, false, &evicted).ok());
  EXPECT_EQ(evicted, std::vector<std::string>{"alice-a"});
  EXPECT_TRUE(c.Get("admin-a").ok());
  EXPECT_TRUE(c.Get("bob-a").ok());
  // An admin's load may evict anyone's.
  evicted.clear();
  ASSERT_TRUE(Load(c, "admin-b", 60, kAdmin, false, &evicted).ok());
  EXPECT_EQ(evicted.size(), 2u);
}

TEST_F(OwnershipTest, QuotasBoundAUserNotAnAdmin) {
  Catalog c(0, &segments_.dir(), nullptr, Quotas{/*shm_bytes=*/50, /*segments=*/2, /*writes=*/0});
  ASSERT_TRUE(Load(c, "a1", 20, kAlice).ok());
  ASSERT_TRUE(Load(c, "a2", 20, kAlice).ok());
  EXPECT_EQ(c.UsageOf(1001).segments, 2u);
  EXPECT_EQ(c.UsageOf(1001).shm_bytes, 40u);
  // A third generation evicts her LRU one (a1), reported; bob is untouched by her limit.
  ASSERT_TRUE(Load(c, "b1", 20, kBob).ok());
  std::vector<std::string> evicted;
  ASSERT_TRUE(Load(c, "a3", 20, kAlice, false, &evicted).ok());
  EXPECT_EQ(evicted, std::vector<std::string>{"a1"});
  // Attached ones cannot be evicted: then the limit refuses, naming it.
  ASSERT_TRUE(c.Attach("a2").ok());
  ASSERT_TRUE(c.Attach("a3").ok());
  auto refused = c.BeginLoad("a4", false, 1, kAlice);
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("max-segments-per-uid"), std::string::npos) << refused.status().ToString();
  auto too_big = c.BeginLoad("big", false, 60, kBob);
  EXPECT_NE(too_big.status().message().find("max-shm-bytes-per-uid"), std::string::npos) << too_big.status().ToString();
  // Replacing her own needs no new generation slot.
  ASSERT_TRUE(Load(c, "a3", 10, kAlice, true).ok());
  // Admins are exempt.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Load(c, "adm" + std::to_string(i), 100, kAdmin).ok());
}

TEST(OpTableTest, EveryOpTheProtocolKnowsIsInTheTableAndNothingElse) {
  const std::vector<OpPolicy> table = RequestHandler::Operations();
  std::set<std::string> in_table;
  for (const OpPolicy& row : table) {
    EXPECT_TRUE(in_table.insert(row.op).second) << "'" << row.op << "' is in the table twice";
    EXPECT_FALSE(row.request.empty()) << row.op;
  }
  const std::vector<std::string> known = protocol::KnownOps();
  EXPECT_EQ(in_table, std::set<std::string>(known.begin(), known.end()));
  auto role = [&](const std::string& op) {
    for (const OpPolicy& row : table) {
      if (row.op == op) return row.role;
    }
    return Role::kNone;
  };
  // What changes the catalog or reads files is never a reader's.
  for (const char* op : {"load", "ensure", "verify"}) EXPECT_EQ(role(op), Role::kAdmin) << op;
  for (const char* op : {"write", "write_chunk", "write_seal", "evict"}) EXPECT_EQ(role(op), Role::kWriter) << op;
  for (const char* op : {"status", "list", "info", "attach", "metrics", "rendezvous", "cancel"}) {
    EXPECT_EQ(role(op), Role::kReader) << op;
  }
}

}  // namespace
}  // namespace ckpt::daemon

// The collective load's plan (src/plan/collective_plan.h): every rank computes its own
// part from the same descriptors; the parts must fit together.
#include "plan/collective_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <tuple>

namespace ckpt::collective {
namespace {

RankDescriptor Rank(std::vector<OutputDescriptor> outputs, bool peer = true) {
  RankDescriptor d;
  d.peer_access = peer;
  d.outputs = std::move(outputs);
  return d;
}

std::vector<ExchangePlan> PlanAll(const std::vector<RankDescriptor>& ranks, Mode mode = Mode::kCollective,
                                  uint64_t min_saved = 0) {
  std::vector<ExchangePlan> plans;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    auto p = PlanExchange(ranks, r, mode, min_saved);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    plans.push_back(*p);
  }
  return plans;
}

// Checks what must hold for any plan: outputs don't overlap, each output's bytes arrive
// exactly once (from host or one receive), every send matches a receive of the same size,
// and each receive's range on the receiver holds the same keys at the same relative
// offsets as the sender's range.
void CheckConsistent(const std::vector<RankDescriptor>& ranks, const std::vector<ExchangePlan>& plans) {
  const int n = static_cast<int>(ranks.size());
  // key at each offset, per rank
  std::vector<std::map<uint64_t, uint64_t>> at(n);
  for (int r = 0; r < n; ++r) {
    const auto& outs = ranks[r].outputs;
    ASSERT_EQ(plans[r].offsets.size(), outs.size());
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    for (size_t i = 0; i < outs.size(); ++i) {
      EXPECT_EQ(plans[r].offsets[i] % kOutputAlignment, 0u);
      EXPECT_LE(plans[r].offsets[i] + outs[i].bytes, plans[r].allocation_bytes);
      spans.push_back({plans[r].offsets[i], plans[r].offsets[i] + outs[i].bytes});
      at[r][plans[r].offsets[i]] = outs[i].key;
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first) << "rank " << r;
  }
  // The k-th send from A to B pairs with the k-th receive at B from A (NCCL matches
  // point-to-point operations between a pair in the order they are posted).
  auto between = [&](int from, int to, bool send) {
    std::vector<const Transfer*> out;
    for (const Transfer& t : plans[send ? from : to].transfers)
      if (t.send == send && t.peer == (send ? to : from)) out.push_back(&t);
    return out;
  };
  // Every output reaches its rank exactly once, with the same key layout as the sender's.
  for (int r = 0; r < n; ++r) {
    std::map<uint64_t, int> arrivals;  // offset -> count
    for (size_t i : plans[r].from_host) arrivals[plans[r].offsets[i]]++;
    for (int from = 0; from < n; ++from) {
      auto sends = between(from, r, true), recvs = between(from, r, false);
      ASSERT_EQ(sends.size(), recvs.size()) << from << " -> " << r;
      for (size_t k = 0; k < sends.size(); ++k) EXPECT_EQ(sends[k]->bytes, recvs[k]->bytes) << from << " -> " << r;
    }
    for (const Transfer& t : plans[r].transfers) {
      if (t.send) continue;
      const ExchangePlan& sender = plans[t.peer];
      auto recvs = between(t.peer, r, false), sends = between(t.peer, r, true);
      const size_t k = std::find(recvs.begin(), recvs.end(), &t) - recvs.begin();
      ASSERT_LT(k, sends.size());
      const Transfer* match = sends[k];
      for (auto it = at[r].lower_bound(t.offset); it != at[r].end() && it->first < t.offset + t.bytes; ++it) {
        arrivals[it->first]++;
        auto there = at[t.peer].find(match->offset + (it->first - t.offset));
        ASSERT_NE(there, at[t.peer].end());
        EXPECT_EQ(there->second, it->second) << "rank " << r << " offset " << it->first;
      }
      // What the sender sends, it has from host memory.
      for (auto it = at[t.peer].lower_bound(match->offset); it != at[t.peer].end() && it->first < match->offset + match->bytes; ++it) {
        bool from_host = false;
        for (size_t i : sender.from_host) from_host |= sender.offsets[i] == it->first;
        EXPECT_TRUE(from_host);
      }
    }
    for (const auto& [offset, key] : at[r]) EXPECT_EQ(arrivals[offset], 1) << "rank " << r << " offset " << offset;
  }
}

TEST(CollectivePlanTest, WholeReplicasAreReadOnceAndBalanced) {
  std::vector<OutputDescriptor> model;
  for (uint64_t k = 1; k <= 40; ++k) model.push_back({k * 7919, 1000 + k * 100});
  std::vector<RankDescriptor> ranks(4, Rank(model));
  auto plans = PlanAll(ranks);
  CheckConsistent(ranks, plans);
  uint64_t total = 0, host = 0, most = 0;
  for (const auto& o : model) total += o.bytes;
  for (const auto& p : plans) {
    EXPECT_TRUE(p.collective);
    host += p.host_bytes;
    most = std::max(most, p.host_bytes);
    EXPECT_EQ(p.host_bytes + p.received_bytes >= total, true);
  }
  EXPECT_EQ(host, total);             // each byte crosses PCIe once in the group
  EXPECT_LE(most, total / 4 + 5000);  // and the ranks share the work evenly
}

TEST(CollectivePlanTest, TensorParallelSharesOnlyTheReplicatedOutputs) {
  // 2 ranks: each has its own shard (different keys) plus two replicated outputs.
  std::vector<RankDescriptor> ranks = {Rank({{100, 5000}, {1, 300}, {2, 400}}), Rank({{1, 300}, {200, 5000}, {2, 400}})};
  auto plans = PlanAll(ranks);
  CheckConsistent(ranks, plans);
  EXPECT_EQ(plans[0].host_bytes + plans[1].host_bytes, 5000u + 5000u + 300u + 400u);
}

TEST(CollectivePlanTest, SubsetsOfRanksShare) {
  // TP=2 x DP=2: ranks 0 and 2 hold the same shard, 1 and 3 the other; all hold key 9.
  std::vector<RankDescriptor> ranks = {Rank({{10, 800}, {9, 100}}), Rank({{11, 800}, {9, 100}}),
                                       Rank({{10, 800}, {9, 100}}), Rank({{11, 800}, {9, 100}})};
  auto plans = PlanAll(ranks);
  CheckConsistent(ranks, plans);
  uint64_t host = 0;
  for (const auto& p : plans) host += p.host_bytes;
  EXPECT_EQ(host, 800u + 800u + 100u);
}

TEST(CollectivePlanTest, AutoFallsBackWhereSharingDoesNotPay) {
  std::vector<RankDescriptor> ranks(2, Rank({{1, 1000}, {2, 1000}}));
  auto small = PlanAll(ranks, Mode::kAuto, /*min_saved=*/1 << 20);
  for (const auto& p : small) {
    EXPECT_FALSE(p.collective);
    EXPECT_NE(p.reason.find("save only"), std::string::npos) << p.reason;
    EXPECT_TRUE(p.transfers.empty());
    EXPECT_EQ(p.host_bytes, 2000u);
  }
  ranks[1].peer_access = false;
  auto no_peer = PlanAll(ranks, Mode::kAuto, 0);
  EXPECT_FALSE(no_peer[0].collective);
  EXPECT_NE(no_peer[0].reason.find("peer access"), std::string::npos);
  auto forced = PlanAll(ranks, Mode::kCollective, 1 << 20);
  EXPECT_TRUE(forced[0].collective);
  auto independent = PlanAll({Rank({{1, 1000}}), Rank({{1, 1000}})}, Mode::kIndependent);
  EXPECT_FALSE(independent[0].collective);
  auto nothing_shared = PlanAll({Rank({{1, 1000}}), Rank({{2, 1000}})}, Mode::kCollective);
  EXPECT_FALSE(nothing_shared[1].collective);
  CheckConsistent({Rank({{1, 1000}}), Rank({{2, 1000}})}, nothing_shared);
}

TEST(CollectivePlanTest, RandomGroupsGiveConsistentPlans) {
  std::mt19937 rng(3);
  for (int round = 0; round < 300; ++round) {
    const int n = 2 + rng() % 6;
    std::vector<OutputDescriptor> pool;
    for (int k = 0; k < 12; ++k) pool.push_back({1000 + static_cast<uint64_t>(k), 1 + rng() % 5000});
    pool.push_back({5000, 777});  // two outputs of equal size, to pair up wrongly if order slipped
    pool.push_back({5001, 777});
    std::vector<RankDescriptor> ranks;
    for (int r = 0; r < n; ++r) {
      std::vector<OutputDescriptor> mine;
      for (const auto& o : pool)
        if (rng() % 3) mine.push_back(o);
      std::shuffle(mine.begin(), mine.end(), rng);
      ranks.push_back(Rank(mine));
    }
    auto plans = PlanAll(ranks);
    CheckConsistent(ranks, plans);
    if (::testing::Test::HasFailure()) break;
  }
}

TEST(CollectivePlanTest, BadDescriptorsAreRefused) {
  auto twice = PlanExchange({Rank({{1, 10}, {1, 10}}), Rank({{1, 10}})}, 0, Mode::kCollective, 0);
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument);
  auto disagree = PlanExchange({Rank({{1, 10}}), Rank({{1, 11}})}, 1, Mode::kCollective, 0);
  EXPECT_EQ(disagree.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(disagree.status().message().find("disagree"), std::string::npos);
  EXPECT_FALSE(PlanExchange({Rank({})}, 1, Mode::kAuto, 0).ok());
}

TEST(CollectivePlanTest, DescriptorsRoundTripAndTruncationsAreRefused) {
  RankDescriptor d = Rank({{0xfeedface12345678ull, 123}, {7, 0}}, false);
  d.ok = false;
  d.mode = 2;
  d.min_saved_bytes = 12345;
  auto back = DecodeDescriptor(EncodeDescriptor(d));
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->ok);
  EXPECT_FALSE(back->peer_access);
  EXPECT_EQ(back->mode, 2u);
  EXPECT_EQ(back->min_saved_bytes, 12345u);
  ASSERT_EQ(back->outputs.size(), 2u);
  EXPECT_EQ(back->outputs[0].key, 0xfeedface12345678ull);
  EXPECT_EQ(back->outputs[0].bytes, 123u);
  std::string wire = EncodeDescriptor(d);
  for (size_t n = 0; n < wire.size(); ++n) EXPECT_FALSE(DecodeDescriptor(wire.substr(0, n)).ok()) << n;
  EXPECT_FALSE(DecodeDescriptor(wire + "x").ok());
}

}  // namespace
}  // namespace ckpt::collective

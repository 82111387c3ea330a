#include "plan/collective_plan.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>
#include <unordered_set>

namespace ckpt::collective {
namespace {

uint64_t Align(uint64_t n) { return (n + kOutputAlignment - 1) & ~(kOutputAlignment - 1); }

struct Shared {
  uint64_t key = 0;
  uint64_t bytes = 0;
  std::vector<int> holders;  // ascending
  int owner = -1;
};

// Lays output `i` (of `bytes`) out next in the plan's allocation; `from_host`: this rank
// copies it from the shared memory. plan->offsets must have a slot for every output.
void Place(ExchangePlan* plan, size_t i, uint64_t bytes, bool from_host) {
  plan->offsets[i] = plan->allocation_bytes;
  plan->allocation_bytes += Align(bytes);
  if (from_host) {
    plan->from_host.push_back(i);
    plan->host_bytes += bytes;
  }
}

// A plan in which rank `me` copies everything itself.
ExchangePlan Independent(const RankDescriptor& mine, std::string reason) {
  ExchangePlan plan;
  plan.reason = std::move(reason);
  plan.offsets.assign(mine.outputs.size(), 0);
  for (size_t i = 0; i < mine.outputs.size(); ++i) Place(&plan, i, mine.outputs[i].bytes, true);
  return plan;
}

void Put(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t Get(const std::string& s, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

// Every output key of the group with its size and holders; InvalidArgument if a rank lists
// one twice or two ranks disagree on its size. Ordered: the same iteration order on every rank.
Result<std::map<uint64_t, Shared>> CollectHolders(const std::vector<RankDescriptor>& ranks) {
  std::map<uint64_t, Shared> by_key;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    std::unordered_set<uint64_t> seen;
    for (const OutputDescriptor& o : ranks[r].outputs) {
      if (!seen.insert(o.key).second)
        return InvalidArgument("rank " + std::to_string(r) + " lists an output twice (the same name and shard)");
      Shared& s = by_key[o.key];
      if (!s.holders.empty() && s.bytes != o.bytes)
        return InvalidArgument("ranks " + std::to_string(s.holders[0]) + " and " + std::to_string(r) +
                               " disagree on the size of an output they share");
      s.key = o.key;
      s.bytes = o.bytes;
      s.holders.push_back(r);
    }
  }
  return by_key;
}

// The outputs held by more than one rank, the host-to-device bytes sharing them saves, and
// the bytes each rank copies from host memory for its unshared ones.
struct Sharing {
  uint64_t saved = 0;
  std::vector<uint64_t> load;
  std::vector<Shared*> shared;
};
Sharing FindShared(std::map<uint64_t, Shared>* by_key, int n) {
  Sharing g;
  g.load.assign(n, 0);
  for (auto& [key, s] : *by_key) {
    if (s.holders.size() > 1) {
      g.saved += s.bytes * (s.holders.size() - 1);
      g.shared.push_back(&s);
    } else {
      g.load[s.holders[0]] += s.bytes;
    }
  }
  return g;
}

// Why kAuto copies independently (no peer access, too little saved); empty: share.
std::string ReasonNotToShare(const std::vector<RankDescriptor>& ranks, uint64_t saved, uint64_t min_saved_bytes) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (!ranks[r].peer_access) return "rank " + std::to_string(r) + "'s GPU has no peer access to the others";
  }
  if (saved < min_saved_bytes)
    return "sharing would save only " + std::to_string(saved) + " bytes of host-to-device copies";
  return "";
}

// Owners: largest first, each to the least-loaded holder (lowest rank on ties); then sorts
// `shared` into segments: (holders, owner), keys ascending inside.
void AssignOwners(Sharing* g) {
  std::vector<Shared*>& shared = g->shared;
  std::sort(shared.begin(), shared.end(), [](const Shared* a, const Shared* b) {
    return a->bytes != b->bytes ? a->bytes > b->bytes : a->key < b->key;
  });
  for (Shared* s : shared) {
    int best = s->holders[0];
    for (int h : s->holders)
      if (g->load[h] < g->load[best]) best = h;
    s->owner = best;
    g->load[best] += s->bytes;
  }
  std::sort(shared.begin(), shared.end(), [](const Shared* a, const Shared* b) {
    if (a->holders != b->holders) return a->holders < b->holders;
    if (a->owner != b->owner) return a->owner < b->owner;
    return a->key < b->key;
  });
}

// Lays out the segment shared[b, e) (holders include `me`) and adds its transfers: sent to
// every other holder if `me` owns it, else received from its owner.
void PlaceSegment(ExchangePlan* plan, const std::vector<Shared*>& shared, size_t b, size_t e, int me,
                  const std::unordered_map<uint64_t, size_t>& my_index) {
  const std::vector<int>& holders = shared[b]->holders;
  const int owner = shared[b]->owner;
  const uint64_t begin = plan->allocation_bytes;
  for (size_t k = b; k < e; ++k) Place(plan, my_index.at(shared[k]->key), shared[k]->bytes, owner == me);
  const uint64_t bytes = plan->allocation_bytes - begin;
  if (owner == me) {  // send the segment to every other holder
    for (int h : holders) {
      if (h == me) continue;
      plan->transfers.push_back({h, true, begin, bytes});
      plan->sent_bytes += bytes;
    }
  } else {  // receive it from its owner
    plan->transfers.push_back({owner, false, begin, bytes});
    plan->received_bytes += bytes;
  }
}

// Rank `me`'s collective plan: its unshared outputs first, in its own order, then each
// segment (of g.shared, sorted by AssignOwners) it holds.
ExchangePlan CollectivePlan(const RankDescriptor& mine, int me, const std::map<uint64_t, Shared>& by_key,
                            const Sharing& g) {
  const std::vector<Shared*>& shared = g.shared;
  ExchangePlan plan;
  plan.collective = true;
  plan.reason = "collective: " + std::to_string(shared.size()) + " outputs shared, saving " + std::to_string(g.saved) +
                " bytes of host-to-device copies across the group";
  std::unordered_map<uint64_t, size_t> my_index;
  for (size_t i = 0; i < mine.outputs.size(); ++i) my_index.emplace(mine.outputs[i].key, i);
  plan.offsets.assign(mine.outputs.size(), 0);
  for (size_t i = 0; i < mine.outputs.size(); ++i) {
    if (by_key.at(mine.outputs[i].key).holders.size() == 1) Place(&plan, i, mine.outputs[i].bytes, true);
  }
  for (size_t b = 0; b < shared.size();) {
    size_t e = b;
    while (e < shared.size() && shared[e]->holders == shared[b]->holders && shared[e]->owner == shared[b]->owner) ++e;
    const std::vector<int>& holders = shared[b]->holders;
    if (std::binary_search(holders.begin(), holders.end(), me)) PlaceSegment(&plan, shared, b, e, me, my_index);
    b = e;
  }
  return plan;
}

}  // namespace

// In named steps: collect who holds what, find the shared outputs (else copy independently),
// assign their owners and lay out this rank's plan.
Result<ExchangePlan> PlanExchange(const std::vector<RankDescriptor>& ranks, int me, Mode mode,
                                  uint64_t min_saved_bytes) {
  const int n = static_cast<int>(ranks.size());
  if (me < 0 || me >= n) return InvalidArgument("rank " + std::to_string(me) + " out of range for a group of " + std::to_string(n));
  const RankDescriptor& mine = ranks[me];
  if (mode == Mode::kIndependent) return Independent(mine, "independent copies requested");
  if (n == 1) return Independent(mine, "a group of one rank");
  CKPT_ASSIGN_OR_RETURN(auto by_key, CollectHolders(ranks));
  Sharing g = FindShared(&by_key, n);
  if (g.shared.empty()) return Independent(mine, "no output is needed by more than one rank");
  if (mode == Mode::kAuto) {
    std::string reason = ReasonNotToShare(ranks, g.saved, min_saved_bytes);
    if (!reason.empty()) return Independent(mine, std::move(reason));
  }
  AssignOwners(&g);
  return CollectivePlan(mine, me, by_key, g);
}

std::string EncodeDescriptor(const RankDescriptor& d) {
  std::string s;
  Put(&s, (d.ok ? 1 : 0) | (d.peer_access ? 2 : 0));
  Put(&s, d.mode);
  Put(&s, d.min_saved_bytes);
  Put(&s, d.outputs.size());
  for (const OutputDescriptor& o : d.outputs) {
    Put(&s, o.key);
    Put(&s, o.bytes);
  }
  return s;
}

Result<RankDescriptor> DecodeDescriptor(const std::string& s) {
  constexpr size_t kHead = 32;
  if (s.size() < kHead) return Corrupt("rank descriptor of " + std::to_string(s.size()) + " bytes");
  RankDescriptor d;
  d.ok = (Get(s, 0) & 1) != 0;
  d.peer_access = (Get(s, 0) & 2) != 0;
  d.mode = Get(s, 8);
  d.min_saved_bytes = Get(s, 16);
  const uint64_t count = Get(s, 24);
  if (count != (s.size() - kHead) / 16 || (s.size() - kHead) % 16 != 0)
    return Corrupt("rank descriptor lists " + std::to_string(count) + " outputs in " + std::to_string(s.size()) + " bytes");
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t bytes = Get(s, kHead + 8 + 16 * i);
    if (bytes > (uint64_t{1} << 50)) return Corrupt("rank descriptor: an output of " + std::to_string(bytes) + " bytes");
    d.outputs.push_back({Get(s, kHead + 16 * i), bytes});
  }
  return d;
}

}  // namespace ckpt::collective

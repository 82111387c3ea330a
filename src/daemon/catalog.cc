#include "daemon/catalog.h"

#include <algorithm>
#include <spdlog/spdlog.h>

#include "common/byte_size.h"

namespace ckpt::daemon {

void Catalog::Unlink(const CatalogEntry& e) const {
  if (segments_ == nullptr) return;
  Status st = segments_->Remove(e.shm_name);
  if (!st.ok()) {
    spdlog::error("cannot remove segment of '{}' generation {}: {} (its memory stays in use until it is removed)",
                  e.name, e.generation, st.ToString());
  }
}

namespace {
void RemoveOnePid(std::vector<int32_t>* pids, int32_t pid) {
  auto it = std::find(pids->begin(), pids->end(), pid);
  if (it != pids->end()) pids->erase(it);
}
}  // namespace

uint64_t Catalog::UsedBytesLocked() const {
  uint64_t used = 0;
  for (const auto& [name, e] : entries_) used += e.segment_bytes;
  for (const auto& [key, e] : retired_) used += e.segment_bytes;
  for (const auto& [name, r] : loading_) used += r.bytes;
  return used;
}

uint64_t Catalog::UsedBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return UsedBytesLocked();
}

Usage Catalog::UsageLocked(uint32_t uid) const {
  Usage u;
  for (const auto& [name, e] : entries_) {
    if (e.owner.uid == uid) u.shm_bytes += e.segment_bytes, ++u.segments;
  }
  for (const auto& [key, e] : retired_) {
    if (e.owner.uid == uid) u.shm_bytes += e.segment_bytes, ++u.segments;
  }
  for (const auto& [name, r] : loading_) {
    if (r.owner.uid == uid) u.shm_bytes += r.bytes, ++u.segments;
  }
  return u;
}

Usage Catalog::UsageOf(uint32_t uid) const {
  std::lock_guard<std::mutex> lock(mu_);
  return UsageLocked(uid);
}

EvictionCounts Catalog::evictions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return evictions_;
}

Status Catalog::CheckNameLocked(const std::string& name, bool replace, const Owner& actor) const {
  if (auto it = loading_.find(name); it != loading_.end()) {
    CKPT_RETURN_IF_ERROR(MayAlter(actor, it->second.owner, name, "load or write"));
    return AlreadyExists("checkpoint '" + name + "' is being loaded (by " + Describe(it->second.owner) + ")");
  }
  auto it = entries_.find(name);
  if (it == entries_.end()) return MayClaim(actor, name);
  if (!replace) {
    return AlreadyExists("checkpoint '" + name + "' is already loaded (owned by " + Describe(it->second.owner) +
                         "; use --replace for a new generation)");
  }
  return MayAlter(actor, it->second.owner, name, "replace");
}

Status Catalog::CheckName(const std::string& name, bool replace, const Owner& actor) const {
  std::lock_guard<std::mutex> lock(mu_);
  return CheckNameLocked(name, replace, actor);
}

Status Catalog::ChooseVictimsLocked(const std::string& name, uint64_t bytes, const Owner& actor,
                                    std::vector<std::string>* victims) const {
  const uint64_t used = UsedBytesLocked();
  const Usage mine = actor.admin ? Usage{} : UsageLocked(actor.uid);
  const bool replacing_own = entries_.count(name) != 0;  // its old generation goes at publish
  const uint64_t new_segments = replacing_own ? 0 : 1;
  const uint64_t byte_quota = actor.admin ? 0 : quotas_.shm_bytes;
  const uint64_t segment_quota = actor.admin ? 0 : quotas_.segments;
  // Candidates: unattached checkpoints the actor may evict (all for an admin, its own
  // otherwise), other than the one being replaced, LRU first. Every one the actor may
  // evict is its own unless it is an admin, so what they free counts for its quotas too.
  std::vector<const CatalogEntry*> candidates;
  for (const auto& [n, e] : entries_) {
    if (e.attached == 0 && n != name && MayAlter(actor, e.owner, n, "evict").ok()) candidates.push_back(&e);
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const CatalogEntry* a, const CatalogEntry* b) { return a->last_used < b->last_used; });
  uint64_t freed = 0, taken = 0;
  auto over_budget = [&] { return budget_bytes_ > 0 && used - freed + bytes > budget_bytes_; };
  auto over_bytes = [&] { return byte_quota > 0 && mine.shm_bytes - freed + bytes > byte_quota; };
  auto over_segments = [&] { return segment_quota > 0 && mine.segments - taken + new_segments > segment_quota; };
  while (taken < candidates.size() && (over_budget() || over_bytes() || over_segments())) {
    freed += candidates[taken++]->segment_bytes;
  }
  const std::string evictable = actor.admin ? "unattached checkpoints" : "unattached checkpoints of " + Describe(actor);
  if (over_budget()) {
    return ResourceExhausted("loading '" + name + "' needs " + BytesText(bytes) + "; the memory budget is " +
                             BytesText(budget_bytes_) + ", " + BytesText(used) + " in use, and only " +
                             BytesText(freed) + " of it could be freed by evicting " + evictable +
                             (actor.admin ? "" : " (a user evicts only its own)") +
                             " (attached ones stay; ckptctl list shows them: evict some, or raise ckptd --memory-budget)");
  }
  if (over_bytes()) {
    return ResourceExhausted("loading '" + name + "' needs " + BytesText(bytes) + "; " + Describe(actor) +
                             " holds " + BytesText(mine.shm_bytes) + " of shared memory, its limit is " +
                             BytesText(byte_quota) + " (max-shm-bytes-per-uid), and only " +
                             BytesText(freed) + " could be freed by evicting " + evictable);
  }
  if (over_segments()) {
    return ResourceExhausted("'" + name + "' would be generation " + std::to_string(mine.segments + 1) + " held by " +
                             Describe(actor) + "; its limit is " + std::to_string(segment_quota) +
                             " (max-segments-per-uid) and no more " + evictable + " can be evicted");
  }
  for (size_t i = 0; i < taken; ++i) victims->push_back(candidates[i]->name);
  return Status::Ok();
}

Result<uint64_t> Catalog::BeginLoad(const std::string& name, bool replace, uint64_t bytes, const Owner& actor,
                                    std::vector<std::string>* evicted) {
  std::lock_guard<std::mutex> lock(mu_);
  CKPT_RETURN_IF_ERROR(CheckNameLocked(name, replace, actor));
  std::vector<std::string> victims;
  CKPT_RETURN_IF_ERROR(ChooseVictimsLocked(name, bytes, actor, &victims));
  // The number is durable before anyone sees it (or anything is evicted for it).
  const uint64_t generation = next_generation_;
  if (generations_) {
    Status persisted = generations_->Persist(generation);
    if (!persisted.ok()) {
      spdlog::error("cannot record generation {} for '{}': {}", generation, name, persisted.ToString());
      return persisted.WithContext("recording the generation number of '" + name + "'");
    }
  }
  ++next_generation_;
  for (const std::string& v : victims) {
    auto it = entries_.find(v);
    spdlog::info("evicting '{}' generation {} ({} bytes, owned by {}, least recently used) to make room for '{}' "
                 "of {}", v, it->second.generation, it->second.segment_bytes, Describe(it->second.owner), name,
                 Describe(actor));
    Unlink(it->second);
    entries_.erase(it);
    ++evictions_.for_budget;
    if (evicted) evicted->push_back(v);
  }
  loading_[name] = Reservation{bytes, actor};
  return generation;
}

void Catalog::AbortLoad(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  loading_.erase(name);
}

void Catalog::RetireLocked(CatalogEntry entry, bool unlink_now) {
  if (unlink_now || entry.attached == 0) {
    if (!entry.unlinked) Unlink(entry);
    entry.unlinked = true;
  }
  if (entry.attached == 0) return;  // freed once the last mapping goes
  auto key = std::make_pair(entry.name, entry.generation);
  retired_[key] = std::move(entry);
}

void Catalog::Publish(CatalogEntry entry) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto r = loading_.find(entry.name); r != loading_.end()) {
    entry.owner = r->second.owner;  // who reserved it: the one source of the owner
    loading_.erase(r);
  }
  entry.last_used = ++clock_;
  std::string name = entry.name;
  auto it = entries_.find(name);
  if (it != entries_.end()) {
    CatalogEntry old = std::move(it->second);
    entries_.erase(it);
    ++evictions_.replaced;
    spdlog::info("'{}' generation {} replaces generation {} ({} attached)", name, entry.generation,
                 old.generation, old.attached);
    RetireLocked(std::move(old), /*unlink_now=*/false);
  }
  entries_[name] = std::move(entry);
}

Status Catalog::Adopt(CatalogEntry entry) {
  std::lock_guard<std::mutex> lock(mu_);
  next_generation_ = std::max(next_generation_, entry.generation + 1);
  if (entries_.count(entry.name)) return AlreadyExists("checkpoint '" + entry.name + "' already adopted");
  entry.last_used = ++clock_;
  std::string name = entry.name;
  entries_[name] = std::move(entry);
  return Status::Ok();
}

Result<CatalogEntry> Catalog::Attach(const std::string& name, int32_t pid, uint64_t generation,
                                     const std::string& segment_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    if (loading_.count(name)) return NotFound("checkpoint '" + name + "' is still loading");
    return NotFound("no checkpoint named '" + name + "'");
  }
  if (generation != 0 && it->second.generation != generation) {
    return NotFound("checkpoint '" + name + "' is at generation " + std::to_string(it->second.generation) +
                    ", not " + std::to_string(generation));
  }
  if (!segment_id.empty() && it->second.segment_id != segment_id) {
    return NotFound("checkpoint '" + name + "' generation " + std::to_string(it->second.generation) +
                    " is segment " + it->second.segment_id + ", not " + segment_id);
  }
  ++it->second.attached;
  it->second.attached_pids.push_back(pid);
  it->second.last_used = ++clock_;
  return it->second;
}

void Catalog::Detach(const std::string& name, uint64_t generation, int32_t pid) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it != entries_.end() && it->second.generation == generation) {
    if (it->second.attached > 0) --it->second.attached;
    RemoveOnePid(&it->second.attached_pids, pid);
    it->second.last_used = ++clock_;
    return;
  }
  auto r = retired_.find(std::make_pair(name, generation));
  if (r == retired_.end()) return;
  if (r->second.attached > 0) --r->second.attached;
  RemoveOnePid(&r->second.attached_pids, pid);
  if (r->second.attached == 0) {
    if (!r->second.unlinked) Unlink(r->second);
    spdlog::info("freed retired '{}' generation {} after its last detach", name, generation);
    retired_.erase(r);
  }
}

Result<CatalogEntry> Catalog::Evict(const std::string& name, bool force, const Owner& actor) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    if (auto r = loading_.find(name); r != loading_.end()) {
      CKPT_RETURN_IF_ERROR(MayAlter(actor, r->second.owner, name, "evict"));
      return FailedPrecondition("checkpoint '" + name + "' is still loading");
    }
    return NotFound("no checkpoint named '" + name + "'");
  }
  CKPT_RETURN_IF_ERROR(MayAlter(actor, it->second.owner, name, "evict"));
  if (it->second.attached > 0 && !force) {
    return FailedPrecondition("checkpoint '" + name + "' is attached by " +
                              std::to_string(it->second.attached) +
                              " client(s); detach them, evict with --wait, or with --force");
  }
  CatalogEntry entry = it->second;
  entries_.erase(it);
  ++evictions_.by_request;
  RetireLocked(entry, /*unlink_now=*/true);
  return entry;
}

std::vector<CatalogEntry> Catalog::TakeAll() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CatalogEntry> all;
  for (auto& [name, entry] : entries_) all.push_back(std::move(entry));
  for (auto& [key, entry] : retired_) {
    if (!entry.unlinked) all.push_back(std::move(entry));
  }
  entries_.clear();
  retired_.clear();
  return all;
}

Result<CatalogEntry> Catalog::Get(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return NotFound("no checkpoint named '" + name + "'");
  return it->second;
}

std::vector<CatalogEntry> Catalog::List() const {
  std::vector<CatalogEntry> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, entry] : entries_) all.push_back(entry);
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return all;
}

std::vector<CatalogEntry> Catalog::Retired() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CatalogEntry> all;
  for (const auto& [key, entry] : retired_) all.push_back(entry);
  return all;
}

std::vector<std::string> Catalog::Loading() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (const auto& [name, r] : loading_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace ckpt::daemon

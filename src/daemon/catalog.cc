#include "daemon/catalog.h"

#include <algorithm>

namespace ckpt::daemon {

Result<uint64_t> Catalog::BeginLoad(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_.count(name)) return AlreadyExists("checkpoint '" + name + "' is already loaded");
  if (!loading_.insert(name).second) return AlreadyExists("checkpoint '" + name + "' is being loaded");
  return next_generation_++;
}

void Catalog::AbortLoad(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  loading_.erase(name);
}

void Catalog::Publish(CatalogEntry entry) {
  std::lock_guard<std::mutex> lock(mu_);
  loading_.erase(entry.name);
  std::string name = entry.name;
  entries_[name] = std::move(entry);
}

Status Catalog::Adopt(CatalogEntry entry) {
  std::lock_guard<std::mutex> lock(mu_);
  next_generation_ = std::max(next_generation_, entry.generation + 1);
  if (entries_.count(entry.name)) return AlreadyExists("checkpoint '" + entry.name + "' already adopted");
  std::string name = entry.name;
  entries_[name] = std::move(entry);
  return Status::Ok();
}

Result<CatalogEntry> Catalog::Attach(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    if (loading_.count(name)) return NotFound("checkpoint '" + name + "' is still loading");
    return NotFound("no checkpoint named '" + name + "'");
  }
  ++it->second.attached;
  return it->second;
}

void Catalog::Detach(const std::string& name, uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it != entries_.end() && it->second.generation == generation && it->second.attached > 0) {
    --it->second.attached;
  }
}

Result<CatalogEntry> Catalog::Evict(const std::string& name, bool force) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    if (loading_.count(name)) return FailedPrecondition("checkpoint '" + name + "' is still loading");
    return NotFound("no checkpoint named '" + name + "'");
  }
  if (it->second.attached > 0 && !force) {
    return FailedPrecondition("checkpoint '" + name + "' is attached by " +
                              std::to_string(it->second.attached) +
                              " client(s); detach them or evict with --force");
  }
  CatalogEntry entry = std::move(it->second);
  entries_.erase(it);
  return entry;
}

std::vector<CatalogEntry> Catalog::TakeAll() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CatalogEntry> all;
  for (auto& [name, entry] : entries_) all.push_back(std::move(entry));
  entries_.clear();
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

std::vector<std::string> Catalog::Loading() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names(loading_.begin(), loading_.end());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace ckpt::daemon

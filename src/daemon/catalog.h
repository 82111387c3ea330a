// Catalog: the daemon's table of checkpoints, thread-safe.
//
// A name is first reserved (BeginLoad) so concurrent loads of one name are refused, then
// published (Publish) only once its segment is complete; clients can attach only to
// published entries. Attachments are counted per generation.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ckpt/status.h"
#include "ckpt/tensor.h"

namespace ckpt::daemon {

struct CatalogEntry {
  std::string name;
  uint64_t generation = 0;
  std::string shm_name;
  std::string source_path;
  std::string format;
  uint64_t segment_bytes = 0;
  uint64_t data_bytes = 0;
  double load_seconds = 0;
  int64_t loaded_unix_s = 0;
  uint32_t attached = 0;  // live attachments of this generation
  std::shared_ptr<const std::vector<TensorInfo>> tensors;
};

class Catalog {
 public:
  // Returns the generation to use for a new segment of `name`.
  // AlreadyExists if `name` is loaded or being loaded.
  Result<uint64_t> BeginLoad(const std::string& name);
  // Ends a reservation without publishing.
  void AbortLoad(const std::string& name);
  // Publishes a complete segment under entry.name, ending its reservation.
  void Publish(CatalogEntry entry);
  // Adds an entry found at start-up. AlreadyExists if the name is present (the caller
  // keeps the newer generation); raises the next generation above it.
  Status Adopt(CatalogEntry entry);

  // Counts one attachment and returns the entry. NotFound if not published.
  Result<CatalogEntry> Attach(const std::string& name);
  // Ends an attachment made by Attach; a no-op if that generation was evicted since.
  void Detach(const std::string& name, uint64_t generation);

  // Removes `name` and returns its entry so the caller can unlink the segment.
  // NotFound if unknown; FailedPrecondition if attached and !force, or still loading.
  Result<CatalogEntry> Evict(const std::string& name, bool force);
  // Removes and returns every entry (shutdown with clean-up).
  std::vector<CatalogEntry> TakeAll();

  Result<CatalogEntry> Get(const std::string& name) const;
  std::vector<CatalogEntry> List() const;  // sorted by name
  std::vector<std::string> Loading() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, CatalogEntry> entries_;
  std::unordered_set<std::string> loading_;
  uint64_t next_generation_ = 1;
};

}  // namespace ckpt::daemon

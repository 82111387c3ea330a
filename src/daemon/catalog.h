// Catalog: the daemon's table of checkpoints, thread-safe.
//
// A name is first reserved (BeginLoad) so concurrent loads of one name are refused, then
// published (Publish) only once its segment is complete; clients can attach only to
// published entries. Attachments are counted per generation.
//
// Memory: every published, retired or reserved segment counts against the budget.
// BeginLoad makes room by evicting the least-recently-used unattached checkpoints, or
// fails (ResourceExhausted) without evicting anything when even that would not suffice.
//
// Generations: numbers come from BeginLoad, increasing, each persisted in the
// GenerationStore (if any) before it is handed out, so none is ever reused, across
// restarts too. Publishing a name that already exists (a replace) makes the new
// generation current at once; the old one is unlinked now if nobody is attached to it,
// else "retired": it stays mapped by its clients and is unlinked when the last detaches.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ckpt/status.h"
#include "ckpt/tensor.h"
#include "common/unique_fd.h"
#include "daemon/generation_store.h"
#include "shm/segment_directory.h"

namespace ckpt::daemon {

struct CatalogEntry {
  std::string name;
  uint64_t generation = 0;
  std::string shm_name;    // the segment's file name in the daemon's segment directory
  std::string segment_id;  // the segment's random id, 32 hex characters (in its header too)
  std::string source_path;
  std::string source_fingerprint;  // SourceFingerprint of the plan it was loaded from; "" if adopted
  std::string format;
  uint64_t segment_bytes = 0;
  uint64_t data_bytes = 0;
  uint64_t page_bytes = 0;   // page size the segment is sized for (4096, 2 MiB)
  int64_t huge_bytes = -1;   // bytes the loader saw on huge (PMD) entries; -1 unknown (adopted)
  double load_seconds = 0;
  int64_t loaded_unix_s = 0;
  uint32_t attached = 0;             // live attachments of this generation
  std::vector<int32_t> attached_pids;  // peer pid of each attachment (0 if unknown)
  uint64_t last_used = 0;            // catalog clock: publish, attach or detach
  bool unlinked = false;             // retired entries only: object already removed
  std::shared_ptr<const UniqueFd> fd;  // O_RDONLY descriptor passed to clients
  std::shared_ptr<const std::vector<TensorInfo>> tensors;
};

struct EvictionCounts {
  uint64_t by_request = 0;  // evict requests
  uint64_t for_budget = 0;  // LRU evictions to make room
  uint64_t replaced = 0;    // generations superseded by a replace
};

class Catalog {
 public:
  // `budget_bytes` 0 means no budget. Segments are removed from `segments` (null: the
  // catalog removes no files). Generations start above `generations->last()` and each
  // is persisted there before it is handed out (null: start at 1, nothing persisted).
  // Neither is owned; both must outlive the catalog.
  explicit Catalog(uint64_t budget_bytes = 0, const shm::SegmentDirectory* segments = nullptr,
                   GenerationStore* generations = nullptr)
      : budget_bytes_(budget_bytes), segments_(segments), generations_(generations),
        next_generation_(generations ? generations->last() + 1 : 1) {}

  // Reserves `name` for a load of about `bytes` and returns the generation to use.
  // AlreadyExists if `name` is being loaded, or is loaded and !replace.
  // ResourceExhausted if `bytes` cannot fit in the budget even after evicting every
  // unattached checkpoint (then nothing is evicted); otherwise the LRU unattached ones
  // are evicted (unlinked) as needed and their names appended to `evicted`.
  // IoError if the generation cannot be persisted (then nothing is reserved or evicted).
  Result<uint64_t> BeginLoad(const std::string& name, bool replace, uint64_t bytes,
                             std::vector<std::string>* evicted = nullptr);
  // Ends a reservation without publishing.
  void AbortLoad(const std::string& name);
  // Publishes a complete segment under entry.name, ending its reservation. A generation
  // it replaces is unlinked now or, if attached, retired until its last detach.
  void Publish(CatalogEntry entry);
  // Adds an entry found at start-up. AlreadyExists if the name is present (the caller
  // keeps the newer generation); raises the next generation above it.
  Status Adopt(CatalogEntry entry);

  // Counts one attachment by process `pid` and returns the entry. NotFound if not
  // published, if `generation` (when not 0) is not the current generation, or if
  // `segment_id` (when not empty) is not the current generation's id.
  Result<CatalogEntry> Attach(const std::string& name, int32_t pid = 0, uint64_t generation = 0,
                              const std::string& segment_id = "");
  // Ends an attachment made by Attach. Works for the current generation and for retired
  // ones (the last detach unlinks a retired generation); a no-op otherwise.
  void Detach(const std::string& name, uint64_t generation, int32_t pid = 0);

  // Removes `name` and unlinks its segment; returns the entry as it was.
  // NotFound if unknown; FailedPrecondition if attached and !force, or still loading.
  // With force, attached clients keep their mapping; its memory counts until they detach.
  Result<CatalogEntry> Evict(const std::string& name, bool force);
  // Removes and returns every entry (shutdown with clean-up); the caller unlinks them.
  std::vector<CatalogEntry> TakeAll();

  Result<CatalogEntry> Get(const std::string& name) const;
  std::vector<CatalogEntry> List() const;     // sorted by name
  std::vector<CatalogEntry> Retired() const;  // superseded or force-evicted, still attached
  std::vector<std::string> Loading() const;
  uint64_t budget_bytes() const { return budget_bytes_; }
  // Bytes of published, retired and reserved segments.
  uint64_t UsedBytes() const;
  EvictionCounts evictions() const;

 private:
  uint64_t UsedBytesLocked() const;
  // Moves `entry` out of the table: unlinked now, or kept as retired while attached.
  void RetireLocked(CatalogEntry entry, bool unlink_now);
  // Removes the entry's segment file; a failure is logged as an error (the entry goes
  // from the table either way: its memory is then only freed by an operator).
  void Unlink(const CatalogEntry& entry) const;

  const uint64_t budget_bytes_;
  const shm::SegmentDirectory* const segments_;
  GenerationStore* const generations_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, CatalogEntry> entries_;
  std::unordered_map<std::string, uint64_t> loading_;  // name -> reserved bytes
  std::map<std::pair<std::string, uint64_t>, CatalogEntry> retired_;
  uint64_t next_generation_;
  uint64_t clock_ = 0;
  EvictionCounts evictions_;
};

}  // namespace ckpt::daemon

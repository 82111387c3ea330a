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
// Ownership (daemon/ownership.h): every entry and reservation has an owner. Replacing,
// evicting and budget evictions on someone's behalf take only what that caller may alter
// (MayAlter: its own, or anything for an admin), and a caller without the admin role
// stays within its Quotas (bytes and generations per uid). Every check is made before
// anything is evicted or reserved: a refused call changes nothing.
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
#include "daemon/ownership.h"
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
  Owner owner;                       // who loaded or published this generation (set by Publish)
  // The segment file's identity, checked whenever the daemon opens it again by name (it
  // keeps no descriptor per segment: attach and verify open it when they need it).
  uint64_t dev = 0, ino = 0;
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
                   GenerationStore* generations = nullptr, Quotas quotas = {})
      : budget_bytes_(budget_bytes), quotas_(quotas), segments_(segments), generations_(generations),
        next_generation_(generations ? generations->last() + 1 : 1) {}

  // Whether `actor` may reserve `name` now (what BeginLoad checks first, without the
  // budget): PermissionDenied naming the owner when the name is held (published or being
  // loaded) by a uid the actor may not alter, or is reserved for another uid (MayClaim);
  // AlreadyExists if it is being loaded (by the actor), or is loaded and !replace.
  Status CheckName(const std::string& name, bool replace, const Owner& actor) const;
  // Reserves `name` for `actor`'s load of about `bytes` and returns the generation to use.
  // First CheckName's errors. Then ResourceExhausted, naming the limit, if `bytes` cannot
  // fit in the budget, or (actor not an admin) in the actor's quotas, even after evicting
  // every unattached checkpoint the actor may evict (then nothing is evicted); otherwise
  // the LRU ones of those are evicted (unlinked) as needed and their names appended to
  // `evicted`. IoError if the generation cannot be persisted (then nothing is reserved or
  // evicted).
  Result<uint64_t> BeginLoad(const std::string& name, bool replace, uint64_t bytes, const Owner& actor,
                             std::vector<std::string>* evicted = nullptr);
  // Ends a reservation without publishing.
  void AbortLoad(const std::string& name);
  // Publishes a complete segment under entry.name, ending its reservation; the entry's
  // owner is the reservation's. A generation it replaces is unlinked now or, if attached,
  // retired until its last detach.
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
  // NotFound if unknown; PermissionDenied (naming the owner) if `actor` may not alter it;
  // FailedPrecondition if attached and !force, or still loading. With force, attached
  // clients keep their mapping; its memory counts until they detach.
  Result<CatalogEntry> Evict(const std::string& name, bool force, const Owner& actor);
  // Removes and returns every entry (shutdown with clean-up); the caller unlinks them.
  std::vector<CatalogEntry> TakeAll();

  Result<CatalogEntry> Get(const std::string& name) const;
  std::vector<CatalogEntry> List() const;     // sorted by name
  std::vector<CatalogEntry> Retired() const;  // superseded or force-evicted, still attached
  std::vector<std::string> Loading() const;
  uint64_t budget_bytes() const { return budget_bytes_; }
  const Quotas& quotas() const { return quotas_; }
  // What `uid` holds now (published, retired and reserved generations it owns).
  Usage UsageOf(uint32_t uid) const;
  // Bytes of published, retired and reserved segments.
  uint64_t UsedBytes() const;
  EvictionCounts evictions() const;

 private:
  struct Reservation {
    uint64_t bytes = 0;
    Owner owner;
  };
  uint64_t UsedBytesLocked() const;
  Usage UsageLocked(uint32_t uid) const;
  Status CheckNameLocked(const std::string& name, bool replace, const Owner& actor) const;
  // The LRU unattached checkpoints `actor` may evict to fit `bytes` into the budget and
  // its quotas (appended to *victims), or ResourceExhausted naming the limit.
  Status ChooseVictimsLocked(const std::string& name, uint64_t bytes, const Owner& actor,
                             std::vector<std::string>* victims) const;
  // Moves `entry` out of the table: unlinked now, or kept as retired while attached.
  void RetireLocked(CatalogEntry entry, bool unlink_now);
  // Removes the entry's segment file; a failure is logged as an error (the entry goes
  // from the table either way: its memory is then only freed by an operator).
  void Unlink(const CatalogEntry& entry) const;

  const uint64_t budget_bytes_;
  const Quotas quotas_;
  const shm::SegmentDirectory* const segments_;
  GenerationStore* const generations_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, CatalogEntry> entries_;
  std::unordered_map<std::string, Reservation> loading_;
  std::map<std::pair<std::string, uint64_t>, CatalogEntry> retired_;
  uint64_t next_generation_;
  uint64_t clock_ = 0;
  EvictionCounts evictions_;
};

}  // namespace ckpt::daemon

// The write path's sessions (issue 15, docs/write-path.md): the daemon's table of
// generations being written by processes, one WriteSession per (uid, job).
//
// A session collects every part's declaration (WritePiece lists), checks that together
// they cover each tensor exactly once (PlanWriteLayout), reserves the name and the memory
// in the Catalog, creates the segment (only the daemon maps it writable), lets the parts
// stream their bytes, and when every part sealed computes the checksums and publishes the
// generation like a load. The first error (a part that disconnects, times out, aborts or
// sends bad bytes; a bad declaration; the budget) fails the whole session: every part gets
// that error, the segment file is removed and the reservation released; nothing was ever
// visible.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/status.h"
#include "ckpt/tensor.h"
#include "daemon/catalog.h"
#include "daemon/tensor_hasher.h"
#include "protocol/messages.h"
#include "shm/segment_directory.h"
#include "shm/segment_writer.h"

namespace ckpt::daemon {

// Where one declared piece's bytes go inside its tensor. The piece's bytes (row-major for
// a box, in order for a flat range) are runs of run_bytes contiguous bytes; run r starts at
// tensor byte base + sum(idx[d] * outer_stride[d]) where idx is r in outer_shape, row-major.
struct PieceTarget {
  size_t tensor = 0;   // index into WriteLayout::tensors
  uint64_t bytes = 0;  // the piece's size in bytes
  uint64_t base = 0;
  uint64_t run_bytes = 0;
  std::vector<uint64_t> outer_shape;
  std::vector<uint64_t> outer_stride;
};

// The segment's tensors and where each part's pieces go.
struct WriteLayout {
  std::vector<TensorInfo> tensors;                 // in the order first declared (part 0 first)
  std::vector<std::vector<PieceTarget>> targets;   // [part][piece]
  // [tensor]: one piece covers the whole tensor, so its bytes arrive in the tensor's own
  // order (one part streams them, in order) and its checksum is computed while streaming.
  std::vector<bool> in_order;
  uint64_t data_bytes = 0;
};

// Checks the parts' declarations together and lays them out. InvalidArgument (naming the
// tensor) when pieces of one key disagree on dtype or global shape, mix boxes and flat
// ranges, overlap, leave a hole, leave the tensor, or when sizes overflow 64 bits.
Result<WriteLayout> PlanWriteLayout(const std::vector<std::vector<protocol::WritePiece>>& parts);

// Calls emit(tensor_byte, piece_byte, n) for every contiguous run of the piece bytes
// [offset, offset + size) (a range already checked to lie within target.bytes).
void ForEachRun(const PieceTarget& target, uint64_t offset, uint64_t size,
                const std::function<void(uint64_t tensor_byte, uint64_t piece_byte, uint64_t n)>& emit);

class WriteSession {
 public:
  struct Environment {
    Catalog* catalog = nullptr;
    const shm::SegmentDirectory* segments = nullptr;
    uint32_t shm_mode = 0640;
    int threads = 8;  // the daemon's load threads: checksum threads are derived from it
    // A write in which no part sent anything (a declaration, a chunk, a seal) for this
    // long, while some part has not sealed yet, fails with DeadlineExceeded and frees
    // its reservation (--write-idle-timeout).
    double idle_timeout_s = 120;
    uint64_t max_writes_per_uid = 0;  // live sessions one non-admin uid may hold; 0: no limit
  };
  enum class State { kDeclaring, kCreating, kStreaming, kPublished, kFailed };

  // `owner`: the uid whose session this is (every part's), and its role at the first part.
  WriteSession(Environment env, std::string key, Owner owner, const protocol::WriteRequest& first);
  ~WriteSession();
  WriteSession(const WriteSession&) = delete;
  WriteSession& operator=(const WriteSession&) = delete;

  const std::string& name() const { return name_; }
  const std::string& key() const { return key_; }
  int64_t parts() const { return parts_; }
  uint32_t uid() const { return owner_.uid; }
  const Owner& owner() const { return owner_; }
  // Records activity of a part (a frame arrived): the idle timeout counts from the last.
  void Touch();
  // DeadlineExceeded (naming write-idle-timeout) once the write has been idle too long
  // while a part has not sealed; OK otherwise. Does not fail the session.
  Status CheckIdle() const;
  std::chrono::steady_clock::time_point deadline() const { return deadline_; }

  // Records part `part`'s pieces and side files. The part that completes the set lays
  // out, reserves and creates the segment (on its own thread, without the lock) and wakes
  // the others. Errors: AlreadyExists if the part already declared; InvalidArgument if the
  // request disagrees with the session (name, parts, replace): the session fails too; the
  // session's failure if it had failed or fails now (a bad layout, the budget, ...).
  Status Declare(const protocol::WriteRequest& request);
  // Waits until the segment exists (OK) or the session failed (its error). `check` runs
  // about every 100 ms; a non-OK Status from it fails the session with that Status.
  Status WaitReady(const std::function<Status()>& check);
  // The generation, once ready.
  uint64_t generation() const;
  // Where part `part`'s piece `piece` goes (valid once ready; both checked by the caller
  // against piece_count).
  const PieceTarget& target(int64_t part, size_t piece) const { return layout_.targets[part][piece]; }
  size_t piece_count(int64_t part) const { return layout_.targets[part].size(); }
  // The segment to copy into, shared so that a failure meanwhile removes it only after
  // the copy ends; the session's failure if it failed. With `hasher`, also the hasher
  // that the copied ranges of in-order tensors (in_order()) are handed to.
  Result<std::shared_ptr<shm::SegmentWriter>> Segment(std::shared_ptr<TensorHasher>* hasher = nullptr);
  // Whether tensor `tensor`'s checksum is computed while streaming (valid once ready).
  bool in_order(size_t tensor) const { return layout_.in_order[tensor]; }

  // Marks part `part` sealed (all its bytes arrived). The last part to seal computes the
  // checksums and publishes; every sealed part then waits (calling `check` about every
  // 100 ms) and gets the published summary or the session's failure. A non-OK Status from
  // `check` (this part hung up) ends this part's wait with it but fails nothing: a sealed
  // part's bytes are all in. The deadline still fails the parts not yet sealed.
  Result<protocol::LoadResponse> SealAndWait(int64_t part, const std::function<Status()>& check);
  // Fails the session (the first reason wins; later calls do nothing). Removes the segment
  // (once no copy holds it) and releases the reservation; wakes every waiting part.
  void Fail(const Status& why);
  // True once published or failed.
  bool finished() const;
  // The failure, or OK.
  Status failure() const;

 private:
  Status FailLocked(const Status& why, std::unique_lock<std::mutex>* lock);
  Status CheckIdleLocked() const;
  // Lays out, reserves, creates (the thread of the last declaring part; lock not held).
  Status Create();
  Result<protocol::LoadResponse> Publish();
  // Publish's steps: every tensor's checksum of the bytes in `segment` (the in-order
  // tensors' from `hasher`, the others hashed now on env_.threads threads); the catalog
  // entry of the published segment (its read-only descriptor not yet recorded).
  Result<std::vector<uint64_t>> FinishChecksums(const shm::SegmentWriter& segment, TensorHasher& hasher);
  CatalogEntry PublishedEntry(const shm::SegmentWriter& segment, const std::vector<uint64_t>& checksums,
                              std::chrono::nanoseconds took) const;
  std::string Progress() const;  // "a of b parts declared, c sealed" (lock held)

  const Environment env_;
  const std::string key_;
  const Owner owner_;
  const uint32_t uid_;
  const std::string name_;
  const int64_t parts_;
  const bool replace_;
  const std::string job_;
  const std::chrono::steady_clock::time_point started_;
  const std::chrono::steady_clock::time_point deadline_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::kDeclaring;
  Status failure_;
  std::vector<std::optional<std::vector<protocol::WritePiece>>> declared_;
  std::vector<std::pair<std::string, std::string>> side_files_;
  int64_t declared_count_ = 0;
  std::vector<bool> sealed_;
  int64_t sealed_count_ = 0;
  WriteLayout layout_;  // set before kStreaming, read-only afterwards
  uint64_t generation_ = 0;
  bool reserved_ = false;  // the catalog holds a reservation for name_
  std::shared_ptr<shm::SegmentWriter> segment_;
  std::shared_ptr<TensorHasher> hasher_;  // holds segment_ alive until its threads end
  std::optional<protocol::LoadResponse> result_;
  std::vector<std::string> evicted_;  // what the budget evicted for this write
  std::chrono::steady_clock::time_point last_activity_;
};

// The table of sessions, thread-safe.
class WriteSessions {
 public:
  explicit WriteSessions(WriteSession::Environment env) : env_(env) {}

  // The session part `request.part` of (actor.uid, request.job) joins, created if there is
  // none or only a finished one. A request without a job (parts must be 1) gets a session
  // of its own. InvalidArgument for a multi-part request without a job; ResourceExhausted
  // (naming max-writes-per-uid) when a new session would exceed the actor's limit.
  Result<std::shared_ptr<WriteSession>> Join(const Owner& actor, const protocol::WriteRequest& request);
  // Live sessions of `uid`.
  size_t ActiveOf(uint32_t uid) const;
  // Drops `session` from the table if it is finished (each part calls it when it ends).
  void Release(const std::shared_ptr<WriteSession>& session);
  // Fails every live session (the daemon stops).
  void FailAll(const Status& why);
  // Live sessions (not finished).
  size_t active() const;

 private:
  const WriteSession::Environment env_;
  mutable std::mutex mu_;
  std::map<std::pair<uint32_t, std::string>, std::shared_ptr<WriteSession>> sessions_;
  uint64_t anonymous_ = 0;
};

}  // namespace ckpt::daemon

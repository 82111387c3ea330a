#include "daemon/write_sessions.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "common/checked_math.h"
#include "common/element_count.h"
#include "common/progress_throttle.h"
#include "common/thread_pool.h"
#include "daemon/ops.h"
#include "shm/segment_name.h"
#include "shm/segment_reader.h"

namespace ckpt::daemon {

namespace {

using protocol::WritePiece;

// Box pieces of one tensor are checked pairwise; more than this many pair tests in one
// layout are refused rather than spent.
constexpr uint64_t kMaxBoxPairTests = 50'000'000;

struct KeyPieces {
  size_t tensor;
  std::vector<std::pair<int64_t, size_t>> pieces;  // (part, piece index)
};

std::string PieceName(int64_t part, size_t piece) {
  return "part " + std::to_string(part) + " piece " + std::to_string(piece);
}

bool BoxesOverlap(const WritePiece& a, const WritePiece& b) {
  for (size_t d = 0; d < a.shape.size(); ++d) {
    const int64_t a0 = a.offsets[d], a1 = a0 + a.shape[d], b0 = b.offsets[d], b1 = b0 + b.shape[d];
    if (a1 <= b0 || b1 <= a0) return false;
  }
  return true;
}

// Every tensor's pieces, grouped by key in first-seen order (the order of `order`); each
// tensor's TensorInfo is appended to layout.tensors. Errors: a sub-byte dtype, a global
// shape or size that overflows, pieces of one key that disagree on dtype or global shape.
Status GroupPieces(const std::vector<std::vector<WritePiece>>& parts, WriteLayout& layout,
                   std::unordered_map<std::string, KeyPieces>& keys, std::vector<const std::string*>& order) {
  for (size_t part = 0; part < parts.size(); ++part) {
    for (size_t i = 0; i < parts[part].size(); ++i) {
      const WritePiece& p = parts[part][i];
      if (DTypeSize(p.dtype) == 0) {
        return Unsupported("tensor '" + p.key + "': " + DTypeName(p.dtype) + " (a sub-byte dtype) cannot be written");
      }
      auto [it, inserted] = keys.try_emplace(p.key, KeyPieces{layout.tensors.size(), {}});
      if (inserted) {
        TensorInfo t;
        t.name = p.key;
        t.dtype = p.dtype;
        t.shape = p.global_shape;
        auto numel = ElementCount(p.global_shape);
        if (!numel.ok()) return InvalidArgument("tensor '" + p.key + "': its global shape: " + numel.status().message());
        auto bytes = TensorBytes(p.dtype, *numel);
        if (!bytes) return InvalidArgument("tensor '" + p.key + "': its size overflows 64 bits");
        t.nbytes = *bytes;
        layout.tensors.push_back(std::move(t));
        order.push_back(&it->first);
      }
      const TensorInfo& t = layout.tensors[it->second.tensor];
      if (p.dtype != t.dtype || p.global_shape != t.shape) {
        return InvalidArgument("tensor '" + p.key + "': " + PieceName(static_cast<int64_t>(part), i) +
                               " declares it as " + DTypeName(p.dtype) + " of another dtype or global shape than " +
                               PieceName(it->second.pieces.front().first, it->second.pieces.front().second) +
                               " (" + DTypeName(t.dtype) + "); every piece of a tensor must agree");
      }
      it->second.pieces.emplace_back(static_cast<int64_t>(part), i);
    }
  }
  return Status::Ok();
}

// Flat ranges of one tensor of `numel` elements of `elem` bytes: each inside it, no
// overlaps and no gaps; sets their targets.
Status PlaceFlat(const std::vector<std::vector<WritePiece>>& parts, const std::string& key, const KeyPieces& kp,
                 uint64_t numel, uint64_t elem, WriteLayout& layout) {
  std::vector<std::pair<uint64_t, std::pair<int64_t, size_t>>> ranges;
  for (const auto& [part, i] : kp.pieces) {
    const WritePiece& p = parts[part][i];
    auto end = CheckedAdd(p.start, p.numel);
    if (!end || *end > numel) {
      return InvalidArgument("tensor '" + key + "': " + PieceName(part, i) + " (elements " +
                             std::to_string(p.start) + " + " + std::to_string(p.numel) +
                             ") leaves the tensor of " + std::to_string(numel) + " elements");
    }
    ranges.push_back({p.start, {part, i}});
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t covered = 0;
  for (const auto& [start, who] : ranges) {
    const WritePiece& p = parts[who.first][who.second];
    if (p.numel == 0) continue;
    if (start < covered) {
      return InvalidArgument("tensor '" + key + "': " + PieceName(who.first, who.second) +
                             " overlaps another piece at element " + std::to_string(start));
    }
    if (start > covered) {
      return InvalidArgument("tensor '" + key + "': no part writes elements " + std::to_string(covered) +
                             " to " + std::to_string(start));
    }
    covered = start + p.numel;
  }
  if (covered != numel) {
    return InvalidArgument("tensor '" + key + "': no part writes elements " + std::to_string(covered) + " to " +
                           std::to_string(numel));
  }
  layout.in_order[kp.tensor] = kp.pieces.size() == 1;  // then it is [0, numel)
  for (const auto& [part, i] : kp.pieces) {
    const WritePiece& p = parts[part][i];
    PieceTarget target;
    target.tensor = kp.tensor;
    target.bytes = p.numel * elem;
    target.base = p.start * elem;
    target.run_bytes = target.bytes;
    layout.targets[part].resize(parts[part].size());
    layout.targets[part][i] = std::move(target);
  }
  return Status::Ok();
}

// Where box `p` of tensor `t` (row-major `stride` in elements) lands: its base, its runs
// (the innermost dims the box spans whole, plus the first one it does not) and the outer
// dims that step between runs.
PieceTarget BoxTarget(const WritePiece& p, const TensorInfo& t, size_t tensor, const std::vector<uint64_t>& stride,
                      uint64_t elem) {
  const size_t ndim = t.shape.size();
  PieceTarget target;
  target.tensor = tensor;
  target.bytes = NumElements(p.shape) * elem;  // inside the tensor (checked at decode)
  size_t k = ndim;  // dims [k, ndim) are in the run
  uint64_t run = 1;
  while (k > 0) {
    --k;
    run *= static_cast<uint64_t>(p.shape[k]);
    if (p.shape[k] != t.shape[k]) break;
  }
  if (ndim == 0) k = 0;
  target.run_bytes = run * elem;
  uint64_t base = 0;
  for (size_t d = 0; d < ndim; ++d) base += static_cast<uint64_t>(p.offsets[d]) * stride[d];
  target.base = base * elem;
  for (size_t d = 0; d < k; ++d) {
    target.outer_shape.push_back(static_cast<uint64_t>(p.shape[d]));
    target.outer_stride.push_back(stride[d] * elem);
  }
  return target;
}

// Boxes of one tensor: each inside the tensor (checked at decode), pairwise disjoint,
// volumes summing to the tensor's: then they cover it exactly. `pair_tests` counts the
// pair tests of the whole layout (at most kMaxBoxPairTests). Sets their targets.
Status PlaceBoxes(const std::vector<std::vector<WritePiece>>& parts, const std::string& key, const KeyPieces& kp,
                  const TensorInfo& t, uint64_t numel, uint64_t elem, uint64_t& pair_tests, WriteLayout& layout) {
  const uint64_t n = kp.pieces.size();
  pair_tests += n * (n - 1) / 2;
  if (pair_tests > kMaxBoxPairTests) {
    return InvalidArgument("tensor '" + key + "': too many box pieces to check (" + std::to_string(n) + ")");
  }
  uint64_t volume = 0;
  for (size_t a = 0; a < kp.pieces.size(); ++a) {
    const WritePiece& pa = parts[kp.pieces[a].first][kp.pieces[a].second];
    const uint64_t v = NumElements(pa.shape);  // <= numel: inside the tensor
    auto sum = CheckedAdd(volume, v);
    volume = sum ? *sum : numel + 1;
    if (v == 0) continue;
    for (size_t b = a + 1; b < kp.pieces.size(); ++b) {
      const WritePiece& pb = parts[kp.pieces[b].first][kp.pieces[b].second];
      if (BoxesOverlap(pa, pb)) {
        return InvalidArgument("tensor '" + key + "': " + PieceName(kp.pieces[a].first, kp.pieces[a].second) +
                               " and " + PieceName(kp.pieces[b].first, kp.pieces[b].second) + " overlap");
      }
    }
    if (volume > numel) break;  // reported below
  }
  if (volume != numel) {
    return InvalidArgument("tensor '" + key + "': the pieces hold " + std::to_string(volume) + " of its " +
                           std::to_string(numel) + " elements (a hole, or pieces missing)");
  }
  layout.in_order[kp.tensor] = kp.pieces.size() == 1;  // then it is the whole box
  // Row-major strides of the global tensor, in elements.
  const size_t ndim = t.shape.size();
  std::vector<uint64_t> stride(ndim, 1);
  for (size_t d = ndim; d-- > 1;) stride[d - 1] = stride[d] * static_cast<uint64_t>(t.shape[d]);
  for (const auto& [part, i] : kp.pieces) {
    layout.targets[part].resize(parts[part].size());
    layout.targets[part][i] = BoxTarget(parts[part][i], t, kp.tensor, stride, elem);
  }
  return Status::Ok();
}

}  // namespace

Result<WriteLayout> PlanWriteLayout(const std::vector<std::vector<WritePiece>>& parts) {
  WriteLayout layout;
  layout.targets.resize(parts.size());
  std::unordered_map<std::string, KeyPieces> keys;
  std::vector<const std::string*> order;
  CKPT_RETURN_IF_ERROR(GroupPieces(parts, layout, keys, order));

  // Coverage, per tensor, and the targets.
  layout.in_order.assign(layout.tensors.size(), false);
  uint64_t pair_tests = 0;
  CheckedSum data_bytes;
  for (const std::string* key : order) {
    const KeyPieces& kp = keys.at(*key);
    const TensorInfo& t = layout.tensors[kp.tensor];
    data_bytes.Add(t.nbytes);
    const uint64_t elem = DTypeSize(t.dtype);
    const uint64_t numel = elem == 0 ? 0 : t.nbytes / elem;
    const auto& first = parts[kp.pieces.front().first][kp.pieces.front().second];
    bool flat = first.flat;
    for (const auto& [part, i] : kp.pieces) {
      if (parts[part][i].flat != flat) {
        return InvalidArgument("tensor '" + *key + "': some pieces are boxes and some flat ranges (" +
                               PieceName(part, i) + "); a tensor is written one way");
      }
    }
    if (flat) {
      CKPT_RETURN_IF_ERROR(PlaceFlat(parts, *key, kp, numel, elem, layout));
    } else {
      CKPT_RETURN_IF_ERROR(PlaceBoxes(parts, *key, kp, t, numel, elem, pair_tests, layout));
    }
  }
  CKPT_ASSIGN_OR_RETURN(layout.data_bytes, data_bytes.Get("the checkpoint's size"));
  return layout;
}

void ForEachRun(const PieceTarget& target, uint64_t offset, uint64_t size,
                const std::function<void(uint64_t, uint64_t, uint64_t)>& emit) {
  if (size == 0 || target.run_bytes == 0) return;
  uint64_t run = offset / target.run_bytes;
  uint64_t within = offset % target.run_bytes;
  const size_t outer = target.outer_shape.size();
  while (size > 0) {
    uint64_t dst = target.base, r = run;
    for (size_t d = outer; d-- > 0;) {
      dst += (r % target.outer_shape[d]) * target.outer_stride[d];
      r /= target.outer_shape[d];
    }
    const uint64_t n = std::min(size, target.run_bytes - within);
    emit(dst + within, offset, n);
    offset += n;
    size -= n;
    within = 0;
    ++run;
  }
}

// ---- WriteSession ----

WriteSession::WriteSession(Environment env, std::string key, Owner owner, const protocol::WriteRequest& first)
    : env_(env),
      key_(std::move(key)),
      owner_(std::move(owner)),
      uid_(owner_.uid),
      name_(first.name),
      parts_(first.parts),
      replace_(first.replace),
      job_(first.job),
      started_(std::chrono::steady_clock::now()),
      deadline_(started_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               std::chrono::duration<double>(first.timeout_s))),
      declared_(static_cast<size_t>(first.parts)),
      sealed_(static_cast<size_t>(first.parts), false),
      last_activity_(started_) {}

void WriteSession::Touch() {
  std::lock_guard<std::mutex> lock(mu_);
  last_activity_ = std::chrono::steady_clock::now();
}

Status WriteSession::CheckIdleLocked() const {
  // Creating the segment and publishing are the daemon's work, not a part's idling.
  const bool waiting_for_parts =
      state_ == State::kDeclaring || (state_ == State::kStreaming && sealed_count_ < parts_);
  if (!waiting_for_parts || env_.idle_timeout_s <= 0) return Status::Ok();
  const double idle = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_activity_).count();
  if (idle <= env_.idle_timeout_s) return Status::Ok();
  return DeadlineExceeded("no part of the write of '" + name_ + "' sent anything for " + std::to_string(idle) +
                          " s (" + Progress() + "); the write-idle-timeout is " +
                          std::to_string(env_.idle_timeout_s) + " s");
}

Status WriteSession::CheckIdle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return CheckIdleLocked();
}

WriteSession::~WriteSession() {
  std::unique_lock<std::mutex> lock(mu_);
  if (state_ != State::kPublished && state_ != State::kFailed) {
    (void)FailLocked(Internal("write session abandoned"), &lock);
  }
}

std::string WriteSession::Progress() const {
  return std::to_string(declared_count_) + " of " + std::to_string(parts_) + " parts declared, " +
         std::to_string(sealed_count_) + " sealed";
}

Status WriteSession::Declare(const protocol::WriteRequest& request) {
  std::unique_lock<std::mutex> lock(mu_);
  if (state_ == State::kFailed) return failure_;
  if (request.name != name_ || request.parts != parts_ || request.replace != replace_) {
    return FailLocked(InvalidArgument("part " + std::to_string(request.part) + " of job '" + job_ +
                                      "' disagrees with the job's first part on the name, the part count or "
                                      "replace ('" + request.name + "', " + std::to_string(request.parts) +
                                      " parts; the job writes '" + name_ + "' in " + std::to_string(parts_) +
                                      " parts)"),
                      &lock);
  }
  auto& slot = declared_[static_cast<size_t>(request.part)];
  if (slot.has_value() || state_ != State::kDeclaring) {
    return AlreadyExists("part " + std::to_string(request.part) + " of the write of '" + name_ +
                         "' has already joined (" + Progress() + ")");
  }
  for (const auto& side : request.side_files) {
    for (const auto& have : side_files_) {
      if (have.first == side.name) {
        return FailLocked(InvalidArgument("side file '" + side.name + "' is given by more than one part"), &lock);
      }
    }
    side_files_.emplace_back(side.name, side.bytes);
  }
  slot = request.pieces;
  ++declared_count_;
  last_activity_ = std::chrono::steady_clock::now();
  if (declared_count_ < parts_) return Status::Ok();
  state_ = State::kCreating;
  lock.unlock();
  Status created = Create();
  lock.lock();
  if (!created.ok()) return FailLocked(created, &lock);
  if (state_ == State::kFailed) return failure_;  // failed meanwhile (a part hung up)
  state_ = State::kStreaming;
  cv_.notify_all();
  return Status::Ok();
}

Status WriteSession::Create() {
  // Only this thread touches declared_ and layout_ in kCreating.
  std::vector<std::vector<protocol::WritePiece>> parts;
  parts.reserve(declared_.size());
  for (auto& d : declared_) parts.push_back(std::move(*d));
  CKPT_ASSIGN_OR_RETURN(WriteLayout layout, PlanWriteLayout(parts));
  CheckedSum side_sum;
  for (const auto& side : side_files_) side_sum.Add(side.second.size());
  CKPT_ASSIGN_OR_RETURN(const uint64_t side_bytes, side_sum.Get("the side files' size"));
  CKPT_ASSIGN_OR_RETURN(const uint64_t estimate,
                        shm::EstimateSegmentBytes(*env_.segments, layout.data_bytes, layout.tensors.size(), side_bytes));
  std::vector<std::string> evicted;
  CKPT_ASSIGN_OR_RETURN(uint64_t generation, env_.catalog->BeginLoad(name_, replace_, estimate, owner_, &evicted));
  for (const std::string& e : evicted) spdlog::info("evicted '{}' to make room for the write of '{}'", e, name_);
  shm::SegmentSpec spec;
  spec.directory = env_.segments;
  spec.checkpoint_name = name_;
  spec.source_path = "write:" + (job_.empty() ? std::string("(one process)") : job_) + " uid " + std::to_string(uid_);
  spec.generation = generation;
  spec.mode = env_.shm_mode;
  spec.owner_uid = owner_.uid;
  spec.owner_admin = owner_.admin;
  spec.tensors = layout.tensors;
  spec.side_files = side_files_;
  // Only the header pages before the parts may stream; the rest is reserved on a thread
  // of the segment's, in file order, while the first chunks are copied (they wait for
  // the range they land in: nothing is written to a page not reserved).
  spec.populate = shm::PagePopulate::kBackground;
  auto created = shm::SegmentWriter::Create(spec);
  if (!created.ok()) {
    env_.catalog->AbortLoad(name_);
    return created.status();
  }
  std::shared_ptr<shm::SegmentWriter> segment(std::move(created).value());
  auto hasher = TensorHasher::Create(layout.tensors.size(), std::max(2, env_.threads / 4), segment);
  if (!hasher.ok()) {
    segment.reset();
    env_.catalog->AbortLoad(name_);
    return hasher.status();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == State::kFailed) {
    // A part failed the session meanwhile: undo (the segment file goes with `segment`).
    hasher->reset();
    segment.reset();
    env_.catalog->AbortLoad(name_);
    return failure_;
  }
  reserved_ = true;
  evicted_ = std::move(evicted);
  last_activity_ = std::chrono::steady_clock::now();  // the parts' idle time counts from the segment's creation
  generation_ = generation;
  layout_ = std::move(layout);
  segment_ = std::move(segment);
  hasher_ = std::shared_ptr<TensorHasher>(std::move(hasher).value());
  spdlog::info("writing '{}' generation {}: {} tensors, {} bytes, {} parts (job '{}', uid {}); segment of {} "
               "pages, reserved with {}", name_, generation, layout_.tensors.size(), layout_.data_bytes, parts_, job_,
               uid_, shm::PageSizeName(env_.segments->pages().segment_alignment()), segment_->populate_summary());
  return Status::Ok();
}

Status WriteSession::WaitReady(const std::function<Status()>& check) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (state_ == State::kFailed) return failure_;
    if (state_ == State::kStreaming || state_ == State::kPublished) return Status::Ok();
    cv_.wait_for(lock, kProgressInterval);
    if (state_ == State::kFailed || state_ == State::kStreaming) continue;
    lock.unlock();
    Status checked = check();
    if (checked.ok() && std::chrono::steady_clock::now() > deadline_) {
      checked = DeadlineExceeded("the write of '" + name_ + "' did not get all its parts in time");
    }
    lock.lock();
    if (checked.ok()) checked = CheckIdleLocked();
    // (A session failed while its segment is created is cleaned up by the creating thread.)
    if (!checked.ok()) return FailLocked(checked, &lock);
  }
}

uint64_t WriteSession::generation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}

Result<std::shared_ptr<shm::SegmentWriter>> WriteSession::Segment(std::shared_ptr<TensorHasher>* hasher) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == State::kFailed) return failure_;
  if (!segment_ || !hasher_) return FailedPrecondition("the write of '" + name_ + "' has no segment now");
  if (hasher != nullptr) *hasher = hasher_;
  return segment_;
}

Result<protocol::LoadResponse> WriteSession::SealAndWait(int64_t part, const std::function<Status()>& check) {
  std::unique_lock<std::mutex> lock(mu_);
  if (state_ == State::kFailed) return failure_;
  if (!sealed_[static_cast<size_t>(part)]) {
    sealed_[static_cast<size_t>(part)] = true;
    ++sealed_count_;
  }
  last_activity_ = std::chrono::steady_clock::now();
  if (sealed_count_ == parts_ && state_ == State::kStreaming) {
    lock.unlock();
    auto published = Publish();
    lock.lock();
    if (!published.ok()) return FailLocked(published.status(), &lock);
    if (state_ == State::kFailed) return failure_;
    cv_.notify_all();
    return *result_;
  }
  for (;;) {
    if (state_ == State::kFailed) return failure_;
    if (state_ == State::kPublished) return *result_;
    cv_.wait_for(lock, kProgressInterval);
    if (state_ == State::kFailed || state_ == State::kPublished) continue;
    lock.unlock();
    Status checked = check();
    if (checked.ok() && std::chrono::steady_clock::now() > deadline_) {
      checked = DeadlineExceeded("the write of '" + name_ + "' was not sealed by all its parts in time");
    }
    lock.lock();
    // The parts still streaming idle: that fails the write (and frees its memory).
    if (Status idle = CheckIdleLocked(); !idle.ok()) return FailLocked(idle, &lock);
    // This part sealed: all its bytes are in, so its going away (or the deadline) fails
    // nothing; only this part stops waiting for the others.
    if (!checked.ok() && state_ == State::kStreaming) return checked;
  }
}

Result<protocol::LoadResponse> WriteSession::Publish() {
  std::shared_ptr<shm::SegmentWriter> segment;
  std::shared_ptr<TensorHasher> hasher;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kFailed) return failure_;
    segment = segment_;
    hasher = hasher_;
  }
  // Every page reserved (the background reservation has long ended unless the file
  // system filled up: then ResourceExhausted, nothing published).
  CKPT_RETURN_IF_ERROR(segment->Populate(env_.threads));
  CKPT_ASSIGN_OR_RETURN(const std::vector<uint64_t> checksums, FinishChecksums(*segment, *hasher));
  const auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kFailed) return failure_;
  }
  CKPT_RETURN_IF_ERROR(segment->Publish(checksums, static_cast<uint64_t>(nanos.count())));
  CatalogEntry entry = PublishedEntry(*segment, checksums, nanos);
  {
    UniqueFd read_only = segment->TakeReadOnlyFd();
    if (Status identified = RecordSegmentIdentity(read_only.get(), &entry); !identified.ok()) {
      (void)env_.segments->Remove(segment->file_name());  // complete already: never to be adopted
      return identified;
    }
  }  // attach and verify open the segment again when they need it
  std::lock_guard<std::mutex> lock(mu_);
  protocol::LoadResponse result{SummaryOf(entry), evicted_};
  env_.catalog->Publish(std::move(entry));
  reserved_ = false;
  state_ = State::kPublished;
  // The daemon's writable mapping goes on a thread of its own: unmapping 10 GiB of 4 KiB
  // pages takes tenths of a second that the parts need not wait for (readers map the
  // published file themselves). `hasher` and `segment` hold the last references (every
  // part sealed), so dropping the members here unmaps nothing.
  hasher_.reset();
  segment_.reset();
  ReleaseInBackground(std::move(hasher), std::move(segment));  // the hasher first, then the mapping
  result_ = result;
  spdlog::info("published '{}' generation {} written by {} part(s): {} tensors, {} bytes in {:.3f} s; {} pages, {} "
               "of {} bytes on huge pages", name_, generation_, parts_, layout_.tensors.size(), layout_.data_bytes,
               nanos.count() / 1e9, shm::PageSizeName(result.checkpoint.page_bytes), result.checkpoint.huge_bytes,
               result.checkpoint.segment_bytes);
  return result;
}

Result<std::vector<uint64_t>> WriteSession::FinishChecksums(const shm::SegmentWriter& segment, TensorHasher& hasher) {
  // Checksums of the bytes as they are in the segment, which only the daemon can write:
  // the in-order tensors' were computed while the chunks came in (the last ranges may
  // still be in the hasher's queue); the others' (several pieces, written in any order)
  // now, in parallel.
  const size_t count = layout_.tensors.size();
  std::vector<uint64_t> checksums = hasher.Finish();
  std::vector<size_t> rest;
  uint64_t rest_bytes = 0;
  for (size_t i = 0; i < count; ++i) {
    if (!layout_.in_order[i]) {
      rest.push_back(i);
      rest_bytes += layout_.tensors[i].nbytes;
    }
  }
  const auto streamed_at = std::chrono::steady_clock::now();
  std::atomic<size_t> next{0};
  Status hashed = RunWorkers(
      std::max(1, std::min<int>(env_.threads, static_cast<int>(std::max<size_t>(rest.size(), 1)))),
      [&](int, const std::atomic<bool>& stop) {
        for (size_t k = next++; k < rest.size() && !stop.load(); k = next++) {
          const size_t i = rest[k];
          checksums[i] = shm::Checksum(segment.tensor_data(i), layout_.tensors[i].nbytes);
        }
        return Status::Ok();
      },
      nullptr);
  CKPT_RETURN_IF_ERROR(hashed);
  spdlog::info("checksums of '{}' generation {}: {} tensors ({} bytes) hashed while streaming, {} ({} bytes) at "
               "publish in {:.3f} s", name_, generation_, count - rest.size(), hasher.hashed_bytes(), rest.size(),
               rest_bytes, std::chrono::duration<double>(std::chrono::steady_clock::now() - streamed_at).count());
  return checksums;
}

CatalogEntry WriteSession::PublishedEntry(const shm::SegmentWriter& segment, const std::vector<uint64_t>& checksums,
                                          std::chrono::nanoseconds took) const {
  CatalogEntry entry;
  entry.name = name_;
  entry.generation = generation_;
  entry.shm_name = segment.file_name();
  entry.segment_id = shm::SegmentIdHex(segment.segment_id());
  entry.source_path = "write:" + (job_.empty() ? std::string("(one process)") : job_) + " uid " + std::to_string(uid_);
  entry.format = "published";
  entry.segment_bytes = segment.segment_bytes();
  entry.data_bytes = layout_.data_bytes;
  entry.page_bytes = env_.segments->pages().segment_alignment();
  // What the kernel mapped huge (a walk of /proc/self/smaps: about 70 ms for 10 GiB);
  // none where the directory gives no huge pages.
  entry.huge_bytes = static_cast<int64_t>(segment.HugeMappedBytes());
  entry.load_seconds = took.count() / 1e9;
  entry.loaded_unix_s = NowUnixSeconds();
  std::vector<TensorInfo> tensors = layout_.tensors;
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].checksum = checksums[i];
  entry.tensors = std::make_shared<const std::vector<TensorInfo>>(std::move(tensors));
  entry.owner = owner_;
  return entry;
}

void WriteSession::Fail(const Status& why) {
  std::unique_lock<std::mutex> lock(mu_);
  (void)FailLocked(why, &lock);
}

Status WriteSession::FailLocked(const Status& why, std::unique_lock<std::mutex>* lock) {
  if (state_ == State::kFailed || state_ == State::kPublished) return state_ == State::kFailed ? failure_ : why;
  state_ = State::kFailed;
  failure_ = Status(why.code(), "the write of '" + name_ + "' failed and nothing was published: " + why.message());
  std::shared_ptr<TensorHasher> hasher = std::move(hasher_);
  std::shared_ptr<shm::SegmentWriter> segment = std::move(segment_);
  const bool reserved = reserved_;
  reserved_ = false;
  cv_.notify_all();
  lock->unlock();
  spdlog::warn("{}", failure_.message());
  hasher.reset();   // joins its threads (unless a copy still holds it), then lets the segment go
  segment.reset();  // removes the file unless a copy still holds it (then when that ends)
  if (reserved) env_.catalog->AbortLoad(name_);
  lock->lock();
  return failure_;
}

bool WriteSession::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ == State::kPublished || state_ == State::kFailed;
}

Status WriteSession::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

// ---- WriteSessions ----

Result<std::shared_ptr<WriteSession>> WriteSessions::Join(const Owner& actor, const protocol::WriteRequest& request) {
  if (request.job.empty() && request.parts != 1) {
    return InvalidArgument("a write in " + std::to_string(request.parts) + " parts needs a job id that all parts share");
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::string key = request.job;
  const bool anonymous = key.empty();
  if (anonymous) key = "\x01one-process-" + std::to_string(anonymous_ + 1);  // no job name has \x01
  auto it = sessions_.find({actor.uid, key});
  if (it != sessions_.end() && !it->second->finished()) return it->second;
  if (!actor.admin && env_.max_writes_per_uid > 0) {
    size_t live = 0;
    for (const auto& [k, s] : sessions_) live += (k.first == actor.uid && !s->finished()) ? 1 : 0;
    if (live >= env_.max_writes_per_uid) {
      return ResourceExhausted(Describe(actor) + " has " + std::to_string(live) + " writes in progress; its limit is " +
                               std::to_string(env_.max_writes_per_uid) + " (max-writes-per-uid)");
    }
  }
  if (anonymous) ++anonymous_;
  auto& slot = sessions_[{actor.uid, key}];
  slot = std::make_shared<WriteSession>(env_, key, actor, request);
  return slot;
}

size_t WriteSessions::ActiveOf(uint32_t uid) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [key, s] : sessions_) n += (key.first == uid && !s->finished()) ? 1 : 0;
  return n;
}

void WriteSessions::Release(const std::shared_ptr<WriteSession>& session) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find({session->uid(), session->key()});
  if (it != sessions_.end() && it->second == session && session->finished()) sessions_.erase(it);
}

void WriteSessions::FailAll(const Status& why) {
  std::vector<std::shared_ptr<WriteSession>> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, s] : sessions_) live.push_back(s);
  }
  for (auto& s : live) s->Fail(why);
}

size_t WriteSessions::active() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [key, s] : sessions_) n += s->finished() ? 0 : 1;
  return n;
}

}  // namespace ckpt::daemon

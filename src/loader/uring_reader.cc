#include "loader/uring_reader.h"

#include <liburing.h>

#include <cerrno>

#include "common/thread_pool.h"

namespace ckpt::loader {
namespace {

// Owns one io_uring instance.
class Ring {
 public:
  Ring() = default;
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  ~Ring() {
    if (initialized_) io_uring_queue_exit(&ring_);
  }
  // Returns 0 or a negative errno.
  int Init(unsigned entries) {
    int rc = io_uring_queue_init(entries, &ring_, 0);
    initialized_ = rc == 0;
    return rc;
  }
  io_uring* get() { return &ring_; }

 private:
  io_uring ring_{};
  bool initialized_ = false;
};

struct Slot {
  size_t op = 0;
  AlignedBuffer bounce;
};

// One worker thread's reads: its ring, one slot per read in flight (bounce buffers kept
// across reads), and the first error (after which it only drains what is in flight).
class Worker {
 public:
  Worker(const ReaderOptions& options, const std::vector<SourceFile>& files, const std::vector<ReadOp>& ops,
         std::atomic<size_t>& next, int depth)
      : options_(options), files_(files), ops_(ops), next_(next), slots_(depth) {
    free_slots_.reserve(depth);
    for (int s = depth - 1; s >= 0; --s) free_slots_.push_back(s);
  }

  // Returns 0 or a negative errno.
  int Init(unsigned depth) { return ring_.Init(depth); }

  // Queues reads of the next ops into the free slots until none is free, the ops run out,
  // `stop` is set or an error (cancel, no bounce memory) is recorded.
  void Fill(const std::atomic<bool>& stop) {
    while (error_.ok() && !stop.load(std::memory_order_relaxed) && !free_slots_.empty()) {
      if (options_.cancel && options_.cancel->load()) {
        error_ = FailedPrecondition("load cancelled");
        break;
      }
      const size_t i = next_.fetch_add(1);
      if (i >= ops_.size()) break;
      const ReadOp& op = ops_[i];
      const SourceFile& file = files_[op.file];
      const int s = free_slots_.back();
      Slot& slot = slots_[s];
      slot.op = i;
      const ReadCover cover = CoverOf(op, file);
      std::byte* buf = op.dst;
      int fd = op.mode == ReadMode::kBuffered ? file.buffered_fd() : file.direct.get();
      if (op.mode == ReadMode::kBounce) {
        if (!slot.bounce.Reserve(BounceBytes(options_.chunk_bytes), kMaxDirectAlignment)) {
          error_ = ResourceExhausted("no memory for a read buffer");
          break;
        }
        buf = slot.bounce.data();
      }
      io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
      if (sqe == nullptr) {  // cannot happen: at most `depth` reads are queued
        error_ = Internal("io_uring submission queue full");
        break;
      }
      io_uring_prep_read(sqe, fd, buf, static_cast<unsigned>(cover.length), cover.offset);
      io_uring_sqe_set_data(sqe, reinterpret_cast<void*>(static_cast<uintptr_t>(s)));
      free_slots_.pop_back();
      ++inflight_;
    }
  }

  // Submits and waits for a completion; false when nothing completed and nothing can be
  // waited for (the ring itself failed), so the worker must stop.
  bool SubmitAndReap(const std::function<void(size_t)>& on_done) {
    int rc = io_uring_submit_and_wait(ring_.get(), 1);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
      // The ring itself failed; reads already queued may still complete, so wait for them.
      if (error_.ok()) error_ = ErrnoError("io_uring_submit", -rc);
    }
    io_uring_cqe* cqe = nullptr;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(ring_.get(), head, cqe) {
      ++seen;
      const int s = static_cast<int>(reinterpret_cast<uintptr_t>(io_uring_cqe_get_data(cqe)));
      --inflight_;
      free_slots_.push_back(s);
      if (error_.ok()) Complete(s, cqe->res, on_done);  // else draining after an error
    }
    io_uring_cq_advance(ring_.get(), seen);
    return !(rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && seen == 0 && inflight_ > 0);
  }

  int inflight() const { return inflight_; }
  const Status& error() const { return error_; }

 private:
  // Finishes slot `s`'s read of `res` bytes (or -errno): short reads, EINVAL (O_DIRECT
  // refused) and the bounce copy finish here; reports the op done or records the error.
  void Complete(int s, int res, const std::function<void(size_t)>& on_done) {
    Slot& slot = slots_[s];
    const ReadOp& op = ops_[slot.op];
    if (res < 0 && res != -EINVAL && res != -EINTR && res != -EAGAIN) {
      error_ = ErrnoError("read of " + files_[op.file].path + " failed", -res);
      return;
    }
    Status st = FinishRead(op, files_[op.file], slot.bounce.data(), res > 0 ? static_cast<uint64_t>(res) : 0);
    if (!st.ok()) {
      error_ = st;
      return;
    }
    on_done(slot.op);
  }

  const ReaderOptions& options_;
  const std::vector<SourceFile>& files_;
  const std::vector<ReadOp>& ops_;
  std::atomic<size_t>& next_;
  std::vector<Slot> slots_;  // declared before the ring: outlives the ring that reads into it
  Ring ring_;
  std::vector<int> free_slots_;
  Status error_;
  int inflight_ = 0;
};

}  // namespace

Result<std::unique_ptr<UringReader>> UringReader::Create(const ReaderOptions& options) {
  if (options.threads < 1 || options.queue_depth < 1) {
    return InvalidArgument("io_uring reader needs at least one thread and one read in flight");
  }
  if (options.chunk_bytes == 0 || options.chunk_bytes % 4096 != 0 || options.chunk_bytes > (1u << 30)) {
    return InvalidArgument("read chunk must be a multiple of 4096 bytes, at most 1 GiB");
  }
  Ring probe;
  if (int rc = probe.Init(2); rc < 0) return Unsupported("io_uring unavailable: " + ErrnoError("", -rc).message());
  return std::unique_ptr<UringReader>(new UringReader(options));
}

std::string UringReader::Describe() const {
  return "io_uring " + std::to_string(options_.threads) + " x qd " + std::to_string(options_.queue_depth);
}

Status UringReader::ReadAll(const std::vector<SourceFile>& files, const std::vector<ReadOp>& ops,
                            const std::function<void(size_t)>& on_done, const std::function<void()>& tick) {
  for (const ReadOp& op : ops) {
    if (op.length > options_.chunk_bytes || op.file >= files.size()) return InvalidArgument("read op out of bounds");
  }
  std::atomic<size_t> next{0};
  const int threads = static_cast<int>(std::min<size_t>(options_.threads, std::max<size_t>(ops.size(), 1)));
  const int depth = options_.queue_depth;
  return RunWorkers(
      threads,
      [&](int, const std::atomic<bool>& stop) -> Status {
        Worker worker(options_, files, ops, next, depth);
        if (int rc = worker.Init(static_cast<unsigned>(depth)); rc < 0) return ErrnoError("io_uring_queue_init", -rc);
        for (;;) {
          worker.Fill(stop);
          if (worker.inflight() == 0) break;
          // Nothing completes and nothing can be waited for; the ring is torn down.
          if (!worker.SubmitAndReap(on_done)) return worker.error();
        }
        return worker.error();
      },
      tick);
}

}  // namespace ckpt::loader

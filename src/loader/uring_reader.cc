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
        std::vector<Slot> slots(depth);  // declared first: outlives the ring that reads into it
        Ring ring;
        if (int rc = ring.Init(static_cast<unsigned>(depth)); rc < 0) return ErrnoError("io_uring_queue_init", -rc);
        std::vector<int> free_slots;
        for (int s = depth - 1; s >= 0; --s) free_slots.push_back(s);
        Status error;
        int inflight = 0;
        for (;;) {
          // Fill the ring.
          while (error.ok() && !stop.load(std::memory_order_relaxed) && !free_slots.empty()) {
            if (options_.cancel && options_.cancel->load()) {
              error = FailedPrecondition("load cancelled");
              break;
            }
            const size_t i = next.fetch_add(1);
            if (i >= ops.size()) break;
            const ReadOp& op = ops[i];
            const SourceFile& file = files[op.file];
            const int s = free_slots.back();
            Slot& slot = slots[s];
            slot.op = i;
            const ReadCover cover = CoverOf(op, file);
            std::byte* buf = op.dst;
            int fd = op.mode == ReadMode::kBuffered ? file.buffered_fd() : file.direct.get();
            if (op.mode == ReadMode::kBounce) {
              if (!slot.bounce.Reserve(BounceBytes(options_.chunk_bytes), kMaxDirectAlignment)) {
                error = ResourceExhausted("no memory for a read buffer");
                break;
              }
              buf = slot.bounce.data();
            }
            io_uring_sqe* sqe = io_uring_get_sqe(ring.get());
            if (sqe == nullptr) {  // cannot happen: at most `depth` reads are queued
              error = Internal("io_uring submission queue full");
              break;
            }
            io_uring_prep_read(sqe, fd, buf, static_cast<unsigned>(cover.length), cover.offset);
            io_uring_sqe_set_data(sqe, reinterpret_cast<void*>(static_cast<uintptr_t>(s)));
            free_slots.pop_back();
            ++inflight;
          }
          if (inflight == 0) break;
          int rc = io_uring_submit_and_wait(ring.get(), 1);
          if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            // The ring itself failed; reads already queued may still complete, so wait for them.
            if (error.ok()) error = ErrnoError("io_uring_submit", -rc);
          }
          io_uring_cqe* cqe = nullptr;
          unsigned head, seen = 0;
          io_uring_for_each_cqe(ring.get(), head, cqe) {
            ++seen;
            const int s = static_cast<int>(reinterpret_cast<uintptr_t>(io_uring_cqe_get_data(cqe)));
            const int res = cqe->res;
            --inflight;
            free_slots.push_back(s);
            if (!error.ok()) continue;  // draining after an error
            Slot& slot = slots[s];
            const ReadOp& op = ops[slot.op];
            if (res < 0 && res != -EINVAL && res != -EINTR && res != -EAGAIN) {
              error = ErrnoError("read of " + files[op.file].path + " failed", -res);
              continue;
            }
            // Short reads, EINVAL (O_DIRECT refused) and the bounce copy finish here.
            Status st = FinishRead(op, files[op.file], slot.bounce.data(), res > 0 ? static_cast<uint64_t>(res) : 0);
            if (!st.ok()) {
              error = st;
              continue;
            }
            on_done(slot.op);
          }
          io_uring_cq_advance(ring.get(), seen);
          if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && seen == 0 && inflight > 0) {
            return error;  // nothing completes and nothing can be waited for; the ring is torn down
          }
        }
        return error;
      },
      tick);
}

}  // namespace ckpt::loader

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <system_error>
#include <thread>

#include "ckpt/client.h"
#include "common/unique_fd.h"
#include "protocol/daemon_connection.h"
#include "protocol/messages.h"
#include "shm/segment_name.h"
#include "shm/segment_reader.h"

namespace ckpt {

// Keeps the attachment's lease: watches the connection and, when the daemon went away,
// reconnects every 0.5 s and attaches to the same segment again (name, generation and
// segment id: the content this process mapped). Gives up (keeping the mapping) if the new
// daemon no longer has that segment as the current generation.
class Checkpoint::LeaseKeeper {
 public:
  LeaseKeeper(std::string socket_path, std::string name, uint64_t generation, std::string segment_id,
              std::unique_ptr<protocol::DaemonConnection> lease)
      : socket_path_(std::move(socket_path)), name_(std::move(name)), generation_(generation),
        segment_id_(std::move(segment_id)), lease_(std::move(lease)), owner_pid_(::getpid()) {}
  // Starts the watching thread. IoError without an eventfd; ResourceExhausted if the
  // thread cannot be started (std::thread throws std::system_error).
  Status Start() {
    stop_.reset(::eventfd(0, EFD_CLOEXEC));
    if (!stop_.valid()) return ErrnoError("eventfd for the lease keeper", errno);
    try {
      thread_ = std::make_unique<std::thread>([this] { Run(); });
    } catch (const std::system_error& e) {
      return ResourceExhausted(std::string("cannot start the lease keeper thread: ") + e.what());
    }
    return Status::Ok();
  }
  ~LeaseKeeper() {
    if (!thread_) return;
    if (::getpid() != owner_pid_) {
      // A forked child: the thread exists only in the parent, and the eventfd is shared
      // with it. Leave both alone (the std::thread object is leaked on purpose).
      (void)thread_.release();
      (void)stop_.release();
      (void)lease_.release();
      return;
    }
    uint64_t one = 1;
    (void)!::write(stop_.get(), &one, sizeof(one));
    thread_->join();
  }

 private:
  // Waits up to `timeout_ms` for the stop signal; true if it came.
  bool Stopped(int timeout_ms) {
    pollfd p{stop_.get(), POLLIN, 0};
    return ::poll(&p, 1, timeout_ms) > 0;
  }

  void Run() {
    for (;;) {
      pollfd fds[2] = {{lease_->native_handle(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) continue;
      if (fds[1].revents != 0) return;
      if (fds[0].revents == 0) continue;
      // The daemon closed the lease (it died or restarted): register again.
      for (;;) {
        if (Stopped(500)) return;
        auto connection = protocol::DaemonConnection::Open(socket_path_);
        if (!connection.ok()) continue;
        UniqueFd unused;  // the descriptor of the segment, already mapped
        protocol::AttachRequest request;
        request.name = name_;
        request.generation = generation_;
        request.segment_id = segment_id_;
        auto r = (*connection)->Call(protocol::AttachRequest::kOp, protocol::Encode(request), nullptr, &unused);
        if (r.ok()) {
          lease_ = std::move(connection).value();
          break;
        }
        const StatusCode code = r.status().code();
        if (code != StatusCode::kUnavailable && code != StatusCode::kResourceExhausted) return;  // generation gone
      }
    }
  }

  std::string socket_path_, name_;
  uint64_t generation_;
  std::string segment_id_;  // hex, as the daemon names it
  std::unique_ptr<protocol::DaemonConnection> lease_;
  UniqueFd stop_;
  pid_t owner_pid_;
  std::unique_ptr<std::thread> thread_;
};

// The copy-on-write view: a MAP_PRIVATE, PROT_READ|PROT_WRITE mapping of the segment's
// read-only descriptor, made on first use. The kernel allows a private writable mapping of
// a descriptor opened read-only because writes never reach the file: the first write to a
// page copies it into anonymous memory of this process. It is made with MAP_NORESERVE
// (the copies are charged when written, not the whole size up front, so mapping a
// checkpoint larger than free memory works) except on hugetlbfs, where a private page
// needs a reservation made at mmap time (without it a write could SIGBUS when the pool
// is empty; with it the mmap fails cleanly instead).
class Checkpoint::PrivateView {
 public:
  PrivateView(UniqueFd fd, uint64_t size, std::string name) : fd_(std::move(fd)), size_(size), name_(std::move(name)) {}
  ~PrivateView() {
    if (std::byte* p = base_.load(); p != nullptr) ::munmap(p, size_);
  }
  PrivateView(const PrivateView&) = delete;
  PrivateView& operator=(const PrivateView&) = delete;

  // The mapping's base, made on the first call (later calls after a failure try again).
  Result<std::byte*> Base() {
    if (std::byte* p = base_.load(std::memory_order_acquire); p != nullptr) return p;
    std::lock_guard<std::mutex> lock(mu_);
    if (std::byte* p = base_.load(std::memory_order_relaxed); p != nullptr) return p;
    if (!fd_.valid()) return FailedPrecondition("checkpoint '" + name_ + "' has no descriptor for a private view");
    struct stat st;
    if (::fstat(fd_.get(), &st) != 0) return ErrnoError("fstat of checkpoint '" + name_ + "'", errno);
    if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) != size_) {
      return Corrupt("checkpoint '" + name_ + "' changed size since it was attached");
    }
    constexpr long kHugetlbfsMagic = 0x958458f6;
    struct statfs fs;
    const bool hugetlbfs = ::fstatfs(fd_.get(), &fs) == 0 && static_cast<long>(fs.f_type) == kHugetlbfsMagic;
    const int flags = MAP_PRIVATE | (hugetlbfs ? 0 : MAP_NORESERVE);
    void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, flags, fd_.get(), 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      return ErrnoError("copy-on-write mapping of checkpoint '" + name_ + "' (" + std::to_string(size_) + " bytes" +
                            (hugetlbfs ? ", hugetlbfs: needs that many free huge pages to reserve" : "") + ")",
                        err);
    }
    fd_.reset();  // the mapping holds the object from now on
    base_.store(static_cast<std::byte*>(p), std::memory_order_release);
    return static_cast<std::byte*>(p);
  }

  // The anonymous (copied-on-write) bytes of the mapping; 0 if it is not made yet.
  Result<uint64_t> AnonymousBytes() const {
    const std::byte* base = base_.load(std::memory_order_acquire);
    if (base == nullptr) return uint64_t{0};
    const uintptr_t lo = reinterpret_cast<uintptr_t>(base), hi = lo + size_;
    std::ifstream smaps("/proc/self/smaps");
    if (!smaps) return ErrnoError("open /proc/self/smaps", errno);
    uint64_t total = 0;
    bool inside = false;
    std::string line;
    while (std::getline(smaps, line)) {
      uintptr_t a = 0, b = 0;
      char perms[8] = {};
      // A mapping's header: "start-end perms offset dev inode path".
      if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " %7s", &a, &b, perms) == 3) {
        inside = a >= lo && b <= hi;  // the kernel may split the mapping into several
        continue;
      }
      uint64_t kb = 0;
      if (inside && std::sscanf(line.c_str(), "Anonymous: %" SCNu64 " kB", &kb) == 1) total += kb * 1024;
    }
    return total;
  }

 private:
  std::mutex mu_;
  UniqueFd fd_;
  const uint64_t size_;
  const std::string name_;
  std::atomic<std::byte*> base_{nullptr};
};

Checkpoint::Checkpoint(std::string name, std::string socket_path, std::unique_ptr<protocol::DaemonConnection> lease,
                       std::unique_ptr<shm::SegmentReader> segment, int segment_fd)
    : name_(std::move(name)), segment_(std::move(segment)) {
  private_ = std::make_unique<PrivateView>(UniqueFd(segment_fd), segment_->segment_bytes(), name_);
  keeper_ = std::make_unique<LeaseKeeper>(std::move(socket_path), name_, segment_->generation(),
                                          shm::SegmentIdHex(segment_->segment_id()), std::move(lease));
}

Status Checkpoint::StartLeaseKeeper() { return keeper_->Start(); }

// Unmaps first, then closes the lease, so the daemon never sees a detach while mapped.
Checkpoint::~Checkpoint() {
  private_.reset();
  segment_.reset();
  keeper_.reset();
}

const std::string& Checkpoint::name() const { return name_; }
uint64_t Checkpoint::generation() const { return segment_->generation(); }
uint32_t Checkpoint::owner_uid() const {
  const auto& h = segment_->header();
  return (h.owner_flags & shm::kOwnerRecorded) != 0 ? h.owner_uid : kUnknownOwnerUid;
}
bool Checkpoint::owner_admin() const {
  const auto& h = segment_->header();
  return (h.owner_flags & shm::kOwnerRecorded) == 0 || (h.owner_flags & shm::kOwnerAdmin) != 0;
}
uint64_t Checkpoint::mapped_bytes() const { return segment_->segment_bytes(); }
const std::vector<TensorInfo>& Checkpoint::tensors() const { return segment_->tensors(); }

Result<TensorView> Checkpoint::Tensor(const std::string& name) const {
  int64_t i = segment_->Find(name);
  if (i < 0) return NotFound("checkpoint '" + name_ + "' has no tensor '" + name + "'");
  return TensorView{&segment_->tensors()[i], segment_->tensor_data(i)};
}

Result<const std::byte*> Checkpoint::TensorData(const std::string& name) const {
  CKPT_ASSIGN_OR_RETURN(TensorView view, Tensor(name));
  return view.data;
}

Result<std::byte*> Checkpoint::PrivateTensorData(const std::string& name) const {
  CKPT_ASSIGN_OR_RETURN(TensorView view, Tensor(name));
  CKPT_ASSIGN_OR_RETURN(std::byte* base, private_->Base());
  // Same offset in both mappings of the one object.
  return base + (view.data - reinterpret_cast<const std::byte*>(&segment_->header()));
}

Result<uint64_t> Checkpoint::PrivateBytes() const { return private_->AnonymousBytes(); }

Result<ShardLayout> Checkpoint::PlanShard(const std::string& name, const ShardSpec& spec) const {
  CKPT_ASSIGN_OR_RETURN(TensorView view, Tensor(name));
  auto layout = ckpt::PlanShard(view.info->dtype, view.info->shape, spec);
  if (!layout.ok()) return layout.status().WithContext("tensor '" + name + "'");
  return layout;
}

Status Checkpoint::CopyShard(const std::string& name, const ShardSpec& spec, void* dst,
                             size_t dst_size) const {
  CKPT_ASSIGN_OR_RETURN(TensorView view, Tensor(name));
  CKPT_ASSIGN_OR_RETURN(ShardLayout layout, PlanShard(name, spec));
  return GatherShard(layout, view.data, dst, dst_size);
}

Status Checkpoint::Verify() const { return segment_->VerifyChecksums(); }

Result<std::string_view> Checkpoint::SideFile(const std::string& name) const {
  auto bytes = segment_->SideFile(name);
  if (!bytes.ok()) return NotFound("checkpoint '" + name_ + "' has no side file '" + name + "'");
  return bytes;
}

std::vector<std::string> Checkpoint::side_files() const { return segment_->side_file_names(); }

const std::map<std::string, std::string>& Checkpoint::metadata() const { return segment_->metadata(); }

}  // namespace ckpt

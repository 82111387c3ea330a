// NcclGroup over NCCL: communicators created nonblocking (so joining can time out), every
// wait polled against the group's deadline, ncclCommAbort on expiry or a peer's error.
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "cuda/cuda_resources.h"
#include "cuda/nccl_group.h"

namespace ckpt {
namespace {

using Clock = std::chrono::steady_clock;
using cuda::CudaError;

bool Pending(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

std::string NcclText(ncclResult_t r) { return std::string(ncclGetErrorString(r)) + " (" + std::to_string(r) + ")"; }

class NcclGroupImpl final : public cuda::NcclGroupOps {
 public:
  NcclGroupImpl(ncclComm_t comm, bool owned, int rank, int size, int device, double timeout_s)
      : comm_(comm), owned_(owned), rank_(rank), size_(size), device_(device), timeout_s_(timeout_s) {}

  ~NcclGroupImpl() override {
    if (!comm_ || !owned_) return;
    cuda::CurrentDeviceGuard keep;
    cudaSetDevice(device_);
    stream_.Reset();
    // Finalize flushes outstanding work; it is bounded like everything else.
    if (Pending(ncclCommFinalize(comm_)) && Wait("finalizing the communicator").ok()) {
      ncclCommDestroy(comm_);
    } else if (comm_) {
      ncclCommAbort(comm_);
    }
  }

  // Polls until the communicator's pending operation (init, a nonblocking call, finalize)
  // is done and, with a `stream`, the work queued on it too; a peer's error or the
  // deadline ends the wait (and aborts the communicator).
  Status Wait(const std::string& what, cudaStream_t stream = nullptr) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) state = r;
      if (state != ncclSuccess && state != ncclInProgress) return Fail(what, state);
      if (state == ncclSuccess) {
        if (!stream) return Status::Ok();
        cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaSuccess) return Status::Ok();
        if (e != cudaErrorNotReady) {
          Abort();
          return CudaError(what, e);
        }
      }
      if (Clock::now() > deadline) return TimedOut(what);
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return device_; }
  bool broken() const override { return comm_ == nullptr; }

  // Once the group is usable, any failure (local ones too: this rank may have dropped out
  // of a collective the others are in) breaks the group, so that no later call is paired
  // with a stale one of another rank.
  Result<std::vector<std::string>> AllGatherBytes(const std::string& mine) override {
    CKPT_RETURN_IF_ERROR(Usable());
    auto gathered = DoAllGatherBytes(mine);
    if (!gathered.ok()) Abort();
    return gathered;
  }

  Status Exchange(const std::vector<collective::Transfer>& transfers, std::byte* base) override {
    CKPT_RETURN_IF_ERROR(Usable());
    Status done = DoExchange(transfers, base);
    if (!done.ok()) Abort();
    return done;
  }

  // Joins as `rank` of `size` through `id`; bounded by timeout_s.
  static Result<std::unique_ptr<NcclGroup>> Init(const ncclUniqueId& id, int rank, int size, int device,
                                                 double timeout_s) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
    if (!Pending(r)) {
      if (comm) ncclCommAbort(comm);
      return Unavailable("NCCL group of " + std::to_string(size) + " ranks: rank " + std::to_string(rank) +
                         " could not join: " + NcclText(r));
    }
    auto group = std::make_unique<NcclGroupImpl>(comm, true, rank, size, device, timeout_s);
    Status joined = group->Wait("waiting for the group's " + std::to_string(size) + " ranks to join");
    if (!joined.ok()) return joined;
    CKPT_RETURN_IF_ERROR(group->Connect());
    return std::unique_ptr<NcclGroup>(std::move(group));
  }

 private:
  Result<std::vector<std::string>> DoAllGatherBytes(const std::string& mine) {
    cuda::CurrentDeviceGuard keep;
    CKPT_CUDA_RETURN("cudaSetDevice", cudaSetDevice(device_));
    CKPT_RETURN_IF_ERROR(EnsureStream());
    // Round 1: lengths. Round 2: the bytes, each rank's padded to the longest.
    uint64_t len = mine.size();
    CKPT_ASSIGN_OR_RETURN(std::string lens, AllGatherFixed(std::string(reinterpret_cast<const char*>(&len), 8)));
    uint64_t longest = 0;
    std::vector<uint64_t> sizes(size_);
    for (int r = 0; r < size_; ++r) {
      std::memcpy(&sizes[r], lens.data() + 8 * r, 8);
      longest = std::max(longest, sizes[r]);
    }
    std::string padded = mine;
    padded.resize(std::max<uint64_t>(longest, 1), '\0');
    CKPT_ASSIGN_OR_RETURN(std::string all, AllGatherFixed(padded));
    std::vector<std::string> out(size_);
    for (int r = 0; r < size_; ++r) out[r] = all.substr(r * padded.size(), sizes[r]);
    return out;
  }

  // NCCL connects ranks lazily, at their first collective and first send/receive between
  // a pair (0.15-0.2 s on 2 H200s): done here once, so that loads don't pay it.
  Status Connect() {
    CKPT_RETURN_IF_ERROR(AllGatherBytes("").status());
    CKPT_ASSIGN_OR_RETURN(cuda::DeviceBuffer buf, cuda::DeviceBuffer::Allocate(2 * size_));
    std::vector<collective::Transfer> all_pairs;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      all_pairs.push_back({peer, true, static_cast<uint64_t>(peer), 1});
      all_pairs.push_back({peer, false, static_cast<uint64_t>(size_ + peer), 1});
    }
    return Exchange(all_pairs, static_cast<std::byte*>(buf.get()));
  }

  Status DoExchange(const std::vector<collective::Transfer>& transfers, std::byte* base) {
    cuda::CurrentDeviceGuard keep;
    CKPT_CUDA_RETURN("cudaSetDevice", cudaSetDevice(device_));
    CKPT_RETURN_IF_ERROR(EnsureStream());
    if (transfers.empty()) return Status::Ok();
    ncclResult_t r = ncclGroupStart();
    for (const collective::Transfer& t : transfers) {
      if (!Pending(r)) break;
      r = t.send ? ncclSend(base + t.offset, t.bytes, ncclUint8, t.peer, comm_, stream_.get())
                 : ncclRecv(base + t.offset, t.bytes, ncclUint8, t.peer, comm_, stream_.get());
    }
    ncclResult_t end = ncclGroupEnd();
    if (!Pending(r)) return Fail("queueing the transfers", r);
    if (!Pending(end)) return Fail("queueing the transfers", end);
    return Wait("transfers between the ranks", stream_.get());
  }

  Status Usable() const {
    if (!comm_) return FailedPrecondition("the NCCL group is broken (a rank failed or timed out earlier)");
    return Status::Ok();
  }

  Status EnsureStream() {
    if (stream_.get()) return Status::Ok();
    CKPT_ASSIGN_OR_RETURN(stream_, cuda::Stream::Create());
    return Status::Ok();
  }

  // In-place all-gather of equal-length blocks through device memory.
  Result<std::string> AllGatherFixed(const std::string& mine) {
    const size_t n = mine.size();
    CKPT_ASSIGN_OR_RETURN(cuda::DeviceBuffer buf, cuda::DeviceBuffer::Allocate(n * size_));
    auto* dev = static_cast<char*>(buf.get());
    CKPT_CUDA_RETURN("copying to the device",
                     cudaMemcpyAsync(dev + n * rank_, mine.data(), n, cudaMemcpyHostToDevice, stream_.get()));
    ncclResult_t r = ncclAllGather(dev + n * rank_, dev, n, ncclUint8, comm_, stream_.get());
    if (!Pending(r)) return Fail("all-gather", r);
    CKPT_RETURN_IF_ERROR(Wait("exchanging what each rank needs", stream_.get()));
    std::string all(n * size_, '\0');
    CKPT_CUDA_RETURN("copying from the device", cudaMemcpy(all.data(), dev, all.size(), cudaMemcpyDeviceToHost));
    return all;
  }

  Status Fail(const std::string& what, ncclResult_t r) {
    std::string detail = comm_ ? ncclGetLastError(comm_) : "";
    Abort();
    return Unavailable("NCCL group of " + std::to_string(size_) + " ranks, rank " + std::to_string(rank_) + ": " + what +
                       " failed: " + NcclText(r) + (detail.empty() ? "" : ": " + detail) +
                       " (another rank failed or died?)");
  }

  Status TimedOut(const std::string& what) {
    Abort();
    return DeadlineExceeded("NCCL group of " + std::to_string(size_) + " ranks, rank " + std::to_string(rank_) + ": " +
                            what + " took more than " + std::to_string(timeout_s_) +
                            " s: a rank died, never came, or is stuck; the group is aborted");
  }

  // Aborts the communicator (kernels waiting on peers exit), then drops the stream.
  void Abort() {
    if (!comm_) return;
    ncclCommAbort(comm_);
    comm_ = nullptr;
    stream_.Reset();
  }

  ncclComm_t comm_;
  bool owned_;
  int rank_, size_, device_;
  double timeout_s_;
  cuda::Stream stream_;
};

}  // namespace

namespace cuda {

Status NcclCheckMembership(int rank, int size, int device, const NcclGroupOptions& options) {
  if (size < 1 || rank < 0 || rank >= size)
    return InvalidArgument("rank " + std::to_string(rank) + " out of range for a group of " + std::to_string(size));
  if (!(options.timeout_s > 0) || options.timeout_s > 86400)
    return InvalidArgument("timeout_s must be in (0, 86400], not " + std::to_string(options.timeout_s));
  CKPT_RETURN_IF_ERROR(cuda::CheckDevice(device));
  return Status::Ok();
}

Result<std::string> NcclNewUniqueId() {
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return Unavailable("ncclGetUniqueId failed: " + NcclText(r));
  return std::string(id.internal, sizeof(id.internal));
}

Result<std::unique_ptr<NcclGroup>> NcclCreate(const std::string& unique_id, int rank, int size, int device,
                                              const NcclGroupOptions& options) {
  CKPT_RETURN_IF_ERROR(NcclCheckMembership(rank, size, device, options));
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id.internal))
    return InvalidArgument("an NCCL unique id has " + std::to_string(sizeof(id.internal)) + " bytes, not " +
                           std::to_string(unique_id.size()));
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  cuda::CurrentDeviceGuard keep;
  CKPT_CUDA_RETURN("cudaSetDevice", cudaSetDevice(device));
  return NcclGroupImpl::Init(id, rank, size, device, options.timeout_s);
}

Result<std::unique_ptr<NcclGroup>> NcclBorrow(void* nccl_comm, int device, const NcclGroupOptions& options) {
  if (!nccl_comm) return InvalidArgument("no NCCL communicator");
  auto comm = static_cast<ncclComm_t>(nccl_comm);
  int rank = 0, size = 0, comm_device = -1;
  ncclResult_t r = ncclCommUserRank(comm, &rank);
  if (r == ncclSuccess) r = ncclCommCount(comm, &size);
  if (r == ncclSuccess) r = ncclCommCuDevice(comm, &comm_device);
  if (r != ncclSuccess) return InvalidArgument("not a usable NCCL communicator: " + NcclText(r));
  CKPT_RETURN_IF_ERROR(NcclCheckMembership(rank, size, device, options));
  if (comm_device != device)
    return InvalidArgument("the communicator is on CUDA device " + std::to_string(comm_device) + ", not " +
                           std::to_string(device));
  return std::unique_ptr<NcclGroup>(new NcclGroupImpl(comm, false, rank, size, device, options.timeout_s));
}

}  // namespace cuda
}  // namespace ckpt

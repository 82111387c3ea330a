#include "cuda/cuda_resources.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <cstdint>
#include <mutex>
#include <vector>

namespace ckpt::cuda {

Status CudaError(const std::string& what, cudaError_t err) {
  std::string msg = what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  if (err == cudaErrorMemoryAllocation) return ResourceExhausted(msg);
  if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice) return Unsupported(msg);
  if (err == cudaErrorInvalidDevice) return InvalidArgument(msg);
  return Internal(msg);
}

Result<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  cudaError_t err = cudaMalloc(&b.ptr_, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return CudaError("cudaMalloc of " + std::to_string(bytes) + " bytes (device has " +
                         std::to_string(free_b) + " of " + std::to_string(total_b) + " free)",
                     err);
  }
  b.size_ = bytes;
  return b;
}

namespace {

std::atomic<uint64_t> g_pinned_allocations{0};

}  // namespace

uint64_t PinnedBuffer::allocations() { return g_pinned_allocations.load(); }

Result<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes) {
  CKPT_ASSIGN_OR_RETURN(PinnedBuffer b, Reserve(bytes));
  CKPT_RETURN_IF_ERROR(b.Populate(0, b.mapped_ ? b.size_ : 0));
  CKPT_RETURN_IF_ERROR(b.Lock(0, b.mapped_ ? b.size_ : 0));
  return b;
}

Result<PinnedBuffer> PinnedBuffer::Reserve(size_t bytes) {
  PinnedBuffer b;
  if (bytes == 0) return b;
  constexpr size_t kHuge = size_t{2} << 20;
  if (bytes > (SIZE_MAX >> 1)) return ResourceExhausted("pinned buffer of " + std::to_string(bytes) + " bytes");
  const size_t size = (bytes + kHuge - 1) & ~(kHuge - 1);
  void* raw = mmap(nullptr, size + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw != MAP_FAILED) {
    // Trim to a 2 MiB-aligned range, so that every 2 MiB of it can be one huge page.
    const auto r = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t a = (r + kHuge - 1) & ~uintptr_t{kHuge - 1};
    if (a > r) munmap(raw, a - r);
    if (r + kHuge > a) munmap(reinterpret_cast<void*>(a + size), r + kHuge - a);
    madvise(reinterpret_cast<void*>(a), size, MADV_HUGEPAGE);  // advice: ignored where THP is off
    b.ptr_ = reinterpret_cast<void*>(a);
    b.size_ = size;
    b.mapped_ = true;
    b.mu_ = std::make_unique<std::mutex>();
    ++g_pinned_allocations;
    return b;
  }
  CKPT_CUDA_RETURN("cudaMallocHost", cudaMallocHost(&b.ptr_, bytes));
  b.size_ = bytes;
  ++g_pinned_allocations;
  return b;
}

Status PinnedBuffer::Populate(size_t offset, size_t bytes) {
  if (!mapped_ || bytes == 0) return Status::Ok();
  std::byte* p = get() + offset;
#ifdef MADV_POPULATE_WRITE
  // The kernel zeroes every page it hands out; cudaHostRegister would fault them in under
  // the driver's lock, one range after another. Without MADV_POPULATE_WRITE (older
  // kernels: EINVAL) the pages are left for cudaHostRegister.
  constexpr size_t kHuge = size_t{2} << 20;
  for (size_t b = 0; b < bytes;) {
    const size_t n = std::min(bytes - b, kHuge - (reinterpret_cast<uintptr_t>(p + b) & (kHuge - 1)));
    if (madvise(p + b, n, MADV_POPULATE_WRITE) != 0 && errno != EINVAL)
      return ResourceExhausted("faulting in " + std::to_string(bytes) + " bytes of bounce buffers: " + std::strerror(errno));
    b += n;
  }
#else
  (void)p;
#endif
  return Status::Ok();
}

Status PinnedBuffer::Lock(size_t offset, size_t bytes) {
  if (!mapped_ || bytes == 0) return Status::Ok();
  std::byte* p = get() + offset;
  cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return CudaError("cudaHostRegister of " + std::to_string(bytes) + " bytes of bounce buffers", err);
  }
  std::lock_guard<std::mutex> lock(*mu_);
  locked_.push_back(p);
  return Status::Ok();
}

void PinnedBuffer::Reset() {
  if (!ptr_) return;
  if (mapped_) {
    for (void* p : locked_) cudaHostUnregister(p);
    munmap(ptr_, size_);
  } else {
    cudaFreeHost(ptr_);
  }
  locked_.clear();
  ptr_ = nullptr;
  size_ = 0;
  mapped_ = false;
}

Result<Stream> Stream::Create() {
  Stream s;
  CKPT_CUDA_RETURN("cudaStreamCreate", cudaStreamCreateWithFlags(&s.s_, cudaStreamNonBlocking));
  return s;
}

Result<Event> Event::Create() {
  Event e;
  CKPT_CUDA_RETURN("cudaEventCreate", cudaEventCreateWithFlags(&e.e_, cudaEventDisableTiming));
  return e;
}

Result<HostRegistration> HostRegistration::Register(const void* ptr, size_t bytes) {
  HostRegistration r;
  void* p = const_cast<void*>(ptr);
  cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterReadOnly);
  if (err == cudaErrorHostMemoryAlreadyRegistered) {
    cudaGetLastError();
    return r;
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    return CudaError("cudaHostRegister of " + std::to_string(bytes) + " bytes", err);
  }
  r.ptr_ = p;
  return r;
}

CurrentDeviceGuard::CurrentDeviceGuard() {
  if (cudaGetDevice(&saved_) != cudaSuccess) {
    cudaGetLastError();
    saved_ = -1;
  }
}

CurrentDeviceGuard::~CurrentDeviceGuard() {
  if (saved_ >= 0) cudaSetDevice(saved_);
}

Status CheckDevice(int device) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return CudaError("no usable CUDA device", err);
  }
  if (device < 0 || device >= count)
    return InvalidArgument("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                           " present)");
  return Status::Ok();
}

}  // namespace ckpt::cuda

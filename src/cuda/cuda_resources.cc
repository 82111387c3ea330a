#include "cuda/cuda_resources.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <system_error>
#include <thread>
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

// Faults [p, p + bytes) in for writing with up to `threads` threads, each a share of whole
// `unit`s; false where the kernel refused (out of memory). Without MADV_POPULATE_WRITE
// (older kernels: EINVAL) the pages are left for cudaHostRegister to fault in.
// Every thread is started before any of them populates: a populate holds the process's
// mapping lock for reading while it faults its range in, and starting a thread maps its
// stack (the same lock, for writing), so threads started one after another while the
// earlier ones populate ran one at a time (the first worker of a loader was ready only
// 6-8 ms after its creation on the 1 x H200 host, docs/benchmarks.md).
bool Populate(std::byte* p, size_t bytes, size_t unit, int threads) {
#ifdef MADV_POPULATE_WRITE
  const size_t units = (bytes + unit - 1) / unit;
  const size_t n = std::max<size_t>(1, std::min<size_t>(units, static_cast<size_t>(std::max(1, threads))));
  const size_t per = (units + n - 1) / n * unit;
  std::atomic<bool> ok{true};
  // One `unit` per call: the lock is held for one unit at a time, so that the other
  // threads of the process (a Load planning, starting its workers) are not held up.
  auto part = [&](size_t k) {
    const size_t end = std::min(bytes, (k + 1) * per);
    for (size_t b = k * per; b < end && ok; b += unit) {
      if (madvise(p + b, std::min(unit, end - b), MADV_POPULATE_WRITE) != 0 && errno != EINVAL) ok = false;
    }
  };
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  std::vector<std::thread> pool;
  std::vector<size_t> mine;  // parts no thread could be started for: this one does them
  for (size_t k = 1; k < n; ++k) {
    try {
      pool.emplace_back([&, k] {
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return go; });
        }
        part(k);
      });
    } catch (const std::system_error&) {
      mine.push_back(k);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    go = true;
  }
  cv.notify_all();
  part(0);
  for (size_t k : mine) part(k);
  for (auto& t : pool) t.join();
  return ok;
#else
  (void)p, (void)bytes, (void)unit, (void)threads;
  return true;
#endif
}

std::atomic<uint64_t> g_pinned_allocations{0};

}  // namespace

uint64_t PinnedBuffer::allocations() { return g_pinned_allocations.load(); }

Result<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes, int populate_threads) {
  CKPT_ASSIGN_OR_RETURN(PinnedBuffer b, Map(bytes, populate_threads));
  if (b.mapped_) {
    if (Status st = b.Lock(0, b.size_); !st.ok()) {
      // Registration refused (e.g. the locked-memory limit): cudaMallocHost reports it.
      b.Reset();
      CKPT_CUDA_RETURN("cudaMallocHost", cudaMallocHost(&b.ptr_, bytes));
      b.size_ = bytes;
    }
  }
  return b;
}

Result<PinnedBuffer> PinnedBuffer::Map(size_t bytes, int populate_threads) {
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
    auto* p = reinterpret_cast<std::byte*>(a);
    madvise(p, size, MADV_HUGEPAGE);  // advice: ignored where THP is off
    // Fault the pages in first (huge pages where granted), in parallel: the kernel zeroes
    // every page it hands out. Out of memory: fall back to cudaMallocHost, which reports it.
    if (Populate(p, size, kHuge, populate_threads)) {
      b.ptr_ = p;
      b.size_ = size;
      b.mapped_ = true;
      ++g_pinned_allocations;
      return b;
    }
    munmap(p, size);
  }
  CKPT_CUDA_RETURN("cudaMallocHost", cudaMallocHost(&b.ptr_, bytes));
  b.size_ = bytes;
  ++g_pinned_allocations;
  return b;
}

Status PinnedBuffer::Lock(size_t offset, size_t bytes) {
  if (!mapped_ || bytes == 0) return Status::Ok();
  std::byte* p = get() + offset;
  cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return CudaError("cudaHostRegister of " + std::to_string(bytes) + " bytes of bounce buffers", err);
  }
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

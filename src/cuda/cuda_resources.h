// RAII owners of CUDA resources used by the copy engine: move-only, destructors never
// throw and ignore errors (a destructor has nobody to report to), safe when moved-from.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/status.h"

namespace ckpt::cuda {

// "what: cudaErrorName (description)" as Internal, or ResourceExhausted for OOM.
Status CudaError(const std::string& what, cudaError_t err);

#define CKPT_CUDA_RETURN(what, expr)                              \
  do {                                                            \
    cudaError_t ckpt_cuda_err_ = (expr);                          \
    if (ckpt_cuda_err_ != cudaSuccess) return ::ckpt::cuda::CudaError((what), ckpt_cuda_err_); \
  } while (0)

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Allocates `bytes` on the current device. ResourceExhausted on OOM.
  static Result<DeviceBuffer> Allocate(size_t bytes);
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) { Reset(); ptr_ = std::exchange(o.ptr_, nullptr); size_ = std::exchange(o.size_, 0); }
    return *this;
  }
  void* get() const { return ptr_; }
  size_t size() const { return size_; }
  void* release() { size_ = 0; return std::exchange(ptr_, nullptr); }
  void Reset() { if (ptr_) cudaFree(ptr_); ptr_ = nullptr; size_ = 0; }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

// Page-locked host memory: anonymous memory, 2 MiB-aligned with transparent huge pages
// asked for, faulted in and registered part by part (2-3x faster than cudaMallocHost,
// which pins 4 KiB pages: 256 MiB in 0.05-0.07 s against 0.09-0.16 s on an H200 host);
// where mapping fails, cudaMallocHost, page-locked whole.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  // Reserve + Populate + Lock of the whole. ResourceExhausted / Internal from the kernel
  // or driver.
  static Result<PinnedBuffer> Allocate(size_t bytes);
  // Maps at least `bytes` (whole 2 MiB pages), nothing faulted in or page-locked yet, so
  // that parts can be prepared one by one, each on its own thread, and used as each is;
  // where mapping fails, falls back to cudaMallocHost (page-locked whole: Populate and
  // Lock have nothing to do). ResourceExhausted / Internal from the driver.
  static Result<PinnedBuffer> Reserve(size_t bytes);
  // Faults [get() + offset, get() + offset + bytes) in (one 2 MiB page per call, so that
  // the process's mapping lock is held briefly); no driver call. Thread-safe.
  // ResourceExhausted where the kernel has no memory for it.
  Status Populate(size_t offset, size_t bytes);
  // Page-locks [get() + offset, get() + offset + bytes) for every device. Thread-safe for
  // disjoint ranges. Precondition: the range is inside the buffer, starts and ends on
  // 4 KiB pages and overlaps no range locked before. Errors: the driver's.
  Status Lock(size_t offset, size_t bytes);
  ~PinnedBuffer() { Reset(); }
  PinnedBuffer(PinnedBuffer&& o) noexcept { *this = std::move(o); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = std::exchange(o.size_, 0);
      mapped_ = std::exchange(o.mapped_, false);
      locked_ = std::move(o.locked_);
      o.locked_.clear();
      mu_ = std::move(o.mu_);
    }
    return *this;
  }
  std::byte* get() const { return static_cast<std::byte*>(ptr_); }
  // At least the bytes asked for (whole 2 MiB pages on the mapped path).
  size_t size() const { return size_; }
  // Unregisters every locked range and unmaps. Precondition: no Populate or Lock in progress.
  void Reset();
  // How many Allocate / Reserve calls of this process succeeded (tests count them).
  static uint64_t allocations();

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;        // mmap + cudaHostRegister of parts (else cudaMallocHost)
  std::vector<void*> locked_;  // mapped_: the starts of the ranges registered; guarded by *mu_
  std::unique_ptr<std::mutex> mu_;
};

class Stream {
 public:
  Stream() = default;
  static Result<Stream> Create();
  ~Stream() { Reset(); }
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    if (this != &o) { Reset(); s_ = std::exchange(o.s_, nullptr); }
    return *this;
  }
  cudaStream_t get() const { return s_; }
  void Reset() { if (s_) { cudaStreamSynchronize(s_); cudaStreamDestroy(s_); } s_ = nullptr; }

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  Event() = default;
  static Result<Event> Create();
  ~Event() { Reset(); }
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event& operator=(Event&& o) noexcept {
    if (this != &o) { Reset(); e_ = std::exchange(o.e_, nullptr); }
    return *this;
  }
  cudaEvent_t get() const { return e_; }
  void Reset() { if (e_) cudaEventDestroy(e_); e_ = nullptr; }

 private:
  cudaEvent_t e_ = nullptr;
};

// A page-aligned host range registered with cudaHostRegister (read-only where supported).
// Unregisters on destruction unless the range was already registered by someone else.
class HostRegistration {
 public:
  HostRegistration() = default;
  // Registers [ptr, ptr + bytes). AlreadyRegistered ranges give an owner that does not
  // unregister. Errors: Internal/Unsupported from the driver.
  static Result<HostRegistration> Register(const void* ptr, size_t bytes);
  ~HostRegistration() { Reset(); }
  HostRegistration(HostRegistration&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)) {}
  HostRegistration& operator=(HostRegistration&& o) noexcept {
    if (this != &o) { Reset(); ptr_ = std::exchange(o.ptr_, nullptr); }
    return *this;
  }
  void Reset() { if (ptr_) cudaHostUnregister(ptr_); ptr_ = nullptr; }

 private:
  void* ptr_ = nullptr;
};

// OK if CUDA device `device` exists; Unsupported without a usable driver, InvalidArgument
// naming the count otherwise.
Status CheckDevice(int device);

// Restores the calling thread's current CUDA device when it goes out of scope, so a loader
// never changes the device its caller (e.g. PyTorch) had selected.
class CurrentDeviceGuard {
 public:
  CurrentDeviceGuard();
  ~CurrentDeviceGuard();
  CurrentDeviceGuard(const CurrentDeviceGuard&) = delete;
  CurrentDeviceGuard& operator=(const CurrentDeviceGuard&) = delete;

 private:
  int saved_ = -1;
};

}  // namespace ckpt::cuda

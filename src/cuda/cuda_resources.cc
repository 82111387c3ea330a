#include "cuda/cuda_resources.h"

#include <sys/mman.h>

#include <cerrno>

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

Result<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes) {
  PinnedBuffer b;
  if (bytes == 0) return b;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p != MAP_FAILED) {
    madvise(p, bytes, MADV_HUGEPAGE);  // advice: ignored where THP is off
    // Fault the pages in first (huge pages where granted); where the kernel lacks
    // MADV_POPULATE_WRITE, cudaHostRegister faults them in itself. Out of memory: fall
    // back to cudaMallocHost, which reports it.
    bool populated = true;
#ifdef MADV_POPULATE_WRITE
    populated = madvise(p, bytes, MADV_POPULATE_WRITE) == 0 || errno == EINVAL;
#endif
    if (populated && cudaHostRegister(p, bytes, cudaHostRegisterPortable) == cudaSuccess) {
      b.ptr_ = p;
      b.size_ = bytes;
      b.mapped_ = true;
      return b;
    }
    cudaGetLastError();
    munmap(p, bytes);
  }
  CKPT_CUDA_RETURN("cudaMallocHost", cudaMallocHost(&b.ptr_, bytes));
  b.size_ = bytes;
  return b;
}

void PinnedBuffer::Reset() {
  if (!ptr_) return;
  if (mapped_) {
    cudaHostUnregister(ptr_);
    munmap(ptr_, size_);
  } else {
    cudaFreeHost(ptr_);
  }
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

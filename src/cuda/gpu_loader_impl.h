// GpuLoaderImpl: the CUDA copy engine behind ckpt::GpuLoader. It reads tensors through a
// TensorSource, so it works on a Checkpoint (through the daemon) and on a bare
// shm::SegmentReader (tests and benchmarks without a daemon).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/gpu.h"

namespace ckpt {

// The tensors of a mapped checkpoint and where each one's bytes start (read-only host
// memory that stays mapped while the loader lives).
struct TensorSource {
  const std::vector<TensorInfo>* tensors = nullptr;
  std::function<const std::byte*(size_t index)> data;
};

class GpuLoaderImpl : public GpuLoader {
 public:
  // Errors as GpuLoader::Create.
  static Result<std::unique_ptr<GpuLoaderImpl>> Create(TensorSource source, int device,
                                                       const GpuLoadOptions& options);
  ~GpuLoaderImpl() override;
  Result<GpuStateDict> Load(const std::vector<ShardOutput>& outputs) override;

 private:
  GpuLoaderImpl(TensorSource source, int device, const GpuLoadOptions& options)
      : source_(std::move(source)), device_(device), options_(options) {}
  TensorSource source_;
  int device_;
  GpuLoadOptions options_;
};

}  // namespace ckpt

// GpuLoaderImpl: the CUDA copy engine behind ckpt::GpuLoader. It reads tensors through a
// TensorSource, so it works on a Checkpoint (through the daemon) and on a bare
// shm::SegmentReader (tests and benchmarks without a daemon).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/collective.h"
#include "ckpt/gpu.h"

namespace ckpt {
namespace cuda {
class DeviceBuffer;
class CopyResources;
struct CopyDestination;
}

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
  Result<GpuStateDict> LoadCollective(const std::vector<ShardOutput>& outputs, NcclGroup& group,
                                      const CollectiveOptions& options) override;

 private:
  // Every output's layout, its dtype and size on the device, and its pieces' tensor indices.
  struct Planned {
    std::vector<OutputLayout> layouts;
    std::vector<DType> dtypes;
    std::vector<uint64_t> bytes;
    std::vector<std::vector<size_t>> sources;
    // Per output: for a transposed one of 3 or more dims (one whole source tensor), each of
    // its matrices as a layout of its own, transposed by a job of its own; else empty.
    std::vector<std::vector<ShardLayout>> matrices;
  };
  Result<Planned> Plan(const std::vector<ShardOutput>& outputs) const;
  // Planned::matrices of one output (Unsupported for a batched transpose of pieces).
  static Result<std::vector<ShardLayout>> MatricesOf(const ShardOutput& out, const OutputLayout& layout);
  static Result<std::shared_ptr<cuda::DeviceBuffer>> AllocateArena(uint64_t bytes);
  // Copies outputs `which` from host memory to the destination's base + offsets[o]; fills
  // the copy stats. On error nothing is in flight any more.
  Status Copy(const std::vector<ShardOutput>& outputs, const Planned& planned, const std::vector<size_t>& which,
              const cuda::CopyDestination& dest, const std::vector<uint64_t>& offsets, GpuLoadStats* stats);
  // Fills `dict` with every output at base + offsets[o], owning `arena`.
  void Assemble(const std::vector<ShardOutput>& outputs, const Planned& planned,
                std::shared_ptr<cuda::DeviceBuffer> arena, const std::vector<uint64_t>& offsets,
                GpuStateDict* dict) const;

  GpuLoaderImpl(TensorSource source, int device, const GpuLoadOptions& options)
      : source_(std::move(source)), device_(device), options_(options) {}
  TensorSource source_;
  int device_;
  GpuLoadOptions options_;
  // The copy workers' streams and pinned buffers: prepared in the background from Create
  // on, reused by every Load, freed with the loader.
  std::shared_ptr<cuda::CopyResources> resources_;
};

}  // namespace ckpt

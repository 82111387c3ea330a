// Copying a rank's shards from an attached checkpoint straight into GPU memory.
//
//   auto plan = ckpt::TpPlan::BuiltIn("gpt-neo");
//   auto outs = plan->Resolve(ckpt->tensors(), rank, world);
//   auto loader = ckpt::GpuLoader::Create(ckpt, /*device=*/rank, {});
//   auto dict = (*loader)->Load(*outs, {});            // every shard on the GPU
//   const ckpt::GpuTensor& w = dict->at("transformer.h.0.attn.attention.q_proj.weight");
//
// The bytes go from the shared-memory mapping to the device with no host copy of whole
// tensors: by default (HostPath::kBounce, chosen by measurement, docs/benchmarks.md) 16
// threads gather the rank's rows into double-buffered 1 MiB pinned buffers pipelined
// with the DMA; kRegister registers only the pages the rank reads, in order, while
// earlier tensors are already being copied. Column slices are 2D copies; dtype
// conversion and transposes run on the GPU.
// This header is available in every build; without CUDA, Create returns Unsupported. The
// engine is a plugin, libckptclient-cuda.so.0, that libckptclient opens on the first GPU
// call (beside itself, or $CKPT_GPU_PLUGIN), through a versioned C interface
// (ckpt/gpu_plugin_abi.h): libckptclient links no CUDA library.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/status.h"
#include "ckpt/tensor.h"
#include "ckpt/tp_plan.h"

namespace ckpt {

class Checkpoint;
class NcclGroup;
struct CollectiveOptions;

// How host bytes reach the device.
enum class HostPath {
  kRegister,  // cudaHostRegister (read-only) of the pages read, then DMA from the mapping
  kBounce,    // memcpy threads fill small pinned bounce buffers, pipelined with DMA
              // (fastest measured: docs/benchmarks.md, "GPU load")
  kPageable,  // plain cudaMemcpy from the mapping (the driver stages it): a baseline
};
const char* HostPathName(HostPath path);

struct GpuLoadOptions {
  HostPath path = HostPath::kBounce;
  int streams = 12;                     // copy streams (= worker threads), in [1, 64]
  // Largest single copy, and the size of each bounce buffer (two per stream: 48 MiB of
  // pinned memory by default, made in the background when the loader is created and held
  // until it is destroyed); 0: 2 MiB on the bounce path (small buffers are faster: the
  // staged bytes are still in the CPU cache when the DMA reads them; below 2 MiB the
  // per-copy cost caps the link at ~86%), 16 MiB on the others. Else >= 64 KiB.
  uint64_t chunk_bytes = 0;
  int register_threads = 1;             // kRegister: threads calling cudaHostRegister
  uint64_t register_group_bytes = 64ull << 20;  // kRegister: largest single registration
  // dtype of every floating-point output; nullopt keeps each tensor's own. Allowed:
  // among F64, F32, F16, BF16. Integer and other tensors are never converted.
  std::optional<DType> float_dtype;
  // A finite value that becomes infinite in the conversion (e.g. fp32 1e6 -> fp16) is an
  // error (InvalidArgument naming the tensor) unless this is set.
  bool allow_overflow = false;
};

// One tensor in device memory, owned by the GpuStateDict that holds it.
struct GpuTensor {
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  void* data = nullptr;  // device pointer, 256-byte aligned
  uint64_t nbytes = 0;
};

// Timings of one Load, in seconds from its start.
struct GpuLoadStats {
  double setup_seconds = 0;     // before the first copy: planning (LoadCollective: and the ranks'
                                // exchange of descriptors), device memory, streams, pinned buffers
  double register_seconds = 0;  // time spent in cudaHostRegister (on its own thread)
  double total_seconds = 0;     // until every copy and kernel finished
  double unregister_seconds = 0;
  uint64_t registered_bytes = 0;
  uint64_t copied_bytes = 0;    // host bytes that crossed PCIe
  // LoadCollective only:
  bool collective = false;      // whether the ranks shared (see CollectiveOptions::Mode)
  uint64_t received_bytes = 0;  // device bytes received from other ranks
  uint64_t sent_bytes = 0;      // device bytes sent to other ranks
  double exchange_seconds = 0;  // time in NCCL transfers after this rank's own copies
};

// A rank's state dict on one device: owns one device allocation holding every tensor.
// Move-only; frees the device memory on destruction (errors ignored). Thread-compatible.
class GpuStateDict {
 public:
  GpuStateDict();
  ~GpuStateDict();
  GpuStateDict(GpuStateDict&&) noexcept;
  GpuStateDict& operator=(GpuStateDict&&) noexcept;

  int device() const { return device_; }
  const std::map<std::string, GpuTensor>& tensors() const { return tensors_; }
  // Precondition: contains(name).
  const GpuTensor& at(const std::string& name) const { return tensors_.at(name); }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const GpuLoadStats& stats() const { return stats_; }
  // Shared ownership of the device allocation, for adapters whose tensors outlive the dict.
  std::shared_ptr<void> allocation() const { return allocation_; }

 private:
  friend class GpuLoaderImpl;
  friend struct GpuStateDictBuilder;  // the host's side of the GPU plugin's C interface
  int device_ = -1;
  std::map<std::string, GpuTensor> tensors_;
  std::shared_ptr<void> allocation_;
  GpuLoadStats stats_;
};

// Copies shards of one checkpoint to one device. Thread-compatible: one Load at a time.
class GpuLoader {
 public:
  // `checkpoint` must outlive the loader and every Load in progress. The loader starts
  // making its copy workers' streams and pinned buffers (GpuLoadOptions::chunk_bytes) on
  // a background thread at once, and holds them for every Load until it is destroyed.
  // Errors: Unsupported (built without CUDA, the GPU plugin or the NVIDIA driver
  // libcuda.so.1 missing: the message names it; or no usable driver), FailedPrecondition
  // (a GPU plugin of another interface version, ckpt/gpu_plugin_abi.h: the message names
  // both; or a library that is no GPU plugin), InvalidArgument (no such device, bad options).
  static Result<std::unique_ptr<GpuLoader>> Create(const Checkpoint& checkpoint, int device,
                                                   const GpuLoadOptions& options);
  virtual ~GpuLoader();

  // Loads `outputs` (from TpPlan::Resolve) to the device. On any error (InvalidArgument
  // for a conversion refused or overflowing, ResourceExhausted for device OOM, Internal
  // for a CUDA failure) the device memory is freed and nothing is returned. Shared memory
  // is only read.
  virtual Result<GpuStateDict> Load(const std::vector<ShardOutput>& outputs) = 0;

  // Loads `outputs` together with the other ranks of `group` (include/ckpt/collective.h):
  // every rank of the group must call it, each with the outputs it needs, on the group's
  // device. Errors as Load, plus DeadlineExceeded / Unavailable when another rank fails,
  // dies or never comes (within the group's timeout; the group is then broken), and
  // FailedPrecondition for a broken group or one on another device. On any error no rank
  // returns a state dict.
  virtual Result<GpuStateDict> LoadCollective(const std::vector<ShardOutput>& outputs, NcclGroup& group,
                                              const CollectiveOptions& options) = 0;

 protected:
  GpuLoader() = default;
};

// True if this build has the CUDA copy engine, its plugin and the driver load, and a CUDA
// device is usable. The first call opens the plugin; thread-safe.
bool GpuAvailable();

}  // namespace ckpt

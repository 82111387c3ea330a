// The interface between libckptclient (and the Python module _ckpt) and its GPU plugin,
// libckptclient-cuda.so.0: the CUDA copy engine and the NCCL group, built from src/cuda.
// libckptclient itself links no CUDA or NCCL library; it dlopens the plugin on the first
// GPU call (client/gpu_plugin.h) and reaches the engine only through this table.
//
// The table passes C++ types (ckpt::Result, std::vector, std::function), so the plugin
// and its host must come from the same build: the host refuses a plugin whose abi,
// version or type sizes differ from its own (GpuPluginLayout).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ckpt/collective.h"
#include "ckpt/gpu.h"
#include "ckpt/status.h"
#include "cuda/gpu_loader_impl.h"  // TensorSource (declarations only: no CUDA header)

namespace ckpt {

// Bumped on any change to GpuPluginV1 or to the meaning of its entries.
inline constexpr uint32_t kGpuPluginAbi = 1;

// The soname the host looks for, beside itself and then on the library path.
inline constexpr const char kGpuPluginName[] = "libckptclient-cuda.so.0";
// The plugin's one exported symbol: `const GpuPluginV1* ckpt_gpu_plugin_v1(void)`.
inline constexpr const char kGpuPluginEntry[] = "ckpt_gpu_plugin_v1";

// Sizes of the types the table passes, compared by the host (a cheap guard against a
// plugin of another build whose version string happens to match).
struct GpuPluginLayout {
  uint32_t status = sizeof(Status);
  uint32_t load_options = sizeof(GpuLoadOptions);
  uint32_t tensor_source = sizeof(TensorSource);
  uint32_t shard_output = sizeof(ShardOutput);
  uint32_t state_dict = sizeof(GpuStateDict);
  uint32_t group_options = sizeof(NcclGroupOptions);
  bool operator==(const GpuPluginLayout& o) const {
    return status == o.status && load_options == o.load_options && tensor_source == o.tensor_source &&
           shard_output == o.shard_output && state_dict == o.state_dict && group_options == o.group_options;
  }
};

// What the plugin offers. Every function is thread-safe to call; each returns what the
// public function of the same name in include/ckpt/gpu.h or collective.h documents. The
// table and the code it points to live until the process exits (the plugin is never
// unloaded: state dicts hold deleters that run its code).
struct GpuPluginV1 {
  uint32_t abi = kGpuPluginAbi;
  const char* version = CKPT_VERSION;
  GpuPluginLayout layout;
  // Unsupported naming what is missing (the NVIDIA driver libcuda.so.1) when the copy
  // engine cannot run on this machine; Ok otherwise (a device may still be absent).
  Status (*check_driver)() = nullptr;
  bool (*gpu_available)() = nullptr;
  Result<std::unique_ptr<GpuLoader>> (*create_loader)(TensorSource source, int device,
                                                      const GpuLoadOptions& options) = nullptr;
  // The NCCL entries are null when the plugin was built without NCCL's header. Each
  // loads libnccl.so.2 first (gpu_plugin/nccl_loader.cc) and fails with Unsupported
  // naming it when it is missing or too old.
  Status (*nccl_check_membership)(int rank, int size, int device, const NcclGroupOptions& options) = nullptr;
  Result<std::string> (*nccl_new_unique_id)() = nullptr;
  Result<std::unique_ptr<NcclGroup>> (*nccl_create)(const std::string& unique_id, int rank, int size, int device,
                                                    const NcclGroupOptions& options) = nullptr;
  Result<std::unique_ptr<NcclGroup>> (*nccl_borrow)(void* nccl_comm, int device,
                                                    const NcclGroupOptions& options) = nullptr;
};

}  // namespace ckpt

extern "C" {
// The plugin's entry point: its table (static storage, never null).
const ckpt::GpuPluginV1* ckpt_gpu_plugin_v1(void);
}

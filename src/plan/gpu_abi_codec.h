// The plan's types in the GPU plugin's C interface (include/ckpt/gpu_plugin_abi.h), both
// ways: the host (src/client/gpu_plugin_api.cc) turns its C++ values into the C structs, the
// plugin (src/gpu_plugin/entry.cc) turns them back, each with the same code. Every FromC
// checks what it reads (null pointers with counts, enumerators, struct sizes), so a bad
// caller gets InvalidArgument, not a crash.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/collective.h"
#include "ckpt/gpu.h"
#include "ckpt/gpu_plugin_abi.h"
#include "ckpt/status.h"
#include "ckpt/tensor.h"
#include "ckpt/tp_plan.h"

namespace ckpt {

// Builds the host's GpuStateDict from the plugin's description (a friend of GpuStateDict).
struct GpuStateDictBuilder {
  // `allocation` owns the device memory (its deleter releases the plugin's handle).
  // InvalidArgument for a description with null arrays, a bad dtype or a repeated name.
  static Result<GpuStateDict> FromC(const ckpt_gpu_state_dict& dict, std::shared_ptr<void> allocation);
};

namespace gpu_abi {

// Writes `status`'s message into `error` (cut to fit, NUL-terminated) and returns its code.
int32_t ToC(const Status& status, ckpt_gpu_error* error);
// The Status of a code and message from the plugin; codes it does not know become Internal.
Status FromC(int32_t code, const char* message);

// C views of `outputs`: every pointer points into `outputs` or into this object, so both
// must outlive the call they are passed to.
struct COutputs {
  std::vector<ckpt_gpu_output> outputs;
  std::vector<ckpt_gpu_piece> pieces;
};
COutputs ToC(const std::vector<ShardOutput>& outputs);
Result<std::vector<ShardOutput>> FromC(const ckpt_gpu_output* outputs, uint64_t count);

// C views of `tensors` (pointing into it).
std::vector<ckpt_gpu_tensor_info> ToC(const std::vector<TensorInfo>& tensors);
Result<std::vector<TensorInfo>> FromC(const ckpt_gpu_tensor_info* tensors, uint64_t count);

ckpt_gpu_load_options ToC(const GpuLoadOptions& options);
Result<GpuLoadOptions> FromC(const ckpt_gpu_load_options* options);
ckpt_gpu_group_options ToC(const NcclGroupOptions& options);
Result<NcclGroupOptions> FromC(const ckpt_gpu_group_options* options);
ckpt_gpu_collective_options ToC(const CollectiveOptions& options);
Result<CollectiveOptions> FromC(const ckpt_gpu_collective_options* options);
ckpt_gpu_stats ToC(const GpuLoadStats& stats);
GpuLoadStats FromC(const ckpt_gpu_stats& stats);

// The plugin's description of `dict` (pointing into it and into `storage`), for a caller's
// `out`, whose struct_size must be at least sizeof(ckpt_gpu_state_dict) (else
// InvalidArgument and `out` untouched).
Status Describe(const GpuStateDict& dict, std::vector<ckpt_gpu_tensor>* storage, ckpt_gpu_state_dict* out);

}  // namespace gpu_abi
}  // namespace ckpt

// libtorch adapter: a rank's state dict as at::Tensors (libckpttorch, built when libtorch
// is found). This header is the one public ckpt header that shows a libtorch type.
//
//   std::shared_ptr<const ckpt::Checkpoint> model = std::move(*client->Attach("gpt-neo"));
//   auto outs = ckpt::TpPlan::BuiltIn("gpt-neo")->Resolve(model->tensors(), rank, world);
//   auto sd = ckpt::LoadStateDict(model, *outs, {.device = rank});   // on cuda:rank
#pragma once

#include <ATen/Tensor.h>

#include <memory>
#include <string>
#include <unordered_map>

#include "ckpt/client.h"
#include "ckpt/gpu.h"
#include "ckpt/tp_plan.h"

namespace ckpt {

struct TorchLoadOptions {
  // -1: CPU tensors. A shard that is one contiguous run of its tensor, with no fusion,
  // transpose or conversion, is a zero-copy view of shared memory, copy-on-write like
  // torch.load(mmap=True) (Checkpoint::PrivateTensorData): writing to it copies the pages
  // written into this process's memory and never changes the checkpoint; the others are
  // copied into new tensors.
  // >= 0: tensors on cuda:<device>, copied by the GpuLoader with `gpu`.
  int device = -1;
  GpuLoadOptions gpu;
};

// Returns one tensor per output. Every tensor keeps what it points into alive: CPU views
// hold `checkpoint` (the mapping), GPU tensors the device allocation. Errors: those of
// GpuLoader, Unsupported for a dtype this libtorch lacks (e.g. U16 before torch 2.3);
// libtorch exceptions are returned as Internal. Nothing is returned on error.
Result<std::unordered_map<std::string, at::Tensor>> LoadStateDict(
    std::shared_ptr<const Checkpoint> checkpoint, const std::vector<ShardOutput>& outputs,
    const TorchLoadOptions& options);

// The at::ScalarType of `dtype`, as an int (c10::ScalarType's value); Unsupported if none.
Result<int> TorchScalarType(DType dtype);

}  // namespace ckpt

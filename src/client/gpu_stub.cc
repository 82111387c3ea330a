// GpuLoader in builds without CUDA: everything reports Unsupported.
#include "ckpt/client.h"
#include "ckpt/gpu.h"

namespace ckpt {

bool GpuAvailable() { return false; }

Result<std::unique_ptr<GpuLoader>> GpuLoader::Create(const Checkpoint&, int, const GpuLoadOptions&) {
  return Unsupported("libckptclient was built without CUDA");
}

}  // namespace ckpt

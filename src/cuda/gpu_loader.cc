// GpuLoader::Create for an attached Checkpoint (CUDA builds).
#include "ckpt/client.h"
#include "ckpt/gpu.h"
#include "cuda/gpu_loader_impl.h"

namespace ckpt {

Result<std::unique_ptr<GpuLoader>> GpuLoader::Create(const Checkpoint& checkpoint, int device,
                                                     const GpuLoadOptions& options) {
  const Checkpoint* ckpt = &checkpoint;
  TensorSource source;
  source.tensors = &checkpoint.tensors();
  source.data = [ckpt](size_t i) -> const std::byte* {
    auto data = ckpt->TensorData(ckpt->tensors()[i].name);
    return data.ok() ? *data : nullptr;
  };
  auto impl = GpuLoaderImpl::Create(std::move(source), device, options);
  if (!impl.ok()) return impl.status();
  return std::unique_ptr<GpuLoader>(std::move(*impl));
}

}  // namespace ckpt

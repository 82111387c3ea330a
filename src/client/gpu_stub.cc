// GpuLoader in builds without CUDA: everything reports Unsupported.
#include "ckpt/client.h"
#include "ckpt/gpu.h"

namespace ckpt {

const char* HostPathName(HostPath path) {
  switch (path) {
    case HostPath::kRegister: return "register";
    case HostPath::kBounce: return "bounce";
    case HostPath::kPageable: return "pageable";
  }
  return "?";
}
GpuStateDict::GpuStateDict() = default;
GpuStateDict::~GpuStateDict() = default;
GpuStateDict::GpuStateDict(GpuStateDict&&) noexcept = default;
GpuStateDict& GpuStateDict::operator=(GpuStateDict&&) noexcept = default;
GpuLoader::~GpuLoader() = default;
bool GpuAvailable() { return false; }

Result<std::unique_ptr<GpuLoader>> GpuLoader::Create(const Checkpoint&, int, const GpuLoadOptions&) {
  return Unsupported("libckptclient was built without CUDA");
}

}  // namespace ckpt

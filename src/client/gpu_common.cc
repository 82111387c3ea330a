// The parts of include/ckpt/gpu.h that need no CUDA, built in every configuration.
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

}  // namespace ckpt

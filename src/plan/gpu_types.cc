// The parts of include/ckpt/gpu.h and collective.h that need no CUDA, built in every
// configuration, into libckptclient (and the Python module) and into the GPU plugin alike
// (both need the vtables of GpuLoader and NcclGroup).
#include "ckpt/collective.h"
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
NcclGroup::~NcclGroup() = default;

}  // namespace ckpt

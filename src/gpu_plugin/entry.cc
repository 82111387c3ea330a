// The GPU plugin's entry point (libckptclient-cuda.so.0): the table of client/gpu_plugin_abi.h
// over the CUDA copy engine (cuda/gpu_loader_impl.h) and the NCCL group (cuda/nccl_group.h).
#include <dlfcn.h>

#include <string>

#include "client/gpu_plugin_abi.h"
#ifdef CKPT_PLUGIN_NCCL
#include "gpu_plugin/nccl_loader.h"
#include "cuda/nccl_group.h"
#endif

namespace ckpt {
namespace {

// The CUDA runtime is linked statically into the plugin (no libcudart.so on the node);
// what it needs of the node is the driver, which it opens itself. Checked here first so
// that its absence reads as what it is.
Status OpenDriver() {
  dlerror();
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);  // never closed: the runtime uses it
  if (!driver) {
    const char* e = dlerror();
    return Unsupported(std::string("libcuda.so.1 (the NVIDIA driver) could not be loaded: ") + (e ? e : "?") +
                       ": the GPU copy engine needs an NVIDIA driver for CUDA 13 on the node (the CUDA runtime "
                       "is built into " + kGpuPluginName + "); CPU views, shards and partitions work without it");
  }
  return Status::Ok();
}

Status CheckDriver() {
  static const Status driver = OpenDriver();
  return driver;
}

Result<std::unique_ptr<GpuLoader>> CreateLoader(TensorSource source, int device, const GpuLoadOptions& options) {
  CKPT_RETURN_IF_ERROR(CheckDriver());
  auto impl = GpuLoaderImpl::Create(std::move(source), device, options);
  if (!impl.ok()) return impl.status();
  return std::unique_ptr<GpuLoader>(std::move(*impl));
}

bool Available() { return CheckDriver().ok() && GpuAvailable(); }

#ifdef CKPT_PLUGIN_NCCL
Status CheckMembership(int rank, int size, int device, const NcclGroupOptions& options) {
  CKPT_RETURN_IF_ERROR(cuda::LoadNccl());
  CKPT_RETURN_IF_ERROR(CheckDriver());
  return cuda::NcclCheckMembership(rank, size, device, options);
}
Result<std::string> NewUniqueId() {
  CKPT_RETURN_IF_ERROR(cuda::LoadNccl());
  return cuda::NcclNewUniqueId();
}
Result<std::unique_ptr<NcclGroup>> Create(const std::string& id, int rank, int size, int device,
                                          const NcclGroupOptions& options) {
  CKPT_RETURN_IF_ERROR(cuda::LoadNccl());
  CKPT_RETURN_IF_ERROR(CheckDriver());
  return cuda::NcclCreate(id, rank, size, device, options);
}
Result<std::unique_ptr<NcclGroup>> Borrow(void* comm, int device, const NcclGroupOptions& options) {
  CKPT_RETURN_IF_ERROR(cuda::LoadNccl());
  CKPT_RETURN_IF_ERROR(CheckDriver());
  return cuda::NcclBorrow(comm, device, options);
}
#endif

GpuPluginV1 MakeTable() {
  GpuPluginV1 t;
  t.check_driver = &CheckDriver;
  t.gpu_available = &Available;
  t.create_loader = &CreateLoader;
#ifdef CKPT_PLUGIN_NCCL
  t.nccl_check_membership = &CheckMembership;
  t.nccl_new_unique_id = &NewUniqueId;
  t.nccl_create = &Create;
  t.nccl_borrow = &Borrow;
#endif
  return t;
}

}  // namespace
}  // namespace ckpt

extern "C" __attribute__((visibility("default"))) const ckpt::GpuPluginV1* ckpt_gpu_plugin_v1(void) {
  static const ckpt::GpuPluginV1 table = ckpt::MakeTable();
  return &table;
}

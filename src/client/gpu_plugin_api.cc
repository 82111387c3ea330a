// The public GPU entry points of include/ckpt/gpu.h and collective.h, in libckptclient
// and the Python module: each opens the GPU plugin (client/gpu_plugin.h) and calls into it.
// Nothing here needs CUDA or NCCL headers or libraries.
#include "ckpt/client.h"
#include "ckpt/collective.h"
#include "ckpt/gpu.h"
#include "client/gpu_plugin.h"

namespace ckpt {
namespace {

Status NoNccl() {
  return Unsupported(std::string(kGpuPluginName) +
                     " was built without NCCL's header: collective loads are not available");
}

// The plugin, once its driver check passed.
Result<const GpuPluginV1*> PluginWithDriver() {
  CKPT_ASSIGN_OR_RETURN(const GpuPluginV1* plugin, GpuPlugin());
  CKPT_RETURN_IF_ERROR(plugin->check_driver());
  return plugin;
}

// The plugin, if it has NCCL entries (each of them opens libnccl.so.2 itself).
Result<const GpuPluginV1*> PluginWithNccl() {
  CKPT_ASSIGN_OR_RETURN(const GpuPluginV1* plugin, GpuPlugin());
  if (!plugin->nccl_new_unique_id) return NoNccl();
  return plugin;
}

}  // namespace

bool GpuAvailable() {
  auto plugin = PluginWithDriver();
  return plugin.ok() && (*plugin)->gpu_available();
}

Result<std::unique_ptr<GpuLoader>> GpuLoader::Create(const Checkpoint& checkpoint, int device,
                                                     const GpuLoadOptions& options) {
  CKPT_ASSIGN_OR_RETURN(const GpuPluginV1* plugin, PluginWithDriver());
  const Checkpoint* ckpt = &checkpoint;
  TensorSource source;
  source.tensors = &checkpoint.tensors();
  source.data = [ckpt](size_t i) -> const std::byte* {
    auto data = ckpt->TensorData(ckpt->tensors()[i].name);
    return data.ok() ? *data : nullptr;
  };
  return plugin->create_loader(std::move(source), device, options);
}

Result<std::string> NcclGroup::NewUniqueId() {
  CKPT_ASSIGN_OR_RETURN(const GpuPluginV1* plugin, PluginWithNccl());
  return plugin->nccl_new_unique_id();
}

Result<std::unique_ptr<NcclGroup>> NcclGroup::Create(const std::string& unique_id, int rank, int size, int device,
                                                     const NcclGroupOptions& options) {
  CKPT_ASSIGN_OR_RETURN(const GpuPluginV1* plugin, PluginWithNccl());
  return plugin->nccl_create(unique_id, rank, size, device, options);
}

Result<std::unique_ptr<NcclGroup>> NcclGroup::Join(Client& client, const std::string& job, int rank, int size,
                                                   int device, const NcclGroupOptions& options) {
  CKPT_ASSIGN_OR_RETURN(const GpuPluginV1* plugin, PluginWithNccl());
  CKPT_RETURN_IF_ERROR(plugin->nccl_check_membership(rank, size, device, options));
  std::string id;
  if (rank == 0) {
    CKPT_ASSIGN_OR_RETURN(id, plugin->nccl_new_unique_id());
  }
  auto handed = client.Rendezvous(job, rank, size, id, options.timeout_s);
  if (!handed.ok()) return handed.status().WithContext("NCCL unique id of job '" + job + "'");
  return plugin->nccl_create(*handed, rank, size, device, options);
}

Result<std::unique_ptr<NcclGroup>> NcclGroup::Borrow(void* nccl_comm, int device, const NcclGroupOptions& options) {
  CKPT_ASSIGN_OR_RETURN(const GpuPluginV1* plugin, PluginWithNccl());
  return plugin->nccl_borrow(nccl_comm, device, options);
}

}  // namespace ckpt

// The GPU plugin's entry point (libckptclient-cuda.so.0): the C table of
// include/ckpt/gpu_plugin_abi.h over the CUDA copy engine (cuda/gpu_loader_impl.h) and the
// NCCL group (cuda/nccl_group.h). Every entry converts its C arguments with the plan's
// codec (plan/gpu_abi_codec.h), calls the C++ engine, and hands back a code and a message:
// no C++ type and no exception leaves the plugin.
#include <dlfcn.h>

#include <exception>
#include <string>

#include "ckpt/gpu_plugin_abi.h"
#include "cuda/gpu_loader_impl.h"
#include "plan/gpu_abi_codec.h"
#ifdef CKPT_PLUGIN_NCCL
#include "cuda/nccl_group.h"
#include "gpu_plugin/nccl_loader.h"
#endif

// The opaque handles of the C interface.
struct ckpt_gpu_loader {
  std::vector<ckpt::TensorInfo> tensors;  // the source's, copied (the engine points at them)
  std::unique_ptr<ckpt::GpuLoaderImpl> impl;
};
struct ckpt_gpu_group {
  std::unique_ptr<ckpt::NcclGroup> group;
};
struct ckpt_gpu_dict_handle {
  ckpt::GpuStateDict dict;
  std::vector<ckpt_gpu_tensor> tensors;  // what the caller's ckpt_gpu_state_dict points at
};

namespace ckpt {
namespace {

// Runs `body` (returning Status), turning an exception into Internal: none may cross.
template <typename Body>
int32_t Guard(ckpt_gpu_error* error, Body&& body) {
  try {
    return gpu_abi::ToC(body(), error);
  } catch (const std::exception& e) {
    return gpu_abi::ToC(Internal(std::string("GPU plugin: ") + e.what()), error);
  } catch (...) {
    return gpu_abi::ToC(Internal("GPU plugin: unknown exception"), error);
  }
}

Status NullArgument(const char* what) { return InvalidArgument(std::string("GPU plugin interface: null ") + what); }

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
                       "is built into " CKPT_GPU_PLUGIN_SONAME "); CPU views, shards and partitions work without it");
  }
  return Status::Ok();
}

Status CheckDriver() {
  static const Status driver = OpenDriver();
  return driver;
}

int32_t CCheckDriver(ckpt_gpu_error* error) {
  return Guard(error, [] { return CheckDriver(); });
}

int32_t CAvailable() {
  try {
    return CheckDriver().ok() && GpuAvailable() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

int32_t CCreateLoader(const ckpt_gpu_source* source, int32_t device, const ckpt_gpu_load_options* options,
                      ckpt_gpu_loader** loader, ckpt_gpu_error* error) {
  return Guard(error, [&]() -> Status {
    if (!source || !loader) return NullArgument("source or loader");
    if (source->struct_size < sizeof(ckpt_gpu_source) || !source->tensor_data)
      return InvalidArgument("GPU plugin interface: a tensor source of another version");
    CKPT_ASSIGN_OR_RETURN(GpuLoadOptions o, gpu_abi::FromC(options));
    CKPT_RETURN_IF_ERROR(CheckDriver());
    auto handle = std::make_unique<ckpt_gpu_loader>();
    CKPT_ASSIGN_OR_RETURN(handle->tensors, gpu_abi::FromC(source->tensors, source->tensor_count));
    TensorSource s;
    s.tensors = &handle->tensors;
    s.data = [read = source->tensor_data, context = source->context](size_t i) {
      return static_cast<const std::byte*>(read(context, i));
    };
    CKPT_ASSIGN_OR_RETURN(handle->impl, GpuLoaderImpl::Create(std::move(s), device, o));
    *loader = handle.release();
    return Status::Ok();
  });
}

void CDestroyLoader(ckpt_gpu_loader* loader) { delete loader; }

// Hands `dict` to the caller: its description in *out, its ownership in *handle.
Status Hand(Result<GpuStateDict> dict, ckpt_gpu_state_dict* out, ckpt_gpu_dict_handle** handle) {
  if (!dict.ok()) return dict.status();
  auto h = std::make_unique<ckpt_gpu_dict_handle>();
  h->dict = std::move(*dict);
  CKPT_RETURN_IF_ERROR(gpu_abi::Describe(h->dict, &h->tensors, out));
  *handle = h.release();
  return Status::Ok();
}

int32_t CLoad(ckpt_gpu_loader* loader, const ckpt_gpu_output* outputs, uint64_t count, ckpt_gpu_state_dict* dict,
              ckpt_gpu_dict_handle** handle, ckpt_gpu_error* error) {
  return Guard(error, [&]() -> Status {
    if (!loader || !dict || !handle) return NullArgument("loader, state dict or handle");
    CKPT_ASSIGN_OR_RETURN(std::vector<ShardOutput> outs, gpu_abi::FromC(outputs, count));
    return Hand(loader->impl->Load(outs), dict, handle);
  });
}

int32_t CLoadCollective(ckpt_gpu_loader* loader, const ckpt_gpu_output* outputs, uint64_t count,
                        ckpt_gpu_group* group, const ckpt_gpu_collective_options* options, ckpt_gpu_state_dict* dict,
                        ckpt_gpu_dict_handle** handle, ckpt_gpu_error* error) {
  return Guard(error, [&]() -> Status {
    if (!loader || !group || !dict || !handle) return NullArgument("loader, group, state dict or handle");
    CKPT_ASSIGN_OR_RETURN(std::vector<ShardOutput> outs, gpu_abi::FromC(outputs, count));
    CKPT_ASSIGN_OR_RETURN(CollectiveOptions o, gpu_abi::FromC(options));
    return Hand(loader->impl->LoadCollective(outs, *group->group, o), dict, handle);
  });
}

void CReleaseStateDict(ckpt_gpu_dict_handle* handle) { delete handle; }

#ifdef CKPT_PLUGIN_NCCL
// Hands `group` to the caller as a handle.
Status HandGroup(Result<std::unique_ptr<NcclGroup>> group, ckpt_gpu_group** out) {
  if (!group.ok()) return group.status();
  *out = new ckpt_gpu_group{std::move(*group)};
  return Status::Ok();
}

int32_t CCheckMembership(int32_t rank, int32_t size, int32_t device, const ckpt_gpu_group_options* options,
                         ckpt_gpu_error* error) {
  return Guard(error, [&]() -> Status {
    CKPT_ASSIGN_OR_RETURN(NcclGroupOptions o, gpu_abi::FromC(options));
    CKPT_RETURN_IF_ERROR(cuda::LoadNccl());
    CKPT_RETURN_IF_ERROR(CheckDriver());
    return cuda::NcclCheckMembership(rank, size, device, o);
  });
}

int32_t CNewUniqueId(uint8_t* id, uint64_t capacity, uint64_t* length, ckpt_gpu_error* error) {
  return Guard(error, [&]() -> Status {
    if (!id || !length) return NullArgument("id buffer or length");
    CKPT_RETURN_IF_ERROR(cuda::LoadNccl());
    CKPT_ASSIGN_OR_RETURN(std::string made, cuda::NcclNewUniqueId());
    if (made.size() > capacity)
      return Internal("an NCCL unique id of " + std::to_string(made.size()) + " bytes, the buffer holds " +
                      std::to_string(capacity));
    std::copy(made.begin(), made.end(), id);
    *length = made.size();
    return Status::Ok();
  });
}

int32_t CCreate(const uint8_t* id, uint64_t id_length, int32_t rank, int32_t size, int32_t device,
                const ckpt_gpu_group_options* options, ckpt_gpu_group** group, ckpt_gpu_error* error) {
  return Guard(error, [&]() -> Status {
    if ((!id && id_length > 0) || !group) return NullArgument("id or group");
    CKPT_ASSIGN_OR_RETURN(NcclGroupOptions o, gpu_abi::FromC(options));
    CKPT_RETURN_IF_ERROR(cuda::LoadNccl());
    CKPT_RETURN_IF_ERROR(CheckDriver());
    const std::string unique_id(reinterpret_cast<const char*>(id), id_length);
    return HandGroup(cuda::NcclCreate(unique_id, rank, size, device, o), group);
  });
}

int32_t CBorrow(void* comm, int32_t device, const ckpt_gpu_group_options* options, ckpt_gpu_group** group,
                ckpt_gpu_error* error) {
  return Guard(error, [&]() -> Status {
    if (!group) return NullArgument("group");
    CKPT_ASSIGN_OR_RETURN(NcclGroupOptions o, gpu_abi::FromC(options));
    CKPT_RETURN_IF_ERROR(cuda::LoadNccl());
    CKPT_RETURN_IF_ERROR(CheckDriver());
    return HandGroup(cuda::NcclBorrow(comm, device, o), group);
  });
}

void CGroupInfo(const ckpt_gpu_group* group, int32_t* rank, int32_t* size, int32_t* device, int32_t* broken) {
  if (!group) return;
  if (rank) *rank = group->group->rank();
  if (size) *size = group->group->size();
  if (device) *device = group->group->device();
  if (broken) *broken = group->group->broken() ? 1 : 0;
}

void CDestroyGroup(ckpt_gpu_group* group) { delete group; }
#endif

ckpt_gpu_plugin MakeTable() {
  ckpt_gpu_plugin t{};
  t.abi_version = CKPT_GPU_PLUGIN_ABI_VERSION;
  t.struct_size = sizeof(ckpt_gpu_plugin);
  t.build_version = CKPT_VERSION;
  t.check_driver = &CCheckDriver;
  t.gpu_available = &CAvailable;
  t.create_loader = &CCreateLoader;
  t.destroy_loader = &CDestroyLoader;
  t.load = &CLoad;
  t.load_collective = &CLoadCollective;
  t.release_state_dict = &CReleaseStateDict;
#ifdef CKPT_PLUGIN_NCCL
  t.has_nccl = 1;
  t.nccl_check_membership = &CCheckMembership;
  t.nccl_new_unique_id = &CNewUniqueId;
  t.nccl_create = &CCreate;
  t.nccl_borrow = &CBorrow;
  t.group_info = &CGroupInfo;
  t.destroy_group = &CDestroyGroup;
#endif
  return t;
}

}  // namespace
}  // namespace ckpt

extern "C" __attribute__((visibility("default"))) const ckpt_gpu_plugin* ckpt_gpu_plugin_entry(void) {
  static const ckpt_gpu_plugin table = ckpt::MakeTable();
  return &table;
}

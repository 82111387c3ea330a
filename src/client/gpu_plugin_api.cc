// The public GPU entry points of include/ckpt/gpu.h and collective.h, in libckptclient
// and the Python module: each opens the GPU plugin (client/gpu_plugin.h) and calls into its
// C table (include/ckpt/gpu_plugin_abi.h), converting with the plan's codec. The loader and
// the group the caller gets are this library's objects holding the plugin's handles.
// Nothing here needs CUDA or NCCL headers or libraries.
#include <algorithm>
#include <array>

#include "ckpt/client.h"
#include "ckpt/collective.h"
#include "ckpt/gpu.h"
#include "client/gpu_plugin.h"
#include "plan/gpu_abi_codec.h"

namespace ckpt {
namespace {

// A buffer for the plugin's error message, and the Status of a call's code.
class PluginError {
 public:
  PluginError() = default;
  PluginError(const PluginError&) = delete;
  PluginError& operator=(const PluginError&) = delete;
  ckpt_gpu_error* get() { return &error_; }
  Status Of(int32_t code) const { return gpu_abi::FromC(code, text_.data()); }

 private:
  std::array<char, 4096> text_{};
  ckpt_gpu_error error_{text_.data(), text_.size()};
};

Status NoNccl() {
  return Unsupported(CKPT_GPU_PLUGIN_SONAME " was built without NCCL's header: collective loads are not available");
}

// The plugin, once its driver check passed.
Result<const ckpt_gpu_plugin*> PluginWithDriver() {
  CKPT_ASSIGN_OR_RETURN(const ckpt_gpu_plugin* plugin, GpuPlugin());
  PluginError error;
  CKPT_RETURN_IF_ERROR(error.Of(plugin->check_driver(error.get())));
  return plugin;
}

// The plugin, if it has NCCL entries (each of them opens libnccl.so.2 itself).
Result<const ckpt_gpu_plugin*> PluginWithNccl() {
  CKPT_ASSIGN_OR_RETURN(const ckpt_gpu_plugin* plugin, GpuPlugin());
  if (!plugin->has_nccl) return NoNccl();
  return plugin;
}

// An NcclGroup of the plugin's (a handle of its table).
class PluginNcclGroup final : public NcclGroup {
 public:
  PluginNcclGroup(const ckpt_gpu_plugin* plugin, ckpt_gpu_group* handle) : plugin_(plugin), handle_(handle) {
    int32_t broken = 0;
    plugin_->group_info(handle_, &rank_, &size_, &device_, &broken);
  }
  ~PluginNcclGroup() override { plugin_->destroy_group(handle_); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return device_; }
  bool broken() const override {
    int32_t broken = 0;
    plugin_->group_info(handle_, nullptr, nullptr, nullptr, &broken);
    return broken != 0;
  }
  ckpt_gpu_group* handle() const { return handle_; }

 private:
  const ckpt_gpu_plugin* plugin_;
  ckpt_gpu_group* handle_;
  int32_t rank_ = 0, size_ = 0, device_ = -1;
};

Result<std::unique_ptr<NcclGroup>> WrapGroup(const ckpt_gpu_plugin* plugin, int32_t code, ckpt_gpu_group* handle,
                                             const PluginError& error) {
  CKPT_RETURN_IF_ERROR(error.Of(code));
  return std::unique_ptr<NcclGroup>(std::make_unique<PluginNcclGroup>(plugin, handle));
}

// A GpuLoader of the plugin's, reading `checkpoint`.
class PluginGpuLoader final : public GpuLoader {
 public:
  static Result<std::unique_ptr<GpuLoader>> Create(const ckpt_gpu_plugin* plugin, const Checkpoint& checkpoint,
                                                   int device, const GpuLoadOptions& options) {
    const std::vector<ckpt_gpu_tensor_info> tensors = gpu_abi::ToC(checkpoint.tensors());
    ckpt_gpu_source source{};
    source.struct_size = sizeof(source);
    source.tensors = tensors.data();
    source.tensor_count = tensors.size();
    source.context = const_cast<Checkpoint*>(&checkpoint);
    source.tensor_data = &TensorData;
    const ckpt_gpu_load_options o = gpu_abi::ToC(options);
    ckpt_gpu_loader* handle = nullptr;
    PluginError error;
    CKPT_RETURN_IF_ERROR(error.Of(plugin->create_loader(&source, device, &o, &handle, error.get())));
    return std::unique_ptr<GpuLoader>(new PluginGpuLoader(plugin, handle));
  }
  ~PluginGpuLoader() override { plugin_->destroy_loader(handle_); }

  Result<GpuStateDict> Load(const std::vector<ShardOutput>& outputs) override {
    const gpu_abi::COutputs outs = gpu_abi::ToC(outputs);
    ckpt_gpu_state_dict dict{};
    dict.struct_size = sizeof(dict);
    ckpt_gpu_dict_handle* handle = nullptr;
    PluginError error;
    const int32_t code =
        plugin_->load(handle_, outs.outputs.data(), outs.outputs.size(), &dict, &handle, error.get());
    return Take(code, error, dict, handle);
  }

  Result<GpuStateDict> LoadCollective(const std::vector<ShardOutput>& outputs, NcclGroup& group,
                                      const CollectiveOptions& options) override {
    auto* ours = dynamic_cast<PluginNcclGroup*>(&group);
    if (!ours) return InvalidArgument("the group was not made by NcclGroup::Create, Join or Borrow");
    const gpu_abi::COutputs outs = gpu_abi::ToC(outputs);
    const ckpt_gpu_collective_options o = gpu_abi::ToC(options);
    ckpt_gpu_state_dict dict{};
    dict.struct_size = sizeof(dict);
    ckpt_gpu_dict_handle* handle = nullptr;
    PluginError error;
    const int32_t code = plugin_->load_collective(handle_, outs.outputs.data(), outs.outputs.size(), ours->handle(),
                                                  &o, &dict, &handle, error.get());
    return Take(code, error, dict, handle);
  }

 private:
  PluginGpuLoader(const ckpt_gpu_plugin* plugin, ckpt_gpu_loader* handle) : plugin_(plugin), handle_(handle) {}

  static const void* TensorData(void* context, uint64_t index) {
    const auto* checkpoint = static_cast<const Checkpoint*>(context);
    if (index >= checkpoint->tensors().size()) return nullptr;
    auto data = checkpoint->TensorData(checkpoint->tensors()[index].name);
    return data.ok() ? *data : nullptr;
  }

  // The host's state dict of a load's result; it owns `handle` (released with the
  // allocation's last reference, which adapters may hold beyond the dict).
  Result<GpuStateDict> Take(int32_t code, const PluginError& error, const ckpt_gpu_state_dict& dict,
                            ckpt_gpu_dict_handle* handle) {
    CKPT_RETURN_IF_ERROR(error.Of(code));
    const ckpt_gpu_plugin* plugin = plugin_;
    std::shared_ptr<void> allocation(dict.allocation, [plugin, handle](void*) { plugin->release_state_dict(handle); });
    return GpuStateDictBuilder::FromC(dict, std::move(allocation));
  }

  const ckpt_gpu_plugin* plugin_;
  ckpt_gpu_loader* handle_;
};

}  // namespace

bool GpuAvailable() {
  auto plugin = PluginWithDriver();
  return plugin.ok() && (*plugin)->gpu_available() != 0;
}

Result<std::unique_ptr<GpuLoader>> GpuLoader::Create(const Checkpoint& checkpoint, int device,
                                                     const GpuLoadOptions& options) {
  CKPT_ASSIGN_OR_RETURN(const ckpt_gpu_plugin* plugin, PluginWithDriver());
  return PluginGpuLoader::Create(plugin, checkpoint, device, options);
}

Result<std::string> NcclGroup::NewUniqueId() {
  CKPT_ASSIGN_OR_RETURN(const ckpt_gpu_plugin* plugin, PluginWithNccl());
  std::array<uint8_t, 4096> id{};
  uint64_t length = 0;
  PluginError error;
  CKPT_RETURN_IF_ERROR(error.Of(plugin->nccl_new_unique_id(id.data(), id.size(), &length, error.get())));
  return std::string(reinterpret_cast<const char*>(id.data()), std::min<uint64_t>(length, id.size()));
}

Result<std::unique_ptr<NcclGroup>> NcclGroup::Create(const std::string& unique_id, int rank, int size, int device,
                                                     const NcclGroupOptions& options) {
  CKPT_ASSIGN_OR_RETURN(const ckpt_gpu_plugin* plugin, PluginWithNccl());
  const ckpt_gpu_group_options o = gpu_abi::ToC(options);
  ckpt_gpu_group* handle = nullptr;
  PluginError error;
  const int32_t code = plugin->nccl_create(reinterpret_cast<const uint8_t*>(unique_id.data()), unique_id.size(), rank,
                                           size, device, &o, &handle, error.get());
  return WrapGroup(plugin, code, handle, error);
}

Result<std::unique_ptr<NcclGroup>> NcclGroup::Join(Client& client, const std::string& job, int rank, int size,
                                                   int device, const NcclGroupOptions& options) {
  CKPT_ASSIGN_OR_RETURN(const ckpt_gpu_plugin* plugin, PluginWithNccl());
  const ckpt_gpu_group_options o = gpu_abi::ToC(options);
  PluginError error;
  CKPT_RETURN_IF_ERROR(error.Of(plugin->nccl_check_membership(rank, size, device, &o, error.get())));
  std::string id;
  if (rank == 0) {
    CKPT_ASSIGN_OR_RETURN(id, NewUniqueId());
  }
  auto handed = client.Rendezvous(job, rank, size, id, options.timeout_s);
  if (!handed.ok()) return handed.status().WithContext("NCCL unique id of job '" + job + "'");
  return Create(*handed, rank, size, device, options);
}

Result<std::unique_ptr<NcclGroup>> NcclGroup::Borrow(void* nccl_comm, int device, const NcclGroupOptions& options) {
  CKPT_ASSIGN_OR_RETURN(const ckpt_gpu_plugin* plugin, PluginWithNccl());
  const ckpt_gpu_group_options o = gpu_abi::ToC(options);
  ckpt_gpu_group* handle = nullptr;
  PluginError error;
  const int32_t code = plugin->nccl_borrow(nccl_comm, device, &o, &handle, error.get());
  return WrapGroup(plugin, code, handle, error);
}

}  // namespace ckpt

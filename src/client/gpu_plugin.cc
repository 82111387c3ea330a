#include "client/gpu_plugin.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace ckpt {
namespace {

#ifndef CKPT_GPU_PLUGIN_BUILT
#define CKPT_GPU_PLUGIN_BUILT 0
#endif

const char kHowToGet[] =
    "install the libckptclient-cuda0 package beside libckptclient0, or `pip install` the ckpt Python package "
    "from a build with CUDA, or set CKPT_GPU_PLUGIN to the plugin's path; CPU views, shards, partitions and "
    "state dicts work without it";

// The directory of the shared object (or executable) this function is linked into.
std::string OwnDirectory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&OwnDirectory), &info) == 0 || !info.dli_fname) return "";
  std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

std::string DlError() {
  const char* e = dlerror();
  return e ? e : "unknown error";
}

const char kInstallSame[] = "install the libckptclient-cuda0 package of the same version as libckptclient0";

// The table behind `entry`, if it speaks our interface version and is complete.
Result<const ckpt_gpu_plugin*> CheckTable(ckpt_gpu_plugin_entry_fn entry, const std::string& where) {
  const ckpt_gpu_plugin* table = entry();
  if (!table) return FailedPrecondition("the GPU plugin " + where + " returned no table: not a ckpt GPU plugin");
  // abi_version, struct_size and build_version are where they are in every version.
  const std::string theirs = "interface version " + std::to_string(table->abi_version) + " (ckpt " +
                             (table->build_version ? table->build_version : "?") + ")";
  const std::string ours = "interface version " + std::to_string(CKPT_GPU_PLUGIN_ABI_VERSION) + " (ckpt " +
                           CKPT_VERSION + ")";
  if (table->abi_version != CKPT_GPU_PLUGIN_ABI_VERSION)
    return FailedPrecondition("the GPU plugin " + where + " speaks " + theirs + ", this library " + ours +
                              ": it is from another build of ckpt; " + kInstallSame);
  if (table->struct_size < sizeof(ckpt_gpu_plugin) || !table->check_driver || !table->gpu_available ||
      !table->create_loader || !table->destroy_loader || !table->load || !table->load_collective ||
      !table->release_state_dict ||
      (table->has_nccl && (!table->nccl_check_membership || !table->nccl_new_unique_id || !table->nccl_create ||
                           !table->nccl_borrow || !table->group_info || !table->destroy_group)))
    return FailedPrecondition("the GPU plugin " + where + " (" + theirs + ") has an incomplete table (" +
                              std::to_string(table->struct_size) + " bytes, " +
                              std::to_string(sizeof(ckpt_gpu_plugin)) + " expected): " + kInstallSame);
  return table;
}

Result<const ckpt_gpu_plugin*> Open(const std::string& path, const std::string& where) {
  dlerror();
  // RTLD_LOCAL: the plugin's symbols (it exports only its entry) never interpose others';
  // RTLD_NODELETE: state dicts hold deleters in its code, so it stays until exit.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!handle) {
    return Unsupported("the GPU plugin " + where + " could not be loaded: " + DlError() +
                       " (it needs only the C++ runtime and, at the first GPU call, the NVIDIA driver "
                       "libcuda.so.1; "
                       "NCCL is opened when a collective load asks for it)");
  }
  auto entry = reinterpret_cast<ckpt_gpu_plugin_entry_fn>(dlsym(handle, CKPT_GPU_PLUGIN_ENTRY));
  if (entry) return CheckTable(entry, where);
  // ckpt 0.1's plugins passed C++ types (interface 1): never call into one.
  if (dlsym(handle, "ckpt_gpu_plugin_v1"))
    return FailedPrecondition("the GPU plugin " + where + " speaks interface version 1 (the C++ table of an "
                              "older ckpt), this library interface version " +
                              std::to_string(CKPT_GPU_PLUGIN_ABI_VERSION) + " (ckpt " + CKPT_VERSION + "); " +
                              kInstallSame);
  return FailedPrecondition("the GPU plugin " + where + " has no " + CKPT_GPU_PLUGIN_ENTRY +
                            ": not a ckpt GPU plugin");
}

Result<const ckpt_gpu_plugin*> Find() {
  if (!CKPT_GPU_PLUGIN_BUILT) {
    return Unsupported("libckptclient was built without CUDA (no nvcc at build time): the GPU copy engine and "
                       "collective loads are not available");
  }
  // secure_getenv: a set-user-ID program never loads code an environment names.
  if (const char* env = secure_getenv("CKPT_GPU_PLUGIN"); env && *env) {
    if (access(env, F_OK) != 0)
      return Unsupported(std::string("CKPT_GPU_PLUGIN=") + env + ": no such file (" CKPT_GPU_PLUGIN_SONAME
                         ", the CUDA copy engine of libckptclient)");
    return Open(env, std::string("CKPT_GPU_PLUGIN=") + env);
  }
  const std::string dir = OwnDirectory();
  const std::string beside = dir.empty() ? "" : dir + "/" + CKPT_GPU_PLUGIN_SONAME;
  if (!beside.empty() && access(beside.c_str(), F_OK) == 0) return Open(beside, beside);
  // The library path (or the copy already loaded in the process under that soname).
  dlerror();
  if (!dlopen(CKPT_GPU_PLUGIN_SONAME, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)) {
    const std::string why = DlError();
    return Unsupported(std::string(CKPT_GPU_PLUGIN_SONAME " (the CUDA copy engine of libckptclient) not found") +
                       (beside.empty() ? "" : " at " + beside) + " nor on the library path (" + why + "): " + kHowToGet);
  }
  return Open(CKPT_GPU_PLUGIN_SONAME, std::string(CKPT_GPU_PLUGIN_SONAME) + " (from the library path)");
}

}  // namespace

Result<const ckpt_gpu_plugin*> GpuPlugin() {
  static const Result<const ckpt_gpu_plugin*> plugin = Find();
  return plugin;
}

}  // namespace ckpt

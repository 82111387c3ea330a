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

Result<const GpuPluginV1*> Open(const std::string& path, const std::string& where) {
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
  auto entry = reinterpret_cast<const GpuPluginV1* (*)()>(dlsym(handle, kGpuPluginEntry));
  if (!entry) return FailedPrecondition("the GPU plugin " + where + " has no " + kGpuPluginEntry + ": not a ckpt GPU plugin");
  const GpuPluginV1* table = entry();
  const GpuPluginV1 mine;
  if (!table || table->abi != mine.abi || !table->version || std::string(table->version) != mine.version ||
      !(table->layout == mine.layout)) {
    return FailedPrecondition("the GPU plugin " + where + " is from another build of ckpt (version " +
                              (table && table->version ? std::string(table->version) : "?") + ", interface " +
                              (table ? std::to_string(table->abi) : "?") + "; this library: " + mine.version +
                              ", interface " + std::to_string(mine.abi) +
                              "): install the libckptclient-cuda0 package of the same version");
  }
  return table;
}

Result<const GpuPluginV1*> Find() {
  if (!CKPT_GPU_PLUGIN_BUILT) {
    return Unsupported("libckptclient was built without CUDA (no nvcc at build time): the GPU copy engine and "
                       "collective loads are not available");
  }
  // secure_getenv: a set-user-ID program never loads code an environment names.
  if (const char* env = secure_getenv("CKPT_GPU_PLUGIN"); env && *env) {
    if (access(env, F_OK) != 0)
      return Unsupported(std::string("CKPT_GPU_PLUGIN=") + env + ": no such file (" + kGpuPluginName +
                         ", the CUDA copy engine of libckptclient)");
    return Open(env, std::string("CKPT_GPU_PLUGIN=") + env);
  }
  const std::string dir = OwnDirectory();
  const std::string beside = dir.empty() ? "" : dir + "/" + kGpuPluginName;
  if (!beside.empty() && access(beside.c_str(), F_OK) == 0) return Open(beside, beside);
  // The library path (or the copy already loaded in the process under that soname).
  dlerror();
  if (!dlopen(kGpuPluginName, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)) {
    const std::string why = DlError();
    return Unsupported(std::string(kGpuPluginName) + " (the CUDA copy engine of libckptclient) not found" +
                       (beside.empty() ? "" : " at " + beside) + " nor on the library path (" + why + "): " +
                       kHowToGet);
  }
  return Open(kGpuPluginName, std::string(kGpuPluginName) + " (from the library path)");
}

}  // namespace

Result<const GpuPluginV1*> GpuPlugin() {
  static const Result<const GpuPluginV1*> plugin = Find();
  return plugin;
}

}  // namespace ckpt

#include "gpu_plugin/nccl_loader.h"

#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>
#include <string>

namespace ckpt::cuda {
namespace {

// NCCL >= 2.14: ncclCommInitRankConfig with nonblocking communicators, ncclCommFinalize.
constexpr int kMinNcclVersion = 21400;

struct NcclApi {
  decltype(&::ncclGetVersion) GetVersion = nullptr;
  decltype(&::ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&::ncclCommInitRankConfig) CommInitRankConfig = nullptr;
  decltype(&::ncclCommFinalize) CommFinalize = nullptr;
  decltype(&::ncclCommDestroy) CommDestroy = nullptr;
  decltype(&::ncclCommAbort) CommAbort = nullptr;
  decltype(&::ncclGetErrorString) GetErrorString = nullptr;
  decltype(&::ncclGetLastError) GetLastError = nullptr;
  decltype(&::ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&::ncclCommCount) CommCount = nullptr;
  decltype(&::ncclCommCuDevice) CommCuDevice = nullptr;
  decltype(&::ncclCommUserRank) CommUserRank = nullptr;
  decltype(&::ncclAllGather) AllGather = nullptr;
  decltype(&::ncclSend) Send = nullptr;
  decltype(&::ncclRecv) Recv = nullptr;
  decltype(&::ncclGroupStart) GroupStart = nullptr;
  decltype(&::ncclGroupEnd) GroupEnd = nullptr;
};

// Filled once by Open (under the static initialization of LoadNccl's result), read-only after.
NcclApi api;
bool loaded = false;

std::string DlError() {
  const char* e = dlerror();
  return e ? e : "unknown error";
}

const char kHowToGet[] =
    "install NCCL 2 (>= 2.14) for CUDA 13 (NVIDIA's libnccl2 package, or the nvidia-nccl-cu13 wheel PyTorch "
    "uses: import torch first, or set CKPT_NCCL_LIBRARY to its lib/libnccl.so.2); single-rank GPU loads "
    "work without it";

Status Open() {
  void* handle = nullptr;
  std::string where;
  dlerror();
  if (const char* env = secure_getenv("CKPT_NCCL_LIBRARY"); env && *env) {  // (ignored when set-user-ID)
    where = std::string("CKPT_NCCL_LIBRARY=") + env;
    handle = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (!handle) return Unsupported(where + " could not be loaded: " + DlError() + ": " + kHowToGet);
  } else {
    where = "libnccl.so.2 (already loaded in the process)";
    handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!handle) {
      dlerror();
      where = "libnccl.so.2";
      handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
      if (!handle) return Unsupported("libnccl.so.2 not found (" + DlError() + "): " + kHowToGet);
    }
  }
  // The handle is never closed: communicators outlive any one call.
  Dl_info info{};
  void* probe = dlsym(handle, "ncclGetVersion");
  if (probe && dladdr(probe, &info) && info.dli_fname) where += " at " + std::string(info.dli_fname);
  NcclApi a;
  std::string missing;
  auto resolve = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    if (!fn) missing += std::string(missing.empty() ? "" : ", ") + name;
  };
  resolve(a.GetVersion, "ncclGetVersion");
  resolve(a.GetUniqueId, "ncclGetUniqueId");
  resolve(a.CommInitRankConfig, "ncclCommInitRankConfig");
  resolve(a.CommFinalize, "ncclCommFinalize");
  resolve(a.CommDestroy, "ncclCommDestroy");
  resolve(a.CommAbort, "ncclCommAbort");
  resolve(a.GetErrorString, "ncclGetErrorString");
  resolve(a.GetLastError, "ncclGetLastError");
  resolve(a.CommGetAsyncError, "ncclCommGetAsyncError");
  resolve(a.CommCount, "ncclCommCount");
  resolve(a.CommCuDevice, "ncclCommCuDevice");
  resolve(a.CommUserRank, "ncclCommUserRank");
  resolve(a.AllGather, "ncclAllGather");
  resolve(a.Send, "ncclSend");
  resolve(a.Recv, "ncclRecv");
  resolve(a.GroupStart, "ncclGroupStart");
  resolve(a.GroupEnd, "ncclGroupEnd");
  int version = 0;
  if (a.GetVersion && a.GetVersion(&version) != ncclSuccess) version = 0;
  if (!missing.empty() || version < kMinNcclVersion || version >= 30000) {
    std::string v = version == 0 ? "unknown"
                                 : std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
                                       std::to_string(version % 100);
    return Unsupported(where + " is NCCL " + v + (missing.empty() ? "" : ", lacking " + missing) +
                       ": collective loads need NCCL 2 >= 2.14 (built against " + std::to_string(NCCL_MAJOR) + "." +
                       std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH) + "); " + kHowToGet);
  }
  api = a;
  loaded = true;
  return Status::Ok();
}

}  // namespace

Status LoadNccl() {
  static const Status opened = Open();
  return opened;
}

}  // namespace ckpt::cuda

// The forwarders, local to the plugin (its version script exports only its entry point),
// so that nccl_group.cc's calls bind here and never to another NCCL in the process.
using ckpt::cuda::api;
using ckpt::cuda::loaded;

extern "C" {

ncclResult_t ncclGetVersion(int* version) { return loaded ? api.GetVersion(version) : ncclInternalError; }
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) { return loaded ? api.GetUniqueId(id) : ncclInternalError; }
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  return loaded ? api.CommInitRankConfig(comm, nranks, id, rank, config) : ncclInternalError;
}
ncclResult_t ncclCommFinalize(ncclComm_t comm) { return loaded ? api.CommFinalize(comm) : ncclInternalError; }
ncclResult_t ncclCommDestroy(ncclComm_t comm) { return loaded ? api.CommDestroy(comm) : ncclInternalError; }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return loaded ? api.CommAbort(comm) : ncclInternalError; }
const char* ncclGetErrorString(ncclResult_t result) {
  return loaded ? api.GetErrorString(result) : "NCCL is not loaded (libnccl.so.2)";
}
const char* ncclGetLastError(ncclComm_t comm) { return loaded ? api.GetLastError(comm) : ""; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  return loaded ? api.CommGetAsyncError(comm, error) : ncclInternalError;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) { return loaded ? api.CommCount(comm, count) : ncclInternalError; }
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return loaded ? api.CommCuDevice(comm, device) : ncclInternalError;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return loaded ? api.CommUserRank(comm, rank) : ncclInternalError;
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  return loaded ? api.AllGather(send, recv, count, type, comm, stream) : ncclInternalError;
}
ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return loaded ? api.Send(send, count, type, peer, comm, stream) : ncclInternalError;
}
ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
  return loaded ? api.Recv(recv, count, type, peer, comm, stream) : ncclInternalError;
}
ncclResult_t ncclGroupStart() { return loaded ? api.GroupStart() : ncclInternalError; }
ncclResult_t ncclGroupEnd() { return loaded ? api.GroupEnd() : ncclInternalError; }

}  // extern "C"

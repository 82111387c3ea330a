// Finding and opening libckptclient's GPU plugin (include/ckpt/gpu_plugin_abi.h: a C table,
// versioned) on the first GPU call, so that libckptclient, libckpttorch and the Python
// module load, and serve every CPU path, on a machine with no CUDA or NCCL library at all.
#pragma once

#include "ckpt/gpu_plugin_abi.h"
#include "ckpt/status.h"

namespace ckpt {

// The plugin's table, opened once per process (the first call decides; thread-safe, and
// later calls return the same table or the same error). Where it is looked for, in order:
//   1. $CKPT_GPU_PLUGIN (a path) when set and not empty: that file only (never for a
//      set-user-ID program: secure_getenv);
//   2. libckptclient-cuda.so.0 in the directory of the object this code is in
//      (libckptclient.so.0, or the Python module _ckpt*.so), found with dladdr;
//   3. libckptclient-cuda.so.0 on the dynamic linker's search path.
// Errors: Unsupported, saying what is missing (the plugin, with where it was looked for,
// or what the plugin itself could not load) and how to get it; FailedPrecondition for a
// library that is not a ckpt GPU plugin (no entry symbol, or an incomplete table) or one
// that speaks another interface version (the message names its version and ours).
Result<const ckpt_gpu_plugin*> GpuPlugin();

}  // namespace ckpt

// NCCL for the GPU plugin, opened at run time instead of linked: the plugin defines the
// few nccl* functions src/cuda/nccl_group.cc calls (local to the plugin) as forwarders to
// the libnccl.so.2 that LoadNccl opens, so that the plugin loads without NCCL and uses the
// one already in the process (PyTorch's) when there is one.
#pragma once

#include "ckpt/status.h"

namespace ckpt::cuda {

// Opens NCCL once per process (thread-safe; later calls return the first one's result):
// $CKPT_NCCL_LIBRARY when set (that path only); else the libnccl.so.2 already loaded in
// the process (RTLD_NOLOAD: e.g. PyTorch's wheel); else libnccl.so.2 from the library
// path. Ok when it is open, has every function used and is NCCL 2 >= 2.14 (nonblocking
// communicators, ncclCommFinalize); else Unsupported naming the library and what is wrong.
// The forwarders return ncclInternalError (ncclGetErrorString: a text) until it succeeded.
Status LoadNccl();

}  // namespace ckpt::cuda

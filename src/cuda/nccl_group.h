// What the collective loader needs from an NcclGroup; implemented over NCCL in
// nccl_group.cc. Every operation is collective (all ranks call it, in the same order) and
// bounded by the group's timeout: on expiry or a peer's NCCL error the communicator is
// aborted, the group is broken, and the call returns DeadlineExceeded or Unavailable.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/collective.h"
#include "plan/collective_plan.h"

namespace ckpt::cuda {

class NcclGroupOps : public NcclGroup {
 public:
  // Every rank's `mine` (of any length), in rank order.
  virtual Result<std::vector<std::string>> AllGatherBytes(const std::string& mine) = 0;
  // The sends and receives of `transfers` on device memory at `base`, as one NCCL group.
  virtual Status Exchange(const std::vector<collective::Transfer>& transfers, std::byte* base) = 0;
};

// The factories behind NcclGroup's (include/ckpt/collective.h), reached through the GPU
// plugin's C table (src/gpu_plugin/entry.cc); NcclGroup::Join is the host's (it needs the
// Client), written on NcclCheckMembership, NcclNewUniqueId and NcclCreate.
// NcclCheckMembership: InvalidArgument for a rank, size, timeout or device out of range.
Status NcclCheckMembership(int rank, int size, int device, const NcclGroupOptions& options);
Result<std::string> NcclNewUniqueId();
Result<std::unique_ptr<NcclGroup>> NcclCreate(const std::string& unique_id, int rank, int size, int device,
                                              const NcclGroupOptions& options);
Result<std::unique_ptr<NcclGroup>> NcclBorrow(void* nccl_comm, int device, const NcclGroupOptions& options);

}  // namespace ckpt::cuda

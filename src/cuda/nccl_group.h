// What the collective loader needs from an NcclGroup; implemented over NCCL in
// nccl_group.cc. Every operation is collective (all ranks call it, in the same order) and
// bounded by the group's timeout: on expiry or a peer's NCCL error the communicator is
// aborted, the group is broken, and the call returns DeadlineExceeded or Unavailable.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ckpt/collective.h"
#include "client/collective_plan.h"

namespace ckpt::cuda {

class NcclGroupOps : public NcclGroup {
 public:
  // Every rank's `mine` (of any length), in rank order.
  virtual Result<std::vector<std::string>> AllGatherBytes(const std::string& mine) = 0;
  // The sends and receives of `transfers` on device memory at `base`, as one NCCL group.
  virtual Status Exchange(const std::vector<collective::Transfer>& transfers, std::byte* base) = 0;
};

}  // namespace ckpt::cuda

// Collective loads: when several ranks of a node need the same bytes (replicated tensors of
// a tensor-parallel load, whole-model data-parallel replicas, MiCS replica groups), each
// byte crosses PCIe once, copied by one rank, and NCCL carries it to the others over NVLink.
//
//   // Each rank (process) of a node, on its own GPU:
//   auto group = ckpt::NcclGroup::Join(*client, "job-1234", local_rank, local_world, gpu, {});
//   auto outs = ckpt::TpPlan::BuiltIn("gpt-neo")->Resolve(ckpt->tensors(), tp_rank, tp_world);
//   auto loader = ckpt::GpuLoader::Create(*ckpt, gpu, {});
//   auto dict = (*loader)->LoadCollective(*outs, **group, {});
//
// Each rank passes the outputs it needs; the ranks compare them (by name, source tensors
// and their checksums, shard, dtype and node) and every output two or more ranks need is
// copied from the shared memory by one of them and sent to the rest. Outputs only one rank
// needs are copied by it as in GpuLoader::Load. Ranks on different nodes never share (each
// node reads its own daemon's copy), so a communicator spanning nodes works too; a node-local
// one avoids waiting on remote ranks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ckpt/status.h"

namespace ckpt {

class Client;

struct NcclGroupOptions {
  // Bound on each wait for the other ranks (joining; in a load: exchanging descriptors,
  // the copy verdicts, the transfers, each bounded separately). On expiry the call fails
  // with DeadlineExceeded and the communicator is aborted.
  double timeout_s = 300;
};

// An NCCL communicator of the ranks that load together, one GPU per rank. Thread-compatible.
// After a failure that involved the other ranks (a timeout, a peer's NCCL error) the group
// is broken(): the communicator is aborted and every later collective call fails.
class NcclGroup {
 public:
  // A new NCCL unique id (ncclGetUniqueId) for rank 0 to hand to the others; its bootstrap
  // listener lives in this process. Unsupported in builds without NCCL, or when NCCL 2 >=
  // 2.14 cannot be opened at run time (libnccl.so.2: the one already loaded in the process,
  // else the library path's, or $CKPT_NCCL_LIBRARY); the message names what is missing.
  // The same for every factory below.
  static Result<std::string> NewUniqueId();
  // Joins the group `unique_id` names as `rank` of `size`, on CUDA device `device`. Waits at
  // most options.timeout_s for every rank to join (DeadlineExceeded naming the group size).
  static Result<std::unique_ptr<NcclGroup>> Create(const std::string& unique_id, int rank, int size, int device,
                                                   const NcclGroupOptions& options);
  // As Create, with the unique id handed out through the daemon: rank 0 publishes a new id
  // under `job`, the others wait for it (Client::Rendezvous). `job` must be unique per run
  // of the job (e.g. include the launcher's run id): a stale id from a crashed run fails
  // to connect and times out.
  static Result<std::unique_ptr<NcclGroup>> Join(Client& client, const std::string& job, int rank, int size,
                                                 int device, const NcclGroupOptions& options);
  // Wraps the caller's communicator (an ncclComm_t) for `device`; not destroyed with the
  // group. But on a timeout or a peer's error the group calls ncclCommAbort on it, which
  // frees it: after broken() the caller must drop the handle without destroying it. Only a
  // nonblocking communicator (ncclConfig_t::blocking = 0) lets the timeout cover NCCL's
  // connection setup as well as the transfers.
  static Result<std::unique_ptr<NcclGroup>> Borrow(void* nccl_comm, int device, const NcclGroupOptions& options);

  virtual ~NcclGroup();
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int device() const = 0;
  virtual bool broken() const = 0;

 protected:
  NcclGroup() = default;
};

// How LoadCollective shares (GpuLoader::LoadCollective). Every rank must pass the same
// options; ranks that differ all fail with InvalidArgument.
struct CollectiveOptions {
  enum class Mode {
    kAuto,         // share when it pays: some output is needed by several ranks, that
                   // saves at least min_saved_bytes of host-to-device copies, and every
                   // rank's GPU has peer access to the other GPUs it sees; else independent
                   // copies
    kCollective,   // share whatever is shared, even where it may not pay
    kIndependent,  // every rank copies all its outputs itself (still a collective call)
  };
  Mode mode = Mode::kAuto;
  uint64_t min_saved_bytes = 64ull << 20;
};

}  // namespace ckpt

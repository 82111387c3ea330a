// The rendezvous op: rank 0 of a job publishes a blob, the other ranks wait for it.
#include <poll.h>

#include <spdlog/spdlog.h>

#include "common/hex.h"
#include "daemon/ops.h"
#include "daemon/policy.h"

namespace ckpt::daemon {

Result<protocol::RendezvousResponse> Rendezvous(const DaemonContext& ctx, const Caller& caller,
                                                const protocol::RendezvousRequest& request) {
  ++ctx.counters->rendezvous;
  const std::string& job = request.job;
  CKPT_RETURN_IF_ERROR(ValidateJobName(job));
  const int rank = static_cast<int>(request.rank);
  const int world = static_cast<int>(request.world);
  const uint32_t owner = caller.peer.uid;
  if (rank != 0) {
    if (request.has_value) {
      return InvalidArgument("only rank 0 publishes a 'value'; rank " + std::to_string(rank) + " waits for it");
    }
    // Wait without blocking other connections; give up when the daemon stops or the
    // client hangs up (nobody would read the answer).
    const int fd = caller.fd;
    auto interrupted = [&ctx, fd]() -> Status {
      if (ctx.stopping->load()) return Unavailable("ckptd is stopping");
      if (fd >= 0) {
        pollfd p{fd, POLLRDHUP, 0};
        if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
          return Unavailable("the client hung up while waiting");
        }
      }
      return Status::Ok();
    };
    CKPT_ASSIGN_OR_RETURN(std::string value,
                          ctx.rendezvous->Await(owner, job, rank, world,
                                                std::chrono::duration<double>(request.timeout_s), interrupted));
    spdlog::debug("rendezvous '{}' of uid {}: rank {} of {} fetched {} bytes", job, owner, rank, world, value.size());
    return protocol::RendezvousResponse{HexEncode(value)};
  }
  const std::string& hex = request.value_hex;
  if (hex.empty()) return InvalidArgument("rank 0 of job '" + job + "' must publish a non-empty 'value'");
  if (hex.size() > kMaxRendezvousHexChars) {
    return InvalidArgument("'value' is " + std::to_string(hex.size()) + " hex characters; at most " +
                           std::to_string(kMaxRendezvousHexChars) + " are accepted");
  }
  CKPT_ASSIGN_OR_RETURN(std::string bytes, HexDecode(hex));
  CKPT_ASSIGN_OR_RETURN(uint64_t generation, ctx.rendezvous->Publish(owner, job, world, std::move(bytes)));
  spdlog::info("rendezvous '{}' of uid {}: rank 0 published {} bytes for world {} (generation {})", job, owner,
               hex.size() / 2, world, generation);
  return protocol::RendezvousResponse{hex};
}

}  // namespace ckpt::daemon

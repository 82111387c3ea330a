// The verify op: re-hashes a published checkpoint against its index checksums.
#include <spdlog/spdlog.h>

#include "daemon/ops.h"
#include "loader/segment_verifier.h"
#include "shm/segment_reader.h"

namespace ckpt::daemon {

Result<protocol::VerifyResponse> Verify(const DaemonContext& ctx, const protocol::VerifyRequest& request) {
  const std::string& name = request.name;
  CKPT_ASSIGN_OR_RETURN(CatalogEntry entry, ctx.catalog->Get(name));
  // Our own read-only mapping: stays valid even if the checkpoint is evicted meanwhile.
  CKPT_ASSIGN_OR_RETURN(UniqueFd fd, OpenSegment(ctx, entry));
  CKPT_ASSIGN_OR_RETURN(auto segment, shm::SegmentReader::FromFd(fd.get(), entry.shm_name));
  fd.reset();
  CKPT_ASSIGN_OR_RETURN(loader::VerifyReport report,
                        loader::VerifySegment(*segment, std::max(1, ctx.options->load_threads), ctx.stopping));
  if (report.ok()) {
    spdlog::info("verified '{}' generation {}: {} tensors, {} bytes OK in {:.3f} s", name, entry.generation,
                 report.tensors, report.bytes, report.seconds);
  } else {
    spdlog::warn("verify of '{}' generation {}: {} of {} tensors do not match their checksums (first: '{}')", name,
                 entry.generation, report.mismatch_count, report.tensors, report.mismatched.front());
  }
  protocol::VerifyResponse r;
  r.name = name;
  r.generation = entry.generation;
  r.passed = report.ok();
  r.tensors = report.tensors;
  r.bytes = report.bytes;
  r.seconds = report.seconds;
  r.mismatch_count = report.mismatch_count;
  r.mismatched = report.mismatched;
  return r;
}

}  // namespace ckpt::daemon

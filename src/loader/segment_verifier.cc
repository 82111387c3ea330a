#include "loader/segment_verifier.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "loader/worker_group.h"

namespace ckpt::loader {

Result<VerifyReport> VerifySegment(const shm::SegmentReader& segment, int threads,
                                   const std::atomic<bool>* cancel, size_t max_listed) {
  if (threads < 1) return InvalidArgument("verify needs at least one thread");
  const auto start = std::chrono::steady_clock::now();
  const auto& tensors = segment.tensors();
  // Biggest tensors first so that the threads finish together.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors[a].nbytes > tensors[b].nbytes; });
  std::unique_ptr<std::atomic<bool>[]> bad(new std::atomic<bool>[tensors.size()]);
  for (size_t i = 0; i < tensors.size(); ++i) bad[i].store(false);
  std::atomic<size_t> next{0};
  Status st = RunWorkers(
      static_cast<int>(std::min<size_t>(threads, std::max<size_t>(tensors.size(), 1))),
      [&](int, const std::atomic<bool>& stop) -> Status {
        for (size_t k; !stop.load() && (k = next.fetch_add(1)) < order.size();) {
          if (cancel && cancel->load()) return FailedPrecondition("verify cancelled");
          const size_t i = order[k];
          if (shm::Checksum(segment.tensor_data(i), tensors[i].nbytes) != tensors[i].checksum) bad[i].store(true);
        }
        return Status::Ok();
      },
      nullptr);
  CKPT_RETURN_IF_ERROR(st);
  VerifyReport report;
  report.tensors = tensors.size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    report.bytes += tensors[i].nbytes;
    if (!bad[i].load()) continue;
    ++report.mismatch_count;
    if (report.mismatched.size() < max_listed) report.mismatched.push_back(tensors[i].name);
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace ckpt::loader

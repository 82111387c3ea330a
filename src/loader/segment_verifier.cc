#include "loader/segment_verifier.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <map>
#include <utility>

#include "common/thread_pool.h"

namespace ckpt::loader {

Result<VerifyReport> VerifySegment(const shm::SegmentReader& segment, int threads,
                                   const std::atomic<bool>* cancel, size_t max_listed) {
  if (threads < 1) return InvalidArgument("verify needs at least one thread");
  const auto start = std::chrono::steady_clock::now();
  const auto& tensors = segment.tensors();
  // Tied tensors (aliases) share their bytes: each stored range is hashed once.
  std::vector<size_t> order;
  std::vector<size_t> first_of(tensors.size());
  std::map<std::pair<const std::byte*, uint64_t>, size_t> first_at;  // (bytes, size): a
  for (size_t i = 0; i < tensors.size(); ++i) {                       // 0-byte tensor may share an address
    auto [it, fresh] = first_at.emplace(std::make_pair(segment.tensor_data(i), tensors[i].nbytes), i);
    first_of[i] = it->second;
    if (fresh) order.push_back(i);
  }
  // Biggest tensors first so that the threads finish together.
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
    if (first_of[i] == i) report.bytes += tensors[i].nbytes;
    const size_t f = first_of[i];
    const bool mismatch = bad[f].load() || tensors[i].checksum != tensors[f].checksum;
    if (!mismatch) continue;
    ++report.mismatch_count;
    if (report.mismatched.size() < max_listed) report.mismatched.push_back(tensors[i].name);
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace ckpt::loader

#include "loader/pread_reader.h"

#include "common/thread_pool.h"

namespace ckpt::loader {

Result<std::unique_ptr<PreadReader>> PreadReader::Create(const ReaderOptions& options) {
  if (options.threads < 1) return InvalidArgument("reader threads must be at least 1");
  if (options.chunk_bytes == 0 || options.chunk_bytes % 4096 != 0) {
    return InvalidArgument("read chunk must be a positive multiple of 4096 bytes");
  }
  return std::unique_ptr<PreadReader>(new PreadReader(options));
}

std::string PreadReader::Describe() const { return "pread x" + std::to_string(options_.threads); }

Status PreadReader::ReadAll(const std::vector<SourceFile>& files, const std::vector<ReadOp>& ops,
                            const std::function<void(size_t)>& on_done, const std::function<void()>& tick) {
  for (const ReadOp& op : ops) {
    if (op.length > options_.chunk_bytes || op.file >= files.size()) return InvalidArgument("read op out of bounds");
  }
  std::atomic<size_t> next{0};
  const int threads = static_cast<int>(std::min<size_t>(options_.threads, std::max<size_t>(ops.size(), 1)));
  return RunWorkers(
      threads,
      [&](int, const std::atomic<bool>& stop) -> Status {
        AlignedBuffer bounce;
        for (size_t i; !stop.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < ops.size();) {
          if (options_.cancel && options_.cancel->load()) return FailedPrecondition("load cancelled");
          const ReadOp& op = ops[i];
          if (op.mode == ReadMode::kBounce && !bounce.Reserve(BounceBytes(options_.chunk_bytes), kMaxDirectAlignment)) {
            return ResourceExhausted("no memory for a read buffer");
          }
          CKPT_RETURN_IF_ERROR(FinishRead(op, files[op.file], bounce.data(), 0));
          on_done(i);
        }
        return Status::Ok();
      },
      tick);
}

}  // namespace ckpt::loader

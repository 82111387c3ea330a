// FileReader: executes a list of ReadOps (see read_op.h) with several threads. Two
// engines: a pool of threads doing blocking preads, and io_uring (one ring per thread,
// several reads in flight each). tools/bench_load picks between them by measurement.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/status.h"
#include "loader/read_op.h"

namespace ckpt::loader {

enum class ReadEngine { kPread, kUring };

// "pread" or "io_uring".
const char* ReadEngineName(ReadEngine engine);
// Parses ReadEngineName's names; InvalidArgument otherwise.
Result<ReadEngine> ParseReadEngine(const std::string& name);

struct ReaderOptions {
  int threads = 8;                      // reader threads
  int queue_depth = 4;                  // io_uring: reads in flight per thread
  uint64_t chunk_bytes = 16ull << 20;   // the longest op; sizes the bounce buffers
  const std::atomic<bool>* cancel = nullptr;  // checked before each op is started
};

class FileReader {
 public:
  // InvalidArgument for bad options; Unsupported if the engine does not work on this
  // kernel (io_uring disabled or missing).
  static Result<std::unique_ptr<FileReader>> Create(ReadEngine engine, const ReaderOptions& options);
  virtual ~FileReader() = default;

  // Executes each op once (ops longer than chunk_bytes are refused with InvalidArgument).
  // on_done(i) runs on the reader thread that completed op i, right after its bytes are in
  // place; it may do heavy work (a checksum) while other reads stay in flight, and must be
  // thread-safe. tick() runs on the calling thread about every 100 ms. Returns the first
  // error (see FinishRead) after every started read has ended, or FailedPrecondition
  // "load cancelled" once options.cancel is set. Not reentrant: one ReadAll at a time.
  virtual Status ReadAll(const std::vector<SourceFile>& files, const std::vector<ReadOp>& ops,
                         const std::function<void(size_t)>& on_done, const std::function<void()>& tick) = 0;
  // For logs: "pread x8", "io_uring 2 x qd 4".
  virtual std::string Describe() const = 0;
};

}  // namespace ckpt::loader

#include "loader/checkpoint_loader.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "common/io.h"
#include "loader/strided_copy.h"
#include "shm/segment_reader.h"

namespace ckpt::loader {
namespace {

struct ReadChunk {
  size_t tensor;
  uint64_t offset;  // within the tensor
  uint64_t length;
};

// Runs `work(i)` for i in [0, n) on `threads` threads; stops handing out work after the
// first error and returns it.
Status ParallelFor(size_t n, int threads, const std::atomic<bool>* cancel,
                   const std::function<Status(size_t)>& work, const std::function<void()>& tick) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::condition_variable cv;
  Status first_error;
  const int thread_count = std::max(1, std::min<int>(threads, static_cast<int>(std::max<size_t>(n, 1))));
  int running = thread_count;  // guarded by mu
  std::vector<std::thread> pool;
  for (int t = 0; t < thread_count; ++t) {
    pool.emplace_back([&] {
      for (size_t i; !failed.load() && (i = next.fetch_add(1)) < n;) {
        if (cancel && cancel->load()) {
          std::lock_guard<std::mutex> lock(mu);
          if (!failed.exchange(true)) first_error = FailedPrecondition("load cancelled");
          break;
        }
        Status st = work(i);
        if (!st.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          if (!failed.exchange(true)) first_error = st;
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      --running;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    while (running > 0) {
      cv.wait_for(lock, std::chrono::milliseconds(100));
      if (tick) {
        lock.unlock();
        tick();
        lock.lock();
      }
    }
  }
  for (auto& th : pool) th.join();
  return first_error;
}

}  // namespace

Result<LoadedSegment> LoadIntoSegment(const format::LoadPlan& plan, shm::SegmentSpec spec,
                                      const LoadOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  std::unordered_set<std::string> names;
  spec.tensors.clear();
  spec.alias_of.clear();
  for (const auto& t : plan.tensors) {
    if (!names.insert(t.name).second) return InvalidArgument("duplicate tensor name '" + t.name + "'");
    if (t.file_index >= plan.files.size()) return Internal("plan names a file it does not list");
    TensorInfo info;
    info.name = t.name;
    info.dtype = t.dtype;
    info.shape = t.shape;
    info.nbytes = t.nbytes;
    spec.tensors.push_back(std::move(info));
    spec.alias_of.push_back(t.alias_of);
  }

  std::vector<UniqueFd> files;
  for (const auto& path : plan.files) {
    CKPT_ASSIGN_OR_RETURN(UniqueFd fd, OpenForRead(path));
    files.push_back(std::move(fd));
  }

  CKPT_ASSIGN_OR_RETURN(auto writer, shm::SegmentWriter::Create(spec));

  std::vector<ReadChunk> chunks;
  const uint64_t chunk_bytes = std::max<uint64_t>(options.chunk_bytes, 1 << 20);
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    if (plan.tensors[i].alias_of >= 0) continue;  // shares an earlier tensor's bytes
    if (!plan.tensors[i].strides.empty()) {       // a view: read and gathered as one job
      chunks.push_back({i, 0, plan.tensors[i].nbytes});
      continue;
    }
    for (uint64_t off = 0; off < plan.tensors[i].nbytes; off += chunk_bytes) {
      chunks.push_back({i, off, std::min(chunk_bytes, plan.tensors[i].nbytes - off)});
    }
  }
  const uint64_t total = plan.TotalBytes();
  std::atomic<uint64_t> done{0};
  auto report = [&] {
    if (options.progress) options.progress(done.load(), total);
  };

  Status st = ParallelFor(
      chunks.size(), options.threads, options.cancel,
      [&](size_t c) {
        const ReadChunk& chunk = chunks[c];
        const format::PlannedTensor& t = plan.tensors[chunk.tensor];
        if (!t.strides.empty()) {
          CKPT_RETURN_IF_ERROR(ReadStridedTensor(files[t.file_index].get(), plan.files[t.file_index], t,
                                                 writer->tensor_data(chunk.tensor)));
          done.fetch_add(chunk.length);
          return Status::Ok();
        }
        CKPT_RETURN_IF_ERROR(PreadFull(files[t.file_index].get(),
                                       writer->tensor_data(chunk.tensor) + chunk.offset, chunk.length,
                                       t.file_offset + chunk.offset, plan.files[t.file_index]));
        done.fetch_add(chunk.length);
        return Status::Ok();
      },
      report);
  CKPT_RETURN_IF_ERROR(st);

  std::vector<uint64_t> checksums(spec.tensors.size());
  CKPT_RETURN_IF_ERROR(ParallelFor(
      spec.tensors.size(), options.threads, options.cancel,
      [&](size_t i) {
        if (spec.alias_of[i] < 0) checksums[i] = shm::Checksum(writer->tensor_data(i), spec.tensors[i].nbytes);
        return Status::Ok();
      },
      nullptr));
  for (size_t i = 0; i < checksums.size(); ++i) {
    if (spec.alias_of[i] >= 0) checksums[i] = checksums[spec.alias_of[i]];
  }
  report();

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CKPT_RETURN_IF_ERROR(writer->Publish(checksums, static_cast<uint64_t>(seconds * 1e9)));

  LoadedSegment out;
  out.shm_name = writer->shm_name();
  out.segment_bytes = writer->segment_bytes();
  out.data_bytes = total;
  out.seconds = seconds;
  out.tensors = std::move(spec.tensors);
  for (size_t i = 0; i < checksums.size(); ++i) out.tensors[i].checksum = checksums[i];
  return out;
}

}  // namespace ckpt::loader

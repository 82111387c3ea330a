#include "cuda/copy_engine.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>

#include "cuda/convert_kernels.h"
#include "cuda/copy_split.h"
#include "cuda/copy_tasks.h"
#include "cuda/cuda_resources.h"

namespace ckpt::cuda {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

cudaError_t CopyH2D(const std::byte* src, uint64_t spitch, std::byte* dst, uint64_t dpitch, uint64_t w, uint64_t h,
                    cudaStream_t stream) {
  if (w == 0 || h == 0) return cudaSuccess;
  return h == 1 ? cudaMemcpyAsync(dst, src, w, cudaMemcpyHostToDevice, stream)
                : cudaMemcpy2DAsync(dst, dpitch, src, spitch, w, h, cudaMemcpyHostToDevice, stream);
}

// The state every worker of one RunCopyJobs shares.
class CopyRun {
 public:
  CopyRun(const std::vector<CopyJob>& jobs, int device, const GpuLoadOptions& options)
      : jobs_(jobs), device_(device), options_(options), chunk_(ChunkBytes(options)) {}

  Result<CopyResult> Go(GpuLoadStats* stats);

 private:
  // A worker: its stream, its overflow flag, its part of the bounce slab and scratch.
  // The stream is declared last, so destroyed (after synchronising) first.
  struct Worker {
    int* flag = nullptr;
    std::byte* pinned[2] = {nullptr, nullptr};
    Event done[2];
    int which = 0;
    DeviceBuffer scratch;
    Stream stream;
  };
  void Fail(Status s);
  void WorkerLoop(Worker& w);
  Status RunTask(Worker& w, const Task& t);
  Status CopyRect(Worker& w, const CopyJob& j, const CopyRegion& r, const Rect& x);
  Status NeedScratch(Worker& w, uint64_t bytes);
  bool WaitRegistered(const Task& t);
  void RegisterLoop();

  const std::vector<CopyJob>& jobs_;
  const int device_;
  const GpuLoadOptions& options_;
  const uint64_t chunk_;
  std::vector<Task> tasks_;
  std::atomic<size_t> next_task_{0};
  std::atomic<uint64_t> copied_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> abort_{false};
  Status first_error_;  // guarded by mu_

  // kRegister only. bounds_: group begins (sorted), where copies must be split.
  std::vector<Group> groups_;
  std::vector<uint64_t> bounds_;
  std::vector<char> group_done_;  // guarded by mu_
  std::vector<HostRegistration> registrations_;  // guarded by mu_
  std::atomic<size_t> next_group_{0};
  std::atomic<uint64_t> registered_bytes_{0};
};

void CopyRun::Fail(Status s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (first_error_.ok()) first_error_ = std::move(s);
  abort_ = true;
  cv_.notify_all();
}

void CopyRun::RegisterLoop() {
  cudaSetDevice(device_);
  for (size_t g = next_group_++; g < groups_.size() && !abort_; g = next_group_++) {
    auto reg = HostRegistration::Register(reinterpret_cast<void*>(groups_[g].begin), groups_[g].end - groups_[g].begin);
    // A range the driver refuses is copied from pageable memory instead (slower, still
    // correct); registered_bytes in the stats shows it.
    std::lock_guard<std::mutex> lock(mu_);
    if (reg.ok()) {
      registered_bytes_ += groups_[g].end - groups_[g].begin;
      registrations_.push_back(std::move(*reg));
    }
    group_done_[g] = 1;
    cv_.notify_all();
  }
}

// Waits until every group the task reads is registered; false if the run was aborted.
bool CopyRun::WaitRegistered(const Task& t) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] {
    if (abort_) return true;
    for (size_t g = t.reg_first; g <= t.reg_last; ++g)
      if (!group_done_[g]) return false;
    return true;
  });
  return !abort_;
}

Status CopyRun::NeedScratch(Worker& w, uint64_t bytes) {
  if (w.scratch.size() >= bytes) return Status::Ok();
  CKPT_CUDA_RETURN("cudaStreamSynchronize", cudaStreamSynchronize(w.stream.get()));
  w.scratch.Reset();
  CKPT_ASSIGN_OR_RETURN(w.scratch, DeviceBuffer::Allocate(bytes));
  return Status::Ok();
}

// Copies rectangle x of region r of job j: straight to the output, or (conversion) to
// scratch and converted from there into the output, or (transpose) to its place in
// scratch, which holds the whole piece.
Status CopyRun::CopyRect(Worker& w, const CopyJob& j, const CopyRegion& r, const Rect& x) {
  const uint64_t esize = DTypeSize(j.from);
  const bool direct = !j.transpose && j.from == j.to;
  const uint64_t w_bytes = x.c1 - x.c0, h = x.r1 - x.r0;
  const std::byte* src = j.src + r.src_offset + x.r0 * r.src_pitch + x.c0;
  const uint64_t dst_rel = r.dst_offset + x.r0 * r.dst_pitch + x.c0;  // in the piece, source dtype bytes
  std::byte* dst;
  uint64_t dpitch;
  if (direct) {
    dst = j.out + j.piece_first_elem * esize + dst_rel;
    dpitch = r.dst_pitch;
  } else if (j.transpose) {
    dst = static_cast<std::byte*>(w.scratch.get()) + dst_rel;
    dpitch = r.dst_pitch;
  } else {
    dst = static_cast<std::byte*>(w.scratch.get());
    dpitch = w_bytes;
  }
  cudaError_t err;
  if (options_.path == HostPath::kBounce) {
    CKPT_CUDA_RETURN("cudaEventSynchronize", cudaEventSynchronize(w.done[w.which].get()));
    std::byte* buf = w.pinned[w.which];
    if (h == 1 || w_bytes == r.src_pitch) {
      std::memcpy(buf, src, w_bytes * h);
    } else {
      for (uint64_t row = 0; row < h; ++row) std::memcpy(buf + row * w_bytes, src + row * r.src_pitch, w_bytes);
    }
    err = CopyH2D(buf, w_bytes, dst, dpitch, w_bytes, h, w.stream.get());
    if (err == cudaSuccess) err = cudaEventRecord(w.done[w.which].get(), w.stream.get());
    w.which ^= 1;
  } else {
    // The driver refuses a copy whose source spans two registrations: split at bounds_.
    err = static_cast<cudaError_t>(SplitAtBounds(
        reinterpret_cast<uint64_t>(src), r.src_pitch, w_bytes, h, bounds_,
        [&](uint64_t r0, uint64_t c0, uint64_t cw, uint64_t rows) {
          return static_cast<int>(
              CopyH2D(src + r0 * r.src_pitch + c0, r.src_pitch, dst + r0 * dpitch + c0, dpitch, cw, rows, w.stream.get()));
        }));
  }
  if (err != cudaSuccess) return CudaError("copy of '" + *j.name + "'", err);
  copied_ += w_bytes * h;
  if (!direct && !j.transpose) {
    return LaunchConvertRows(j.from, j.to, w.scratch.get(), w_bytes / esize, h, j.out,
                             j.piece_first_elem + dst_rel / esize, r.dst_pitch / esize, w.flag, j.tag, w.stream.get());
  }
  return Status::Ok();
}

Status CopyRun::RunTask(Worker& w, const Task& t) {
  const CopyJob& j = jobs_[t.job];
  if (t.region >= 0) {
    if (j.from != j.to) CKPT_RETURN_IF_ERROR(NeedScratch(w, chunk_));
    return CopyRect(w, j, j.layout->regions[static_cast<size_t>(t.region)], t.rect);
  }
  // A transposed piece: every region into scratch, then the transpose kernel.
  CKPT_RETURN_IF_ERROR(NeedScratch(w, j.layout->nbytes));
  for (const CopyRegion& r : j.layout->regions) {
    if (r.rows == 0 || r.row_bytes == 0) continue;
    Status st;
    ForEachRect(r, chunk_, [&](const Rect& x) {
      if (st.ok() && !abort_) st = CopyRect(w, j, r, x);
    });
    CKPT_RETURN_IF_ERROR(st);
  }
  const uint64_t esize = DTypeSize(j.from);
  const auto& shape = j.layout->shape;
  const uint64_t rows = shape[0], cols = j.layout->nbytes / esize / std::max<uint64_t>(rows, 1);
  const uint64_t row0 = j.piece_first_elem / std::max<uint64_t>(cols, 1);
  return LaunchTranspose(j.from, j.to, w.scratch.get(), rows, cols, j.out, j.out_rows, row0, w.flag, j.tag,
                         w.stream.get());
}

void CopyRun::WorkerLoop(Worker& w) {
  cudaSetDevice(device_);
  for (size_t i = next_task_++; i < tasks_.size() && !abort_; i = next_task_++) {
    const Task& t = tasks_[i];
    if (options_.path == HostPath::kRegister && !WaitRegistered(t)) return;
    if (Status s = RunTask(w, t); !s.ok()) return Fail(s.WithContext("output '" + *jobs_[t.job].name + "'"));
  }
  cudaError_t err = cudaStreamSynchronize(w.stream.get());
  if (err != cudaSuccess) Fail(CudaError("cudaStreamSynchronize", err));
}

Result<CopyResult> CopyRun::Go(GpuLoadStats* stats) {
  const auto g0 = Clock::now();
  CurrentDeviceGuard keep_callers_device;
  CKPT_CUDA_RETURN("cudaSetDevice", cudaSetDevice(device_));
  tasks_ = CutIntoTasks(jobs_, chunk_);
  const bool do_register = options_.path == HostPath::kRegister;
  if (do_register) {
    groups_ = PlanGroups(tasks_, static_cast<uint64_t>(sysconf(_SC_PAGESIZE)), options_.register_group_bytes);
    for (const Group& g : groups_) bounds_.push_back(g.begin);
    group_done_.assign(groups_.size(), 0);
  }

  // Resources, before any thread starts and with no work in flight until then (an early
  // return frees nothing a copy still uses): the overflow flags (zeroed synchronously),
  // the bounce slab, streams and events.
  const int nworkers = std::max(1, std::min<int>(options_.streams, static_cast<int>(tasks_.size())));
  const size_t n = static_cast<size_t>(nworkers);
  CKPT_ASSIGN_OR_RETURN(DeviceBuffer flags, DeviceBuffer::Allocate(n * sizeof(int)));
  CKPT_CUDA_RETURN("cudaMemset", cudaMemset(flags.get(), 0, n * sizeof(int)));
  PinnedBuffer slab;
  const bool bounce = options_.path == HostPath::kBounce;
  if (bounce) {
    CKPT_ASSIGN_OR_RETURN(slab, PinnedBuffer::Allocate(n * 2 * chunk_));
  }
  std::vector<Worker> workers(n);
  for (size_t i = 0; i < n; ++i) {
    Worker& w = workers[i];
    CKPT_ASSIGN_OR_RETURN(w.stream, Stream::Create());
    w.flag = static_cast<int*>(flags.get()) + i;
    if (bounce) {
      for (size_t k = 0; k < 2; ++k) {
        w.pinned[k] = slab.get() + (i * 2 + k) * chunk_;
        CKPT_ASSIGN_OR_RETURN(w.done[k], Event::Create());
      }
    }
  }

  stats->setup_seconds += Since(g0);
  const auto r0 = Clock::now();
  std::vector<std::thread> registrars, threads;
  try {
    if (do_register) {
      const int nreg = std::max(1, std::min<int>(options_.register_threads, static_cast<int>(groups_.size())));
      for (int t = 0; t < nreg; ++t) registrars.emplace_back([this] { RegisterLoop(); });
    }
    for (Worker& w : workers) threads.emplace_back([this, &w] { WorkerLoop(w); });
  } catch (const std::system_error& e) {  // no thread: stop the ones started, report it
    Fail(ResourceExhausted(std::string("starting a copy thread: ") + e.what()));
  }
  for (auto& t : threads) t.join();  // a failed worker set abort_, which stops the registrars
  for (auto& t : registrars) t.join();
  stats->register_seconds = do_register ? Since(r0) : 0;
  stats->registered_bytes = registered_bytes_;
  // Every stream is idle: each worker synchronised its stream before returning, or
  // failed, in which case synchronise here before the buffers it used go away.
  for (Worker& w : workers) cudaStreamSynchronize(w.stream.get());
  const auto u0 = Clock::now();
  registrations_.clear();
  stats->unregister_seconds = Since(u0);
  if (!first_error_.ok()) return first_error_;

  CopyResult result;
  std::vector<int> tags(n);
  CKPT_CUDA_RETURN("reading the overflow flags",
                   cudaMemcpy(tags.data(), flags.get(), n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int tag : tags) {
    if (tag != 0 && result.overflow_tag == 0) result.overflow_tag = tag;
  }
  stats->copied_bytes = copied_;
  return result;
}

}  // namespace

uint64_t ChunkBytes(const GpuLoadOptions& options) {
  if (options.chunk_bytes != 0) return options.chunk_bytes;
  return options.path == HostPath::kBounce ? uint64_t{1} << 20 : uint64_t{16} << 20;
}

Result<CopyResult> RunCopyJobs(const std::vector<CopyJob>& jobs, int device, const GpuLoadOptions& options,
                               GpuLoadStats* stats) {
  CopyRun run(jobs, device, options);
  return run.Go(stats);
}

}  // namespace ckpt::cuda

#include "cuda/copy_engine.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
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
  // Rows packed on both sides (a bounce buffer into a dense output, e.g. a row-parallel
  // shard of whole rows) are one flat copy: a 2D copy of short rows is slower on the DMA
  // engine.
  if (h == 1 || (spitch == w && dpitch == w)) return cudaMemcpyAsync(dst, src, w * h, cudaMemcpyHostToDevice, stream);
  return cudaMemcpy2DAsync(dst, dpitch, src, spitch, w, h, cudaMemcpyHostToDevice, stream);
}

}  // namespace

constexpr int kMaxBuffers = 8;

// CKPT_COPY_LOCK=whole (an experiment knob): the bounce slab page-locked in one
// cudaHostRegister before any worker is ready, instead of each worker's part on its own.
bool LockWholeSlab() {
  const char* v = std::getenv("CKPT_COPY_LOCK");
  return v && std::strcmp(v, "whole") == 0;
}

// One worker's resources, kept across runs. The stream is declared last, so destroyed
// (after synchronising) first.
struct WorkerRes {
  int* flag = nullptr;  // on the device
  std::byte* pinned[kMaxBuffers] = {};
  Event done[kMaxBuffers];
  DeviceBuffer scratch;  // conversions and transposes; freed at the end of every run
  Stream stream;
};

class CopyResources {
 public:
  CopyResources(int device, const GpuLoadOptions& options)
      : device_(device),
        bounce_(options.path == HostPath::kBounce),
        nworkers_(std::max(1, options.streams)),
        chunk_(ChunkBytes(options)),
        nbuf_(BounceBuffers()),
        lock_whole_(LockWholeSlab()),
        workers_(static_cast<size_t>(nworkers_)) {}
  ~CopyResources() {
    if (prep_.joinable()) prep_.join();
  }
  CopyResources(const CopyResources&) = delete;
  CopyResources& operator=(const CopyResources&) = delete;

  // Prepares on a background thread, worker by worker (a run uses each as soon as it is
  // ready); where no thread can be started, Begin does it.
  void StartBackground() {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = true;
    try {
      prep_ = std::thread([this] { RunPrepare(); });
    } catch (const std::system_error&) {
      running_ = false;
    }
  }
  // Before a run: OK while the background preparation runs or after it succeeded; else
  // (it failed, or never ran) prepares on the calling thread, whose current device must
  // be device_, and returns that preparation's error.
  Status Begin() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (running_) return Status::Ok();
    }
    if (prep_.joinable()) prep_.join();
    if (status_.ok()) return status_;
    RunPrepare();
    return status_;
  }
  // Waits until worker i is ready (OK, *gave_up false), the preparation failed before
  // it (its error), or give_up() is true (OK, *gave_up true).
  template <typename F>
  Status WaitWorker(size_t i, F&& give_up, bool* gave_up) {
    *gave_up = false;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (ready_ > i) return Status::Ok();
      if (!running_) return status_.ok() ? Internal("copy worker " + std::to_string(i) + " never prepared") : status_;
      if (give_up()) {
        *gave_up = true;
        return Status::Ok();
      }
      cv_.wait_for(lock, std::chrono::microseconds(200));
    }
  }

  int device() const { return device_; }
  int workers() const { return nworkers_; }
  int buffers() const { return nbuf_; }
  int* flags() const { return static_cast<int*>(flags_.get()); }  // one per worker; valid once one is ready
  size_t ready() {
    std::lock_guard<std::mutex> lock(mu_);
    return ready_;
  }
  double prep_seconds() {  // of the last preparation that finished; -1 while one runs
    std::lock_guard<std::mutex> lock(mu_);
    return running_ ? -1 : prep_seconds_;
  }
  // Precondition: worker i is ready (WaitWorker) or is only addressed, not touched.
  WorkerRes& worker(size_t i) { return workers_[i]; }

 private:
  void RunPrepare() {
    const auto t0 = Clock::now();
    Status st = Prepare();
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(st);
    prep_seconds_ = Since(t0);
    running_ = false;
    cv_.notify_all();
  }
  // Runs with no run using the workers, or (background) with runs using only the
  // workers marked ready, which it never touches again.
  Status Prepare() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_ = 0;
    }
    for (WorkerRes& w : workers_) w = WorkerRes();
    slab_.Reset();
    flags_.Reset();
    CKPT_CUDA_RETURN("cudaSetDevice", cudaSetDevice(device_));
    const size_t n = static_cast<size_t>(nworkers_);
    CKPT_ASSIGN_OR_RETURN(flags_, DeviceBuffer::Allocate(n * sizeof(int)));
    // Each worker's buffers lie in their own whole 4 KiB pages, page-locked as one range
    // just before the worker is marked ready, so that the first workers copy while the
    // later ranges are being locked.
    uint64_t stride = 0;
    if (bounce_) {
      constexpr uint64_t kPage = 4096;
      const uint64_t per = uint64_t(nbuf_) * chunk_;
      if (chunk_ == 0 || per / chunk_ != uint64_t(nbuf_) || per > (uint64_t{1} << 40) / n)
        return InvalidArgument("bounce buffers of " + std::to_string(chunk_) + " bytes x " + std::to_string(nbuf_) +
                               " x " + std::to_string(n) + " workers are too large");
      stride = (per + kPage - 1) / kPage * kPage;
      CKPT_ASSIGN_OR_RETURN(slab_, PinnedBuffer::Map(n * stride, nworkers_));
      if (lock_whole_) CKPT_RETURN_IF_ERROR(slab_.Lock(0, n * stride));
    }
    for (size_t i = 0; i < n; ++i) {
      WorkerRes& w = workers_[i];
      CKPT_ASSIGN_OR_RETURN(w.stream, Stream::Create());
      w.flag = flags() + i;
      if (bounce_) {
        if (!lock_whole_) CKPT_RETURN_IF_ERROR(slab_.Lock(i * stride, stride));
        for (size_t k = 0; k < static_cast<size_t>(nbuf_); ++k) {
          w.pinned[k] = slab_.get() + i * stride + k * chunk_;
          CKPT_ASSIGN_OR_RETURN(w.done[k], Event::Create());
        }
      }
      std::lock_guard<std::mutex> lock(mu_);
      ready_ = i + 1;
      cv_.notify_all();
    }
    return Status::Ok();
  }

  const int device_;
  const bool bounce_;
  const int nworkers_;
  const uint64_t chunk_;
  const int nbuf_;
  const bool lock_whole_;  // CKPT_COPY_LOCK=whole: the slab page-locked in one call, not per worker
  std::thread prep_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool running_ = false;                                                    // guarded by mu_
  size_t ready_ = 0;                                                        // guarded by mu_: workers [0, ready_)
  Status status_ = FailedPrecondition("copy resources not prepared");       // guarded by mu_ while running_
  double prep_seconds_ = 0;                                                 // guarded by mu_
  DeviceBuffer flags_;
  PinnedBuffer slab_;
  std::vector<WorkerRes> workers_;  // sized once; declared last: destroyed (streams synchronised) first
};

namespace {

// The state every worker of one RunCopyJobs shares.
class CopyRun {
 public:
  CopyRun(const std::vector<CopyJob>& jobs, const CopyDestination& dest, int device, const GpuLoadOptions& options)
      : jobs_(jobs), dest_(dest), device_(device), options_(options), chunk_(ChunkBytes(options)) {}

  Result<CopyResult> Go(GpuLoadStats* stats, CopyResources* resources);

 private:
  // One worker in this run: its resources and where it is in its ring of buffers.
  struct Lane {
    size_t index = 0;
    WorkerRes* r = nullptr;  // touched only once `active`
    bool active = false;     // the worker was ready before the tasks ran out
    int which = 0;
    double first_issue = -1, end = 0;  // seconds since the run started (trace)
    double ready = 0;                  // when its resources were ready, since the run started
    // Seconds spent (trace): copying into bounce buffers (gather tasks / packed ones),
    // waiting for a buffer's last copy to be read, issuing copies.
    double gather_s = 0, packed_s = 0, wait_s = 0, issue_s = 0;
    uint64_t gather_bytes = 0;
  };
  void Fail(Status s);
  static Status Aborted();
  void WorkerLoop(Lane& w);
  Status RunTask(Lane& w, const Task& t);
  Status CopyRect(Lane& w, const CopyJob& j, const CopyRegion& r, const Rect& x);
  Status NeedScratch(Lane& w, uint64_t bytes);
  bool WaitRegistered(const Task& t);
  bool WaitBase();
  void RegisterLoop();

  const std::vector<CopyJob>& jobs_;
  const CopyDestination& dest_;
  const int device_;
  const GpuLoadOptions& options_;
  const uint64_t chunk_;
  CopyResources* res_ = nullptr;
  int nbuf_ = 2;
  bool needs_flags_ = false;
  Clock::time_point t0_;
  std::vector<Task> tasks_;
  std::vector<size_t> order_;  // the order in which tasks are taken
  std::atomic<size_t> next_task_{0};
  std::atomic<uint64_t> copied_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> abort_{false};
  Status first_error_;  // guarded by mu_
  // The outputs' device memory: set before any copy reaches the device.
  std::atomic<std::byte*> base_{nullptr};
  double base_at_ = 0;  // when it was set, since the run started (trace)

  // kRegister only. bounds_: group begins (sorted), where copies must be split.
  std::vector<Group> groups_;
  std::vector<uint64_t> bounds_;
  std::vector<char> group_done_;  // guarded by mu_
  std::vector<HostRegistration> registrations_;  // guarded by mu_
  std::atomic<size_t> next_group_{0};
  std::atomic<uint64_t> registered_bytes_{0};
};

// What a worker returns when it stops because another part of the run failed (Fail keeps
// the first error, so this is never the run's).
Status CopyRun::Aborted() { return Internal("the copy run was stopped by an earlier error"); }

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

// Waits until the outputs' device memory exists; false if the run was aborted.
bool CopyRun::WaitBase() {
  if (base_.load(std::memory_order_acquire)) return true;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return abort_ || base_.load(std::memory_order_acquire) != nullptr; });
  return !abort_;
}

Status CopyRun::NeedScratch(Lane& w, uint64_t bytes) {
  DeviceBuffer& scratch = w.r->scratch;
  if (scratch.size() >= bytes) return Status::Ok();
  CKPT_CUDA_RETURN("cudaStreamSynchronize", cudaStreamSynchronize(w.r->stream.get()));
  scratch.Reset();
  CKPT_ASSIGN_OR_RETURN(scratch, DeviceBuffer::Allocate(bytes));
  return Status::Ok();
}

// Copies rectangle x of region r of job j: straight to the output, or (conversion) to
// scratch and converted from there into the output, or (transpose) to its place in
// scratch, which holds the whole piece. On the bounce path the rectangle is gathered
// into the buffer before the outputs' device memory is waited for (CopyDestination).
Status CopyRun::CopyRect(Lane& w, const CopyJob& j, const CopyRegion& r, const Rect& x) {
  const uint64_t esize = DTypeSize(j.from);
  const bool direct = !j.transpose && j.from == j.to;
  const uint64_t w_bytes = x.c1 - x.c0, h = x.r1 - x.r0;
  const std::byte* src = j.src + r.src_offset + x.r0 * r.src_pitch + x.c0;
  const uint64_t dst_rel = r.dst_offset + x.r0 * r.dst_pitch + x.c0;  // in the piece, source dtype bytes
  cudaStream_t stream = w.r->stream.get();
  // Where the copy lands; the output's address only once WaitBase returned true.
  auto destination = [&](uint64_t* dpitch) -> std::byte* {
    if (direct) {
      *dpitch = r.dst_pitch;
      return base_.load(std::memory_order_acquire) + j.out_offset + j.piece_first_elem * esize + dst_rel;
    }
    if (j.transpose) {
      *dpitch = r.dst_pitch;
      return static_cast<std::byte*>(w.r->scratch.get()) + dst_rel;
    }
    *dpitch = w_bytes;
    return static_cast<std::byte*>(w.r->scratch.get());
  };
  uint64_t dpitch = 0;
  cudaError_t err;
  if (options_.path == HostPath::kBounce) {
    // The oldest of the worker's buffers: wait until its last copy has been read.
    Event& done = w.r->done[w.which];
    const auto c0 = Clock::now();
    CKPT_CUDA_RETURN("cudaEventSynchronize", cudaEventSynchronize(done.get()));
    const auto c1 = Clock::now();
    std::byte* buf = w.r->pinned[w.which];
    const bool gather = h > 1 && w_bytes != r.src_pitch;
    if (!gather) {
      std::memcpy(buf, src, w_bytes * h);
    } else {
      for (uint64_t row = 0; row < h; ++row) std::memcpy(buf + row * w_bytes, src + row * r.src_pitch, w_bytes);
    }
    const auto c2 = Clock::now();
    if (!WaitBase()) return Aborted();
    const auto c3 = Clock::now();
    std::byte* dst = destination(&dpitch);
    err = CopyH2D(buf, w_bytes, dst, dpitch, w_bytes, h, stream);
    if (err == cudaSuccess) err = cudaEventRecord(done.get(), stream);
    w.which = (w.which + 1) % nbuf_;
    const auto c4 = Clock::now();
    auto secs = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
    w.wait_s += secs(c1 - c0);
    (gather ? w.gather_s : w.packed_s) += secs(c2 - c1);
    if (gather) w.gather_bytes += w_bytes * h;
    w.issue_s += secs(c4 - c3);
  } else {
    if (!WaitBase()) return Aborted();
    std::byte* dst = destination(&dpitch);
    // The driver refuses a copy whose source spans two registrations: split at bounds_.
    err = static_cast<cudaError_t>(SplitAtBounds(
        reinterpret_cast<uint64_t>(src), r.src_pitch, w_bytes, h, bounds_,
        [&](uint64_t r0, uint64_t c0, uint64_t cw, uint64_t rows) {
          return static_cast<int>(
              CopyH2D(src + r0 * r.src_pitch + c0, r.src_pitch, dst + r0 * dpitch + c0, dpitch, cw, rows, stream));
        }));
  }
  if (err != cudaSuccess) return CudaError("copy of '" + *j.name + "'", err);
  if (w.first_issue < 0) w.first_issue = Since(t0_);
  copied_ += w_bytes * h;
  if (!direct && !j.transpose) {
    return LaunchConvertRows(j.from, j.to, w.r->scratch.get(), w_bytes / esize, h,
                             base_.load(std::memory_order_acquire) + j.out_offset,
                             j.piece_first_elem + dst_rel / esize, r.dst_pitch / esize, w.r->flag, j.tag, stream);
  }
  return Status::Ok();
}

Status CopyRun::RunTask(Lane& w, const Task& t) {
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
  if (!WaitBase()) return Aborted();
  return LaunchTranspose(j.from, j.to, w.r->scratch.get(), rows, cols,
                         base_.load(std::memory_order_acquire) + j.out_offset, j.out_rows, row0, w.r->flag, j.tag,
                         w.r->stream.get());
}

void CopyRun::WorkerLoop(Lane& w) {
  cudaSetDevice(device_);
  // Start as soon as this worker's resources are ready; none left to take: not needed.
  bool gave_up = false;
  Status ready = res_->WaitWorker(w.index, [&] { return abort_.load() || next_task_.load() >= order_.size(); }, &gave_up);
  if (!ready.ok()) return Fail(ready);
  if (gave_up) return;
  w.active = true;
  w.ready = Since(t0_);
  w.r = &res_->worker(w.index);
  cudaStream_t stream = w.r->stream.get();
  if (needs_flags_) {
    if (cudaError_t e = cudaMemsetAsync(w.r->flag, 0, sizeof(int), stream); e != cudaSuccess)
      return Fail(CudaError("cudaMemsetAsync", e));
  }
  for (size_t i = next_task_++; i < order_.size() && !abort_; i = next_task_++) {
    const Task& t = tasks_[order_[i]];
    if (options_.path == HostPath::kRegister && !WaitRegistered(t)) break;
    if (Status s = RunTask(w, t); !s.ok()) {
      Fail(s.WithContext("output '" + *jobs_[t.job].name + "'"));
      break;
    }
  }
  cudaError_t err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) Fail(CudaError("cudaStreamSynchronize", err));
  w.end = Since(t0_);
}

Result<CopyResult> CopyRun::Go(GpuLoadStats* stats, CopyResources* resources) {
  t0_ = Clock::now();
  CurrentDeviceGuard keep_callers_device;
  CKPT_CUDA_RETURN("cudaSetDevice", cudaSetDevice(device_));
  if (!dest_.base && !dest_.allocate) return Internal("a copy run without device memory for its outputs");
  // The outputs' device memory: given, or allocated now, before the tasks are cut (so that
  // an allocation that cannot succeed fails before any work: a 1 PiB output is not cut
  // into 2 MiB tasks first), or, where the device has that much free and
  // CKPT_COPY_EARLY is not 0, once the workers have started (below), so that their first
  // gathers overlap the allocation.
  bool early = false;
  if (!dest_.base && CopyEarlyStart()) {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) early = free_b >= dest_.bytes;
    else cudaGetLastError();
  }
  if (dest_.base) {
    base_ = dest_.base;
  } else if (!early) {
    CKPT_ASSIGN_OR_RETURN(std::byte* b, dest_.allocate());
    base_ = b;
    base_at_ = Since(t0_);
  }
  tasks_ = CutIntoTasks(jobs_, chunk_);
  order_ = TaskOrder(tasks_, CopyTaskMix());
  for (const CopyJob& j : jobs_) needs_flags_ = needs_flags_ || j.transpose || j.from != j.to;
  const bool do_register = options_.path == HostPath::kRegister;
  if (do_register) {
    groups_ = PlanGroups(tasks_, static_cast<uint64_t>(sysconf(_SC_PAGESIZE)), options_.register_group_bytes);
    for (const Group& g : groups_) bounds_.push_back(g.begin);
    group_done_.assign(groups_.size(), 0);
  }
  const double planned_s = Since(t0_);

  // Resources, ready before any worker starts (an early return frees nothing a copy
  // still uses): prepared in the background since the loader was created, or now.
  std::unique_ptr<CopyResources> own;
  if (!resources) {
    own = std::make_unique<CopyResources>(device_, options_);
    resources = own.get();
  }
  res_ = resources;
  const auto w0 = Clock::now();
  CKPT_RETURN_IF_ERROR(resources->Begin());
  const double wait_s = Since(w0);
  const size_t ready_at_start = resources->ready();
  nbuf_ = resources->buffers();
  const size_t n = static_cast<size_t>(std::max(1, std::min<int>(resources->workers(), static_cast<int>(tasks_.size()))));
  std::vector<Lane> lanes(n);
  for (size_t i = 0; i < n; ++i) lanes[i].index = i;

  const double started_s = Since(t0_);
  const auto r0 = Clock::now();
  std::vector<std::thread> registrars, threads;
  try {
    if (do_register) {
      const int nreg = std::max(1, std::min<int>(options_.register_threads, static_cast<int>(groups_.size())));
      for (int t = 0; t < nreg; ++t) registrars.emplace_back([this] { RegisterLoop(); });
    }
    for (Lane& w : lanes) threads.emplace_back([this, &w] { WorkerLoop(w); });
  } catch (const std::system_error& e) {  // no thread: stop the ones started, report it
    Fail(ResourceExhausted(std::string("starting a copy thread: ") + e.what()));
  }
  if (early) {
    // Every worker waits for this before its first copy to the device (WaitBase).
    Result<std::byte*> b = dest_.allocate();
    std::lock_guard<std::mutex> lock(mu_);
    if (b.ok()) {
      base_.store(*b, std::memory_order_release);
      base_at_ = Since(t0_);
    } else {
      if (first_error_.ok()) first_error_ = b.status();
      abort_ = true;
    }
    cv_.notify_all();
  }
  for (auto& t : threads) t.join();  // a failed worker set abort_, which stops the registrars
  for (auto& t : registrars) t.join();
  stats->register_seconds = do_register ? Since(r0) : 0;
  stats->registered_bytes = registered_bytes_;
  // Every stream is idle: each worker synchronised its stream before returning, or
  // failed, in which case synchronise here before the buffers it used go away.
  for (Lane& w : lanes)
    if (w.active) cudaStreamSynchronize(w.r->stream.get());
  const double copied_s = Since(t0_);
  const auto u0 = Clock::now();
  registrations_.clear();
  stats->unregister_seconds = Since(u0);
  size_t active = 0;
  double first = -1;
  for (Lane& w : lanes) {
    if (!w.active) continue;
    ++active;
    if (w.first_issue >= 0 && (first < 0 || w.first_issue < first)) first = w.first_issue;
    w.r->scratch.Reset();  // device memory the state dict does not own
  }
  // Setup: until the first copy was issued (or, with none, until the workers started).
  stats->setup_seconds += first >= 0 ? first : started_s;
  if (!first_error_.ok()) return first_error_;

  CopyResult result;
  if (needs_flags_ && active > 0) {
    std::vector<int> tags(n);
    CKPT_CUDA_RETURN("reading the overflow flags",
                     cudaMemcpy(tags.data(), resources->flags(), n * sizeof(int), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i) {  // a worker that never ran did not reset its flag
      if (lanes[i].active && tags[i] != 0 && result.overflow_tag == 0) result.overflow_tag = tags[i];
    }
  }
  stats->copied_bytes = copied_;
  if (CopyTraceEnabled()) {
    double end_min = 1e9, end_max = 0, ready_max = 0, gather = 0, packed = 0, wait = 0, issue = 0;
    double busy_max = 0;
    uint64_t gather_bytes = 0;
    for (const Lane& w : lanes) {
      if (!w.active) continue;
      end_min = std::min(end_min, w.end);
      end_max = std::max(end_max, w.end);
      ready_max = std::max(ready_max, w.ready);
      gather += w.gather_s, packed += w.packed_s, wait += w.wait_s, issue += w.issue_s;
      busy_max = std::max(busy_max, w.gather_s + w.packed_s + w.issue_s);
      gather_bytes += w.gather_bytes;
    }
    const double gib = 1073741824.0, packed_bytes = static_cast<double>(copied_.load() - gather_bytes);
    std::fprintf(stderr,
                 "{\"what\":\"copy_trace\",\"tasks\":%zu,\"workers\":%zu,\"active\":%zu,\"ready_at_start\":%zu,\"buffers\":%d,\"chunk_MiB\":%g,"
                 "\"order\":\"%s\",\"early\":%d,\"background_prep_s\":%.4f,\"planned_s\":%.4f,\"ready_wait_s\":%.4f,\"started_s\":%.4f,"
                 "\"base_s\":%.4f,\"last_ready_s\":%.4f,\"first_issue_s\":%.4f,\"first_worker_done_s\":%.4f,\"last_worker_done_s\":%.4f,"
                 "\"copied_s\":%.4f,\"end_s\":%.4f,\"GiB\":%.3f,\"gather_GiB\":%.3f,"
                 "\"cpu_gather_s\":%.4f,\"cpu_packed_s\":%.4f,\"buffer_wait_s\":%.4f,\"issue_s\":%.4f,\"busiest_worker_s\":%.4f,"
                 "\"gather_GiBps_per_thread\":%.2f,\"packed_GiBps_per_thread\":%.2f}\n",
                 tasks_.size(), n, active, ready_at_start, nbuf_, chunk_ / 1048576.0,
                 CopyTaskMix() == TaskMix::kSpread ? "spread" : "address", early ? 1 : 0, resources->prep_seconds(),
                 planned_s, wait_s, started_s, base_at_, ready_max, first, end_min, end_max, copied_s, Since(t0_),
                 copied_.load() / gib, gather_bytes / gib, gather, packed, wait, issue, busy_max,
                 gather > 0 ? gather_bytes / gib / gather : 0.0, packed > 0 ? packed_bytes / gib / packed : 0.0);
  }
  return result;
}

}  // namespace

uint64_t ChunkBytes(const GpuLoadOptions& options) {
  if (options.chunk_bytes != 0) return options.chunk_bytes;
  return options.path == HostPath::kBounce ? kDefaultBounceChunk : uint64_t{16} << 20;
}

int BounceBuffers() {
  const char* v = std::getenv("CKPT_COPY_BUFFERS");
  if (!v || !*v) return 2;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return *end == '\0' && n >= 1 && n <= kMaxBuffers ? static_cast<int>(n) : 2;
}

TaskMix CopyTaskMix() {
  const char* v = std::getenv("CKPT_COPY_ORDER");
  return v && std::strcmp(v, "spread") == 0 ? TaskMix::kSpread : TaskMix::kAddress;
}

bool CopyEarlyStart() {
  const char* v = std::getenv("CKPT_COPY_EARLY");
  return !(v && std::strcmp(v, "0") == 0);
}

bool CopyTraceEnabled() {
  const char* v = std::getenv("CKPT_COPY_TRACE");
  return v && std::strcmp(v, "1") == 0;
}

std::shared_ptr<CopyResources> StartCopyResources(int device, const GpuLoadOptions& options) {
  auto r = std::make_shared<CopyResources>(device, options);
  r->StartBackground();
  return r;
}

Result<CopyResult> RunCopyJobs(const std::vector<CopyJob>& jobs, const CopyDestination& dest, int device,
                               const GpuLoadOptions& options, GpuLoadStats* stats, CopyResources* resources) {
  if (resources && resources->device() != device)
    return Internal("copy resources of device " + std::to_string(resources->device()) + " used on " + std::to_string(device));
  CopyRun run(jobs, dest, device, options);
  return run.Go(stats, resources);
}

}  // namespace ckpt::cuda

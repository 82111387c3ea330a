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

#include "common/thread_pool.h"
#include "cuda/convert_kernels.h"
#include "cuda/copy_knobs.h"
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


// One worker's resources, kept across runs. The stream is declared last, so destroyed
// (after synchronising) first.
struct WorkerRes {
  int* flag = nullptr;  // on the device
  std::byte* pinned[kMaxBuffers] = {};
  bool populated = false;     // its part of the slab faulted in
  bool locked = false;        // and page-locked
  Event done[kMaxBuffers];
  DeviceBuffer scratch;  // conversions and transposes; freed at the end of every run
  Stream stream;
};

// What a run gives the worker threads (CopyResources::Post).
class RunBody {
 public:
  // True while a worker that joins now would find work (tasks left, nothing failed).
  virtual bool WantsWorkers() = 0;
  // Worker i's part of the run, on its own thread (the resources' device current).
  virtual void Work(size_t i, WorkerRes& r) = 0;
  // Ends the run with `s` (a worker that could not be prepared, or started).
  virtual void Fail(Status s) = 0;

 protected:
  ~RunBody() = default;
};

class CopyResources {
 public:
  CopyResources(int device, const GpuLoadOptions& options)
      : device_(device),
        bounce_(options.path == HostPath::kBounce),
        nworkers_(std::max(1, options.streams)),
        chunk_(ChunkBytes(options)),
        nbuf_(CurrentCopyKnobs().buffers),
        populated_at_(static_cast<size_t>(nworkers_)),
        ready_at_(static_cast<size_t>(nworkers_)),
        workers_(static_cast<size_t>(nworkers_)) {}
  ~CopyResources() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    if (starter_.joinable()) starter_.join();
    threads_.Join();
  }
  CopyResources(const CopyResources&) = delete;
  CopyResources& operator=(const CopyResources&) = delete;

  // Starts the workers from a background thread: each worker thread faults its own part
  // of the slab in (every worker at once), makes its stream and events and page-locks the
  // part, then serves the runs; a run uses each worker as soon as it is ready. Where no
  // thread can be started, Begin does the start.
  void StartBackground() {
    std::lock_guard<std::mutex> lock(mu_);
    MarkStart();
    start_done_ = false;
    try {
      starter_ = std::thread([this] { RunStart(); });
    } catch (const std::system_error& e) {
      start_done_ = true;
      start_status_ = ResourceExhausted(std::string("starting the copy workers: ") + e.what());
    }
  }
  // Before a run, on its thread (whose current device must be device_): OK while the
  // start is under way or after it succeeded; else (it failed, or never ran) starts again
  // on the calling thread and returns that start's error.
  Status Begin() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!start_done_ || start_status_.ok()) return Status::Ok();
      MarkStart();
      start_done_ = false;  // the threads this start makes wait until every one exists
    }
    if (starter_.joinable()) starter_.join();
    Status st = Start();
    std::lock_guard<std::mutex> lock(mu_);
    start_status_ = st;
    start_done_ = true;
    cv_.notify_all();
    return st;
  }
  // Posts a run: worker i < n calls body.Work(i, its resources) once it is ready (at once
  // where it is; a worker whose preparation failed before tries again first, and fails
  // the run if that fails too), while body.WantsWorkers(). Finish waits for the end.
  // Precondition: Begin returned OK; one run at a time.
  void Post(size_t n, RunBody& body) {
    std::lock_guard<std::mutex> lock(mu_);
    run_ = &body;
    run_n_ = n;
    ++run_gen_;
    cv_.notify_all();
  }
  // Returns once no worker is in the posted run and none will join it (body.WantsWorkers()
  // false); a start that failed meanwhile fails it first.
  void Finish(RunBody& body) {
    std::unique_lock<std::mutex> lock(mu_);
    bool reported = false;
    for (;;) {
      if (running_ == 0 && !body.WantsWorkers()) break;
      if (!reported && start_done_ && !start_status_.ok()) {
        reported = true;
        Status s = start_status_;
        lock.unlock();
        body.Fail(std::move(s));
        lock.lock();
        continue;
      }
      cv_.wait(lock);
    }
    run_ = nullptr;
  }

  int device() const { return device_; }
  int workers() const { return nworkers_; }
  int buffers() const { return nbuf_; }
  int* flags() const { return static_cast<int*>(flags_.get()); }  // one per worker; valid once one is ready
  size_t ready() {
    std::lock_guard<std::mutex> lock(mu_);
    return ready_;
  }
  // Trace: when the start began and the first and last worker were ready (the start's
  // time where none is yet).
  struct Times {
    Clock::time_point start, first_ready, last_ready;
    std::vector<Clock::time_point> populated, ready;  // per worker (the start's time: not yet)
  };
  Times times() {
    std::lock_guard<std::mutex> lock(mu_);
    return {start_t0_, ready_ > 0 ? first_ready_ : start_t0_, ready_ > 0 ? last_ready_ : start_t0_, populated_at_,
            ready_at_};
  }

 private:
  void RunStart() {
    Status st = Start();
    std::lock_guard<std::mutex> lock(mu_);
    start_status_ = std::move(st);
    start_done_ = true;
    cv_.notify_all();
  }
  // Makes what is missing: the flags, the slab (mapped, nothing faulted in yet: each
  // worker does its part) and the worker threads. Runs on the starter thread, or on a
  // run's thread once the starter is joined.
  Status Start() {
    CKPT_CUDA_RETURN("cudaSetDevice", cudaSetDevice(device_));
    const size_t n = static_cast<size_t>(nworkers_);
    if (!flags_.get()) {
      CKPT_ASSIGN_OR_RETURN(flags_, DeviceBuffer::Allocate(n * sizeof(int)));
    }
    if (bounce_ && !slab_.get()) {
      constexpr uint64_t kPage = 4096;
      const uint64_t per = uint64_t(nbuf_) * chunk_;
      if (chunk_ == 0 || per / chunk_ != uint64_t(nbuf_) || per > (uint64_t{1} << 40) / n)
        return InvalidArgument("bounce buffers of " + std::to_string(chunk_) + " bytes x " + std::to_string(nbuf_) +
                               " x " + std::to_string(n) + " workers are too large");
      // Each worker's buffers lie in their own whole 4 KiB pages, prepared by the worker.
      stride_ = (per + kPage - 1) / kPage * kPage;
      CKPT_ASSIGN_OR_RETURN(slab_, PinnedBuffer::Reserve(n * stride_));
    }
    // Every thread is started before any of them faults its pages in (they wait for
    // start_done_): a fault-in holds the process's mapping lock for reading, and starting
    // a thread maps its stack under the same lock for writing, so threads started while
    // the earlier ones populate start one at a time (docs/benchmarks.md).
    // Worker k of the group is thread k: a start after a failed one adds the missing ones.
    return threads_.Start(n - threads_.size(), [this](size_t i) { WorkerMain(i); })
        .WithContext("starting the copy threads");
  }
  // Worker i's part of the slab faulted in (no driver call: every worker at once), then
  // its stream, events and the part page-locked; what a failed attempt made is kept.
  Status PrepareWorker(size_t i) {
    WorkerRes& w = workers_[i];
    w.flag = flags() + i;
    if (bounce_ && !w.populated) {
      CKPT_RETURN_IF_ERROR(slab_.Populate(i * stride_, stride_));
      w.populated = true;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      populated_at_[i] = Clock::now();
    }
    if (!w.stream.get()) {
      CKPT_ASSIGN_OR_RETURN(w.stream, Stream::Create());
    }
    if (!bounce_) return Status::Ok();
    for (size_t k = 0; k < static_cast<size_t>(nbuf_); ++k) {
      w.pinned[k] = slab_.get() + i * stride_ + k * chunk_;
      if (!w.done[k].get()) {
        CKPT_ASSIGN_OR_RETURN(w.done[k], Event::Create());
      }
    }
    if (!w.locked) CKPT_RETURN_IF_ERROR(slab_.Lock(i * stride_, stride_));
    w.locked = true;
    return Status::Ok();
  }
  // Worker thread i: prepares itself at once, holding no run (a run the other workers
  // finish meanwhile does not wait for it; one posted and still wanting workers fails if
  // the preparation fails), then takes part in every run posted for it while the run
  // wants workers; after a failed preparation it tries again for each run, which fails
  // if that fails too.
  void WorkerMain(size_t i) {
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stop_ || start_done_; });
    if (stop_) return;
    lock.unlock();
    Status prepared = PrepareWorker(i);
    lock.lock();
    if (prepared.ok()) MarkReady(i);
    // A first preparation that failed is reported to the run posted then, if any, and
    // tried again for every later one.
    const uint64_t failed_in = prepared.ok() || !run_ ? 0 : run_gen_;
    uint64_t seen = 0;  // the last run this worker took part in
    while (!stop_) {
      // A run posted for this worker that still has tasks for it (one the others finish
      // first does not wait for this worker's retry, nor fail with it).
      RunBody* body = run_ && run_gen_ != seen && i < run_n_ && run_->WantsWorkers() ? run_ : nullptr;
      if (!body) {
        cv_.wait(lock);
        continue;
      }
      seen = run_gen_;
      ++running_;  // the run's Finish waits until this worker is done with it
      if (!prepared.ok()) {
        lock.unlock();
        if (seen != failed_in) prepared = PrepareWorker(i);
        if (!prepared.ok() && body->WantsWorkers()) body->Fail(prepared.WithContext("copy worker " + std::to_string(i)));
        lock.lock();
        if (prepared.ok()) MarkReady(i);
      }
      if (prepared.ok() && body->WantsWorkers()) {
        lock.unlock();
        body->Work(i, workers_[i]);
        lock.lock();
      }
      --running_;
      cv_.notify_all();
    }
  }
  // Precondition: mu_ held.
  void MarkReady(size_t i) {
    const auto now = Clock::now();
    if (ready_++ == 0) first_ready_ = now;
    last_ready_ = now;
    ready_at_[i] = now;
    cv_.notify_all();
  }
  // Precondition: mu_ held. The trace's times start here.
  void MarkStart() {
    start_t0_ = Clock::now();
    std::fill(populated_at_.begin(), populated_at_.end(), start_t0_);
    std::fill(ready_at_.begin(), ready_at_.end(), start_t0_);
  }

  const int device_;
  const bool bounce_;
  const int nworkers_;
  const uint64_t chunk_;
  const int nbuf_;
  uint64_t stride_ = 0;  // bytes of the slab per worker; set by Start before any thread
  std::thread starter_;
  ThreadGroup threads_;  // worker i: its thread i; grown only by Start
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;                                                     // guarded by mu_
  bool start_done_ = true;                                                // guarded by mu_
  Status start_status_ = FailedPrecondition("copy workers not started");  // guarded by mu_
  Clock::time_point start_t0_, first_ready_, last_ready_;                 // guarded by mu_
  size_t ready_ = 0;                                                      // guarded by mu_
  RunBody* run_ = nullptr;                                                // guarded by mu_
  size_t run_n_ = 0;                                                      // guarded by mu_
  uint64_t run_gen_ = 0;                                                  // guarded by mu_
  size_t running_ = 0;  // guarded by mu_: workers in the posted run's Work or preparing for it
  std::vector<Clock::time_point> populated_at_, ready_at_;  // guarded by mu_ (trace)
  DeviceBuffer flags_;
  PinnedBuffer slab_;
  std::vector<WorkerRes> workers_;  // sized once; declared last: destroyed (streams synchronised) first
};

namespace {

// The state every worker of one RunCopyJobs shares.
class CopyRun final : public RunBody {
 public:
  CopyRun(const std::vector<CopyJob>& jobs, const CopyDestination& dest, int device, const GpuLoadOptions& options)
      : jobs_(jobs), dest_(dest), device_(device), options_(options), chunk_(ChunkBytes(options)) {}

  Result<CopyResult> Go(GpuLoadStats* stats, CopyResources* resources);

  // RunBody: the worker threads of `resources` take the tasks.
  bool WantsWorkers() override { return !abort_.load() && next_task_.load() < order_.size(); }
  void Work(size_t i, WorkerRes& r) override;
  void Fail(Status s) override;

 private:
  // Go's steps. PlanRun: the device memory now unless `early` (or given), the tasks, their
  // order, the registration groups; dest.allocate's error. AllocateWhileGathering: the
  // early allocation, while the workers gather (its error stops the run). OverflowTag: the
  // first active worker's overflow flag (0: none), read from the device.
  Status PlanRun(const CopyKnobs& knobs, bool early);
  void AllocateWhileGathering();
  Result<int> OverflowTag(CopyResources& resources);
  // What Go measured of the run, for the trace (CKPT_COPY_TRACE): seconds from its start.
  struct TraceMarks {
    size_t workers = 0, active = 0, ready_at_start = 0;
    bool early = false, spans = false;
    TaskMix order = TaskMix::kAddress;
    double planned_s = 0, ready_wait_s = 0, started_s = 0, posted_s = 0, first_issue_s = -1, copied_s = 0;
  };
  // Writes the run's trace line to stderr: `m`, the workers' times and `rt`, the
  // preparation's (relative to the run's start; negative: before it).
  void WriteTrace(const TraceMarks& m, const CopyResources::Times& rt) const;

  // One worker in this run: its resources and where it is in its ring of buffers.
  struct Lane {
    WorkerRes* r = nullptr;  // touched only once `active`
    bool active = false;     // the worker was ready before the tasks ran out
    int which = 0;
    double first_issue = -1, end = 0;  // seconds since the run started (trace)
    // Seconds spent (trace): copying into bounce buffers (gather tasks / packed ones),
    // waiting for a buffer's last copy to be read, issuing copies.
    double gather_s = 0, packed_s = 0, wait_s = 0, issue_s = 0;
    uint64_t gather_bytes = 0;
  };
  static Status Aborted();
  Status RunTask(Lane& w, const Task& t);
  Status CopyRect(Lane& w, const CopyJob& j, const CopyRegion& r, const Rect& x);
  Status CopySpan(Lane& w, const Task& t);
  template <typename Fill, typename Destination>
  Status Stage(Lane& w, Fill&& fill, Destination&& destination, uint64_t row_bytes, uint64_t rows);
  Status NeedScratch(Lane& w, uint64_t bytes);
  bool WaitRegistered(const Task& t);
  bool WaitBase();
  void RegisterLoop();

  const std::vector<CopyJob>& jobs_;
  const CopyDestination& dest_;
  const int device_;
  const GpuLoadOptions& options_;
  const uint64_t chunk_;
  int nbuf_ = 2;
  bool needs_flags_ = false;
  Clock::time_point t0_;
  std::vector<Task> tasks_;
  std::vector<SpanPiece> pieces_;  // of the span tasks
  std::vector<size_t> order_;  // the order in which tasks are taken
  std::vector<Lane> lanes_;    // lane i: worker i's, touched by its thread during the run
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

// The bounce path's one step: waits until the worker's oldest buffer has been read by
// its last copy, fills it (fill(buffer): `rows` rows of `row_bytes`, packed), then, once
// the outputs' device memory exists, copies it to destination(&dpitch) on the worker's
// stream and records the buffer's event.
template <typename Fill, typename Destination>
Status CopyRun::Stage(Lane& w, Fill&& fill, Destination&& destination, uint64_t row_bytes, uint64_t rows) {
  Event& done = w.r->done[w.which];
  const auto c0 = Clock::now();
  CKPT_CUDA_RETURN("cudaEventSynchronize", cudaEventSynchronize(done.get()));
  w.wait_s += Since(c0);
  std::byte* buf = w.r->pinned[w.which];
  fill(buf);
  if (!WaitBase()) return Aborted();
  const auto c3 = Clock::now();
  uint64_t dpitch = 0;
  std::byte* dst = destination(&dpitch);
  cudaError_t err = CopyH2D(buf, row_bytes, dst, dpitch, row_bytes, rows, w.r->stream.get());
  if (err == cudaSuccess) err = cudaEventRecord(done.get(), w.r->stream.get());
  w.which = (w.which + 1) % nbuf_;
  w.issue_s += Since(c3);
  if (err != cudaSuccess) return CudaError("cudaMemcpyAsync", err);
  return Status::Ok();
}

// A span task: its pieces gathered one after another into one bounce buffer, then one
// copy to its bytes of the destination.
Status CopyRun::CopySpan(Lane& w, const Task& t) {
  auto fill = [&](std::byte* buf) {
    for (size_t k = 0; k < t.pieces; ++k) {
      const SpanPiece& p = pieces_[t.first_piece + k];
      const CopyJob& j = jobs_[p.job];
      const auto c1 = Clock::now();
      GatherPiece(j, p, buf);
      (p.gather ? w.gather_s : w.packed_s) += Since(c1);
      if (p.gather) w.gather_bytes += p.end - p.begin;
      buf += p.end - p.begin;
    }
  };
  auto destination = [&](uint64_t* dpitch) {
    *dpitch = t.bytes;
    return base_.load(std::memory_order_acquire) + t.dst;
  };
  CKPT_RETURN_IF_ERROR(Stage(w, fill, destination, t.bytes, 1).WithContext("copy of '" + *jobs_[t.job].name + "'"));
  if (w.first_issue < 0) w.first_issue = Since(t0_);
  copied_ += t.bytes;
  return Status::Ok();
}

// Copies rectangle x of region r of job j: straight to the output, or (conversion) to
// scratch and converted from there into the output, or (transpose) to its place in
// scratch, which holds the whole piece. On the bounce path the rectangle is gathered
// into the buffer before the outputs' device memory is waited for (CopyDestination).
Status CopyRun::CopyRect(Lane& w, const CopyJob& j, const CopyRegion& r, const Rect& x) {
  const uint64_t esize = DTypeSize(j.from);
  const bool direct = CopiedAsItIs(j);
  const uint64_t w_bytes = x.c1 - x.c0, h = x.r1 - x.r0;
  const std::byte* src = j.src + r.src_offset + x.r0 * r.src_pitch + x.c0;
  const uint64_t dst_rel = r.dst_offset + x.r0 * r.dst_pitch + x.c0;  // in the piece, source dtype bytes
  cudaStream_t stream = w.r->stream.get();
  // Where the copy lands; the output's address only once WaitBase returned true.
  auto destination = [&](uint64_t* dpitch) -> std::byte* {
    if (direct) {
      *dpitch = r.dst_pitch;
      return base_.load(std::memory_order_acquire) + RegionDestination(j, r) + x.r0 * r.dst_pitch + x.c0;
    }
    if (j.transpose) {
      *dpitch = r.dst_pitch;
      return static_cast<std::byte*>(w.r->scratch.get()) + dst_rel;
    }
    *dpitch = w_bytes;
    return static_cast<std::byte*>(w.r->scratch.get());
  };
  uint64_t dpitch = 0;
  cudaError_t err = cudaSuccess;
  if (options_.path == HostPath::kBounce) {
    const bool gather = h > 1 && w_bytes != r.src_pitch;
    auto fill = [&](std::byte* buf) {
      const auto c1 = Clock::now();
      if (!gather) {
        std::memcpy(buf, src, w_bytes * h);
      } else {
        for (uint64_t row = 0; row < h; ++row) std::memcpy(buf + row * w_bytes, src + row * r.src_pitch, w_bytes);
      }
      (gather ? w.gather_s : w.packed_s) += Since(c1);
      if (gather) w.gather_bytes += w_bytes * h;
    };
    CKPT_RETURN_IF_ERROR(Stage(w, fill, destination, w_bytes, h).WithContext("copy of '" + *j.name + "'"));
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
  if (t.pieces > 0) return CopySpan(w, t);
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

void CopyRun::Work(size_t i, WorkerRes& r) {
  Lane& w = lanes_[i];
  w.active = true;
  w.r = &r;
  // The thread outlives runs: an error an earlier run left as this thread's last CUDA
  // error must not be reported by this run's kernel launches (Launch reads it).
  cudaGetLastError();
  cudaStream_t stream = w.r->stream.get();
  if (needs_flags_) {
    if (cudaError_t e = cudaMemsetAsync(w.r->flag, 0, sizeof(int), stream); e != cudaSuccess)
      return Fail(CudaError("cudaMemsetAsync", e));
  }
  for (size_t k = next_task_++; k < order_.size() && !abort_; k = next_task_++) {
    const Task& t = tasks_[order_[k]];
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

Status CopyRun::PlanRun(const CopyKnobs& knobs, bool early) {
  if (dest_.base) {
    base_ = dest_.base;
  } else if (!early) {
    CKPT_ASSIGN_OR_RETURN(std::byte* b, dest_.allocate());
    base_ = b;
    base_at_ = Since(t0_);
  }
  const bool spans = options_.path == HostPath::kBounce && knobs.spans;
  tasks_ = CutIntoTasks(jobs_, chunk_, spans ? &pieces_ : nullptr);
  order_ = TaskOrder(tasks_, knobs.order);
  for (const CopyJob& j : jobs_) needs_flags_ = needs_flags_ || !CopiedAsItIs(j);
  if (options_.path == HostPath::kRegister) {
    groups_ = PlanGroups(tasks_, static_cast<uint64_t>(sysconf(_SC_PAGESIZE)), options_.register_group_bytes);
    for (const Group& g : groups_) bounds_.push_back(g.begin);
    group_done_.assign(groups_.size(), 0);
  }
  return Status::Ok();
}

void CopyRun::AllocateWhileGathering() {
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

Result<int> CopyRun::OverflowTag(CopyResources& resources) {
  const size_t n = lanes_.size();
  std::vector<int> tags(n);
  CKPT_CUDA_RETURN("reading the overflow flags",
                   cudaMemcpy(tags.data(), resources.flags(), n * sizeof(int), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) {  // a worker that never ran did not reset its flag
    if (lanes_[i].active && tags[i] != 0) return tags[i];
  }
  return 0;
}

void CopyRun::WriteTrace(const TraceMarks& m, const CopyResources::Times& rt) const {
  double end_min = 1e9, end_max = 0, gather = 0, packed = 0, wait = 0, issue = 0;
  double busy_max = 0;
  uint64_t gather_bytes = 0;
  for (const Lane& w : lanes_) {
    if (!w.active) continue;
    end_min = std::min(end_min, w.end);
    end_max = std::max(end_max, w.end);
    gather += w.gather_s, packed += w.packed_s, wait += w.wait_s, issue += w.issue_s;
    busy_max = std::max(busy_max, w.gather_s + w.packed_s + w.issue_s);
    gather_bytes += w.gather_bytes;
  }
  const double gib = 1073741824.0, packed_bytes = static_cast<double>(copied_.load() - gather_bytes);
  auto rel = [&](Clock::time_point t) { return std::chrono::duration<double>(t - t0_).count(); };
  auto list = [&](const std::vector<Clock::time_point>& ts) {
    std::string out;
    for (const Clock::time_point& t : ts) {
      char b[32];
      std::snprintf(b, sizeof(b), "%s%.4f", out.empty() ? "" : ",", rel(t));
      out += b;
    }
    return out;
  };
  std::fprintf(stderr,
               "{\"what\":\"copy_trace\",\"tasks\":%zu,\"workers\":%zu,\"active\":%zu,\"ready_at_start\":%zu,\"buffers\":%d,\"chunk_MiB\":%g,"
               "\"order\":\"%s\",\"early\":%d,\"spans\":%d,\"prep_start_s\":%.4f,\"first_ready_s\":%.4f,\"last_ready_s\":%.4f,"
               "\"planned_s\":%.4f,\"ready_wait_s\":%.4f,\"started_s\":%.4f,\"posted_s\":%.4f,\"base_s\":%.4f,\"first_issue_s\":%.4f,\"first_worker_done_s\":%.4f,\"last_worker_done_s\":%.4f,"
               "\"copied_s\":%.4f,\"end_s\":%.4f,\"GiB\":%.3f,\"gather_GiB\":%.3f,"
               "\"cpu_gather_s\":%.4f,\"cpu_packed_s\":%.4f,\"buffer_wait_s\":%.4f,\"issue_s\":%.4f,\"busiest_worker_s\":%.4f,"
               "\"gather_GiBps_per_thread\":%.2f,\"packed_GiBps_per_thread\":%.2f,"
               "\"populated_at\":[%s],\"ready_at\":[%s]}\n",
               tasks_.size(), m.workers, m.active, m.ready_at_start, nbuf_, chunk_ / 1048576.0,
               m.order == TaskMix::kSpread ? "spread" : "address", m.early ? 1 : 0, m.spans ? 1 : 0, rel(rt.start),
               rel(rt.first_ready), rel(rt.last_ready), m.planned_s, m.ready_wait_s, m.started_s, m.posted_s, base_at_, m.first_issue_s, end_min, end_max, m.copied_s, Since(t0_),
               copied_.load() / gib, gather_bytes / gib, gather, packed, wait, issue, busy_max,
               gather > 0 ? gather_bytes / gib / gather : 0.0, packed > 0 ? packed_bytes / gib / packed : 0.0,
               list(rt.populated).c_str(), list(rt.ready).c_str());
}

Result<CopyResult> CopyRun::Go(GpuLoadStats* stats, CopyResources* resources) {
  t0_ = Clock::now();
  CurrentDeviceGuard keep_callers_device;
  CKPT_CUDA_RETURN("cudaSetDevice", cudaSetDevice(device_));
  if (!dest_.base && !dest_.allocate) return Internal("a copy run without device memory for its outputs");
  // The outputs' device memory: given, or allocated now, before the tasks are cut (so that
  // an allocation that cannot succeed fails before any work: a 1 PiB output is not cut
  // into 2 MiB tasks first), or, where the device has that much memory at all and
  // CKPT_COPY_EARLY is not 0, once the workers have started (below), so that their first
  // gathers overlap the allocation (which may still fail: the run then ends with its
  // error). The total is asked once per process, before the workers start
  // (StartCopyResources): a cudaMemGetInfo here would wait for their registrations.
  const CopyKnobs knobs = CurrentCopyKnobs();
  const bool early = !dest_.base && knobs.early && dest_.bytes <= DeviceMemoryBytes(device_);
  CKPT_RETURN_IF_ERROR(PlanRun(knobs, early));
  const bool spans = options_.path == HostPath::kBounce && knobs.spans;
  const bool do_register = options_.path == HostPath::kRegister;
  const double planned_s = Since(t0_);

  // Resources, started before the run (an early return frees nothing a copy still uses):
  // in the background since the loader was created, or now.
  std::unique_ptr<CopyResources> own;
  if (!resources) {
    own = std::make_unique<CopyResources>(device_, options_);
    resources = own.get();
  }
  const auto w0 = Clock::now();
  CKPT_RETURN_IF_ERROR(resources->Begin());
  const double wait_s = Since(w0);
  const size_t ready_at_start = resources->ready();
  nbuf_ = resources->buffers();
  const size_t n = std::min<size_t>(static_cast<size_t>(resources->workers()), std::max<size_t>(1, tasks_.size()));
  lanes_.resize(n);

  const double started_s = Since(t0_);
  const auto r0 = Clock::now();
  ThreadGroup registrars;
  if (do_register) {
    const int nreg = std::max(1, std::min<int>(options_.register_threads, static_cast<int>(groups_.size())));
    Status started = registrars.Start(static_cast<size_t>(nreg), [this](size_t) { RegisterLoop(); });
    if (!started.ok()) Fail(started.WithContext("starting the registration threads"));  // stops the ones started
  }
  resources->Post(n, *this);  // the workers ready take tasks at once, the others as they become ready
  const double posted_s = Since(t0_);
  if (early) AllocateWhileGathering();
  resources->Finish(*this);  // a failed worker set abort_, which stops the registrars
  registrars.Join();
  stats->register_seconds = do_register ? Since(r0) : 0;
  stats->registered_bytes = registered_bytes_;
  // Every stream is idle: each worker synchronised its stream before returning, or
  // failed, in which case synchronise here before the buffers it used go away.
  for (Lane& w : lanes_)
    if (w.active) cudaStreamSynchronize(w.r->stream.get());
  const double copied_s = Since(t0_);
  const auto u0 = Clock::now();
  registrations_.clear();
  stats->unregister_seconds = Since(u0);
  size_t active = 0;
  double first = -1;
  for (Lane& w : lanes_) {
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
    CKPT_ASSIGN_OR_RETURN(result.overflow_tag, OverflowTag(*resources));
  }
  stats->copied_bytes = copied_;
  if (knobs.trace) {
    TraceMarks m;
    m.workers = n, m.active = active, m.ready_at_start = ready_at_start, m.early = early, m.spans = spans;
    m.order = knobs.order, m.planned_s = planned_s, m.ready_wait_s = wait_s, m.started_s = started_s;
    m.posted_s = posted_s, m.first_issue_s = first, m.copied_s = copied_s;
    WriteTrace(m, resources->times());
  }
  return result;
}

}  // namespace

uint64_t ChunkBytes(const GpuLoadOptions& options) {
  if (options.chunk_bytes != 0) return options.chunk_bytes;
  return options.path == HostPath::kBounce ? kDefaultBounceChunk : uint64_t{16} << 20;
}

uint64_t DeviceMemoryBytes(int device) {
  constexpr int kCached = 64;
  static std::atomic<uint64_t> totals[kCached];  // 0: not known yet
  if (device >= 0 && device < kCached) {
    if (uint64_t t = totals[device].load(std::memory_order_relaxed)) return t;
  }
  CurrentDeviceGuard keep_callers_device;
  size_t free_b = 0, total_b = 0;
  if (cudaSetDevice(device) != cudaSuccess || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (device >= 0 && device < kCached) totals[device].store(total_b, std::memory_order_relaxed);
  return total_b;
}

std::shared_ptr<CopyResources> StartCopyResources(int device, const GpuLoadOptions& options) {
  DeviceMemoryBytes(device);  // known before the workers' driver calls begin
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

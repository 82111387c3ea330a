#include "cuda/gpu_loader_impl.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "cuda/convert_kernels.h"
#include "cuda/copy_split.h"
#include "cuda/cuda_resources.h"
#include "cuda/nccl_group.h"

namespace ckpt {

using cuda::CudaError;

bool GpuAvailable() { return cuda::CheckDevice(0).ok(); }

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool IsFloat(DType t) {
  return t == DType::kF64 || t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

// One piece of one output, as the workers see it.
struct Job {
  size_t output = 0;
  const ShardLayout* layout = nullptr;
  const std::byte* src = nullptr;  // the source tensor's first byte
  DType from = DType::kU8, to = DType::kU8;
  bool transpose = false;
  std::byte* out = nullptr;        // the output tensor on the device
  uint64_t piece_first_elem = 0;   // first element of this piece in the untransposed output
  uint64_t out_rows = 0;           // untransposed output rows (for transposes: dst_ld)
  uint64_t lo = 0, hi = 0;         // source bytes read: [lo, hi) absolute addresses
  size_t reg_first = 0, reg_last = 0;  // registration groups its bytes lie in
};

// A strided rectangle of one region: rows [r0, r1), bytes [c0, c1) of each row.
struct Rect {
  uint64_t r0, r1, c0, c1;
};

template <typename F>
void ForEachRect(const CopyRegion& r, uint64_t chunk, F&& f) {
  if (r.row_bytes <= chunk) {
    uint64_t per = std::max<uint64_t>(1, chunk / r.row_bytes);
    for (uint64_t row = 0; row < r.rows; row += per) f(Rect{row, std::min(r.rows, row + per), 0, r.row_bytes});
  } else {
    for (uint64_t row = 0; row < r.rows; ++row)
      for (uint64_t c = 0; c < r.row_bytes; c += chunk) f(Rect{row, row + 1, c, std::min(r.row_bytes, c + chunk)});
  }
}

cudaError_t Copy(const std::byte* src, uint64_t spitch, std::byte* dst, uint64_t dpitch, uint64_t w, uint64_t h,
                 cudaStream_t stream) {
  if (w == 0 || h == 0) return cudaSuccess;
  return h == 1 ? cudaMemcpyAsync(dst, src, w, cudaMemcpyHostToDevice, stream)
                : cudaMemcpy2DAsync(dst, dpitch, src, spitch, w, h, cudaMemcpyHostToDevice, stream);
}

// Copies h rows of w bytes, split at registration boundaries `bounds`.
cudaError_t IssueSplit(const std::byte* src, uint64_t spitch, std::byte* dst, uint64_t dpitch, uint64_t w,
                       uint64_t h, const std::vector<uint64_t>& bounds, cudaStream_t stream) {
  return static_cast<cudaError_t>(cuda::SplitAtBounds(
      reinterpret_cast<uint64_t>(src), spitch, w, h, bounds, [&](uint64_t r0, uint64_t c0, uint64_t cw, uint64_t rows) {
        return static_cast<int>(Copy(src + r0 * spitch + c0, spitch, dst + r0 * dpitch + c0, dpitch, cw, rows, stream));
      }));
}

}  // namespace

Result<std::unique_ptr<GpuLoaderImpl>> GpuLoaderImpl::Create(TensorSource source, int device,
                                                             const GpuLoadOptions& options) {
  if (!source.tensors || !source.data) return InvalidArgument("empty tensor source");
  if (options.streams < 1 || options.streams > 64) return InvalidArgument("streams must be in [1, 64]");
  if (options.chunk_bytes < (1u << 16)) return InvalidArgument("chunk_bytes must be >= 64 KiB");
  if (options.float_dtype && !IsFloat(*options.float_dtype))
    return InvalidArgument(std::string("float_dtype must be F64, F32, F16 or BF16, not ") +
                           DTypeName(*options.float_dtype) + " (floating-point tensors are never converted to integers)");
  CKPT_RETURN_IF_ERROR(cuda::CheckDevice(device));
  cuda::CurrentDeviceGuard keep_callers_device;
  CKPT_CUDA_RETURN("cudaSetDevice", cudaSetDevice(device));
  CKPT_CUDA_RETURN("CUDA context", cudaFree(nullptr));
  GpuLoadOptions o = options;
  o.chunk_bytes &= ~uint64_t{255};
  return std::unique_ptr<GpuLoaderImpl>(new GpuLoaderImpl(std::move(source), device, o));
}

GpuLoaderImpl::~GpuLoaderImpl() = default;

Result<GpuLoaderImpl::Planned> GpuLoaderImpl::Plan(const std::vector<ShardOutput>& outputs) const {
  const std::vector<TensorInfo>& tensors = *source_.tensors;
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < tensors.size(); ++i) index.emplace(tensors[i].name, i);
  Planned planned;
  for (const ShardOutput& out : outputs) {
    std::vector<TensorInfo> infos;
    std::vector<size_t> sources;
    for (const ShardPiece& p : out.pieces) {
      auto it = index.find(p.source);
      if (it == index.end()) return NotFound("output '" + out.name + "': no tensor '" + p.source + "'");
      infos.push_back(tensors[it->second]);
      sources.push_back(it->second);
    }
    CKPT_ASSIGN_OR_RETURN(OutputLayout layout, PlanOutput(out, infos));
    if (DTypeSize(layout.dtype) == 0)
      return Unsupported("output '" + out.name + "': the GPU loader does not take packed sub-byte " +
                         DTypeName(layout.dtype) + " tensors (attach them and copy their bytes)");
    for (const ShardLayout& piece : layout.pieces) {
      if (piece.padding_bytes > 0) {
        return Unsupported("output '" + out.name + "': zero-padded flat (ZeRO-3) partitions are not loaded by the GPU loader");
      }
    }
    DType to = layout.dtype;
    if (options_.float_dtype && IsFloat(layout.dtype)) to = *options_.float_dtype;
    if (!cuda::CanConvert(layout.dtype, to))
      return InvalidArgument("output '" + out.name + "': refusing to convert " + DTypeName(layout.dtype) + " to " + DTypeName(to));
    if ((out.transpose || to != layout.dtype) && DTypeSize(layout.dtype) > 8)
      return Unsupported("output '" + out.name + "': no GPU kernel for " + DTypeName(layout.dtype));
    planned.dtypes.push_back(to);
    planned.bytes.push_back(layout.nbytes / DTypeSize(layout.dtype) * DTypeSize(to));
    planned.layouts.push_back(std::move(layout));
    planned.sources.push_back(std::move(sources));
  }
  return planned;
}

Result<GpuStateDict> GpuLoaderImpl::Load(const std::vector<ShardOutput>& outputs) {
  const auto t0 = Clock::now();
  cuda::CurrentDeviceGuard keep_callers_device;
  CKPT_CUDA_RETURN("cudaSetDevice", cudaSetDevice(device_));
  CKPT_ASSIGN_OR_RETURN(Planned planned, Plan(outputs));
  std::vector<uint64_t> offsets;
  std::vector<size_t> all;
  uint64_t arena_bytes = 0;
  for (size_t o = 0; o < outputs.size(); ++o) {
    offsets.push_back(arena_bytes);
    arena_bytes += (planned.bytes[o] + 255) & ~uint64_t{255};
    all.push_back(o);
  }
  CKPT_ASSIGN_OR_RETURN(auto arena, AllocateArena(arena_bytes));
  GpuStateDict dict;
  CKPT_RETURN_IF_ERROR(Copy(outputs, planned, all, static_cast<std::byte*>(arena->get()), offsets, &dict.stats_));
  dict.stats_.total_seconds = Since(t0);
  Assemble(outputs, planned, std::move(arena), offsets, &dict);
  return dict;
}

Result<std::shared_ptr<cuda::DeviceBuffer>> GpuLoaderImpl::AllocateArena(uint64_t bytes) {
  auto arena = cuda::DeviceBuffer::Allocate(std::max<uint64_t>(bytes, 256));
  if (!arena.ok()) return arena.status().WithContext("device memory for the state dict");
  return std::make_shared<cuda::DeviceBuffer>(std::move(*arena));
}

void GpuLoaderImpl::Assemble(const std::vector<ShardOutput>& outputs, const Planned& planned,
                             std::shared_ptr<cuda::DeviceBuffer> arena, const std::vector<uint64_t>& offsets,
                             GpuStateDict* dict) const {
  auto* base = static_cast<std::byte*>(arena->get());
  dict->device_ = device_;
  for (size_t o = 0; o < outputs.size(); ++o) {
    GpuTensor t;
    t.dtype = planned.dtypes[o];
    t.shape = planned.layouts[o].shape;
    t.data = base + offsets[o];
    t.nbytes = planned.bytes[o];
    dict->tensors_[outputs[o].name] = std::move(t);
  }
  dict->allocation_ = std::shared_ptr<void>(arena, arena->get());
}

Status GpuLoaderImpl::Copy(const std::vector<ShardOutput>& outputs, const Planned& planned,
                           const std::vector<size_t>& which, std::byte* base, const std::vector<uint64_t>& offsets,
                           GpuLoadStats* stats) {
  const std::vector<OutputLayout>& layouts = planned.layouts;
  const std::vector<DType>& out_dtype = planned.dtypes;
  // 2. Jobs: one per piece, in source address order.
  std::vector<Job> jobs;
  for (size_t o : which) {
    const OutputLayout& L = layouts[o];
    const uint64_t esize = DTypeSize(L.dtype);
    for (size_t p = 0; p < L.pieces.size(); ++p) {
      const ShardLayout& s = L.pieces[p];
      if (s.nbytes == 0) continue;
      Job j;
      j.output = o;
      j.layout = &s;
      j.src = source_.data(planned.sources[o][p]);
      j.from = L.dtype;
      j.to = out_dtype[o];
      j.transpose = outputs[o].transpose;
      j.out = base + offsets[o];
      j.piece_first_elem = L.piece_offsets[p] / esize;
      j.out_rows = L.shape.empty() ? 0 : (j.transpose ? L.shape[1] : L.shape[0]);
      uint64_t lo = UINT64_MAX, hi = 0;
      for (const CopyRegion& r : s.regions) {
        lo = std::min(lo, r.src_offset);
        hi = std::max(hi, r.src_offset + (r.rows - 1) * r.src_pitch + r.row_bytes);
      }
      j.lo = reinterpret_cast<uint64_t>(j.src) + lo;
      j.hi = reinterpret_cast<uint64_t>(j.src) + hi;
      jobs.push_back(j);
    }
  }
  std::sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.lo < b.lo; });

  // 3. Registration groups: the union of the page ranges read, cut into pieces of at most
  // 64 MiB (in address order) so copies start while later groups are still being
  // registered. A copy never crosses a group boundary (the driver refuses a copy whose
  // source spans two registrations): copies are split at `bounds`.
  struct Group { uint64_t begin, end; };
  std::vector<Group> groups;
  std::vector<uint64_t> bounds;  // group begins, sorted
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const bool do_register = options_.path == HostPath::kRegister;
  if (do_register) {
    const uint64_t cap = std::max<uint64_t>(page, options_.register_group_bytes & ~(page - 1));
    std::vector<Group> runs;
    for (const Job& j : jobs) {
      uint64_t b = j.lo & ~(page - 1), e = (j.hi + page - 1) & ~(page - 1);
      if (!runs.empty() && b <= runs.back().end) runs.back().end = std::max(runs.back().end, e);
      else runs.push_back({b, e});
    }
    for (const Group& r : runs)
      for (uint64_t b = r.begin; b < r.end; b += cap) groups.push_back({b, std::min(r.end, b + cap)});
    for (const Group& g : groups) bounds.push_back(g.begin);
    for (Job& j : jobs) {
      auto first = std::upper_bound(bounds.begin(), bounds.end(), j.lo) - bounds.begin() - 1;
      auto last = std::upper_bound(bounds.begin(), bounds.end(), j.hi - 1) - bounds.begin() - 1;
      j.reg_first = static_cast<size_t>(first);
      j.reg_last = static_cast<size_t>(last);
    }
  }

  // 4. Workers and the registration thread.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<char> group_done(groups.size(), 0);
  std::atomic<size_t> next_group{0};
  std::vector<cuda::HostRegistration> registrations;
  std::atomic<bool> abort{false};
  Status first_error;
  auto fail = [&](Status s) {
    std::lock_guard<std::mutex> lock(mu);
    if (first_error.ok()) first_error = std::move(s);
    abort = true;
    cv.notify_all();
  };
  std::atomic<uint64_t> copied{0};

  std::vector<std::thread> registrars;
  std::atomic<uint64_t> reg_bytes{0};
  auto r0 = Clock::now();
  if (do_register) {
    const int n = std::max(1, std::min<int>(options_.register_threads, static_cast<int>(groups.size())));
    for (int t = 0; t < n; ++t) {
      registrars.emplace_back([&] {
        cudaSetDevice(device_);
        for (size_t g = next_group++; g < groups.size() && !abort; g = next_group++) {
          auto reg = cuda::HostRegistration::Register(reinterpret_cast<void*>(groups[g].begin),
                                                      groups[g].end - groups[g].begin);
          // A range the driver refuses is copied from pageable memory instead (slower,
          // still correct); registered_bytes in the stats shows it.
          std::lock_guard<std::mutex> lock(mu);
          if (reg.ok()) {
            reg_bytes += groups[g].end - groups[g].begin;
            registrations.push_back(std::move(*reg));
          }
          group_done[g] = 1;
          cv.notify_all();
        }
      });
    }
  }

  const int nworkers = std::max(1, std::min<int>(options_.streams, static_cast<int>(jobs.size())));
  std::vector<cuda::Stream> streams(nworkers);
  std::vector<cuda::DeviceBuffer> overflow(nworkers);
  for (int w = 0; w < nworkers; ++w) {
    auto s = cuda::Stream::Create();
    if (!s.ok()) { fail(s.status()); break; }
    streams[w] = std::move(*s);
    auto f = cuda::DeviceBuffer::Allocate(sizeof(int));
    if (!f.ok()) { fail(f.status()); break; }
    overflow[w] = std::move(*f);
    cudaMemsetAsync(overflow[w].get(), 0, sizeof(int), streams[w].get());
  }
  std::atomic<size_t> next{0};
  const uint64_t chunk = options_.chunk_bytes;

  auto worker = [&](int w) {
    cudaSetDevice(device_);
    cudaStream_t stream = streams[w].get();
    int* flag = static_cast<int*>(overflow[w].get());
    cuda::DeviceBuffer scratch;
    cuda::PinnedBuffer pinned[2];
    cuda::Event done[2];
    // Declared after the buffers, so destroyed first: no early return frees a buffer
    // that a copy or kernel on this stream still uses.
    struct DrainOnExit {
      cudaStream_t stream;
      ~DrainOnExit() { cudaStreamSynchronize(stream); }
    } drain{stream};
    int which = 0;
    if (options_.path == HostPath::kBounce) {
      for (int k = 0; k < 2; ++k) {
        auto p = cuda::PinnedBuffer::Allocate(chunk);
        if (!p.ok()) return fail(p.status());
        pinned[k] = std::move(*p);
        auto e = cuda::Event::Create();
        if (!e.ok()) return fail(e.status());
        done[k] = std::move(*e);
      }
    }
    auto need_scratch = [&](uint64_t bytes) -> Status {
      if (scratch.size() >= bytes) return Status::Ok();
      CKPT_CUDA_RETURN("cudaStreamSynchronize", cudaStreamSynchronize(stream));
      scratch.Reset();
      CKPT_ASSIGN_OR_RETURN(scratch, cuda::DeviceBuffer::Allocate(bytes));
      return Status::Ok();
    };
    for (size_t i = next++; i < jobs.size() && !abort; i = next++) {
      const Job& j = jobs[i];
      if (do_register) {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] {
          if (abort) return true;
          for (size_t g = j.reg_first; g <= j.reg_last; ++g)
            if (!group_done[g]) return false;
          return true;
        });
        if (abort) return;
      }
      const uint64_t esize = DTypeSize(j.from);
      const bool direct = !j.transpose && j.from == j.to;
      if (j.transpose) {
        if (Status s = need_scratch(j.layout->nbytes); !s.ok()) return fail(s);
      } else if (!direct) {
        if (Status s = need_scratch(chunk); !s.ok()) return fail(s);
      }
      const std::string& out_name = outputs[j.output].name;
      for (const CopyRegion& r : j.layout->regions) {
        Status st;
        ForEachRect(r, chunk, [&](const Rect& x) {
          if (!st.ok() || abort) return;
          const uint64_t w_bytes = x.c1 - x.c0, h = x.r1 - x.r0;
          const std::byte* src = j.src + r.src_offset + x.r0 * r.src_pitch + x.c0;
          const uint64_t dst_rel = r.dst_offset + x.r0 * r.dst_pitch + x.c0;  // in the piece, source dtype bytes
          std::byte* dst;
          uint64_t dpitch;
          if (direct) {
            dst = j.out + j.piece_first_elem * esize + dst_rel;
            dpitch = r.dst_pitch;
          } else if (j.transpose) {
            dst = static_cast<std::byte*>(scratch.get()) + dst_rel;
            dpitch = r.dst_pitch;
          } else {
            dst = static_cast<std::byte*>(scratch.get());
            dpitch = w_bytes;
          }
          cudaError_t err;
          if (options_.path == HostPath::kBounce) {
            cudaError_t e = cudaEventSynchronize(done[which].get());
            if (e != cudaSuccess) { st = CudaError("cudaEventSynchronize", e); return; }
            std::byte* buf = pinned[which].get();
            if (h == 1 || w_bytes == r.src_pitch) {
              std::memcpy(buf, src, w_bytes * h);
            } else {
              for (uint64_t row = 0; row < h; ++row) std::memcpy(buf + row * w_bytes, src + row * r.src_pitch, w_bytes);
            }
            err = h == 1 ? cudaMemcpyAsync(dst, buf, w_bytes, cudaMemcpyHostToDevice, stream)
                         : cudaMemcpy2DAsync(dst, dpitch, buf, w_bytes, w_bytes, h, cudaMemcpyHostToDevice, stream);
            if (err == cudaSuccess) err = cudaEventRecord(done[which].get(), stream);
            which ^= 1;
          } else {
            err = IssueSplit(src, r.src_pitch, dst, dpitch, w_bytes, h, bounds, stream);
          }
          if (err != cudaSuccess) { st = CudaError("copy of '" + out_name + "'", err); return; }
          copied += w_bytes * h;
          if (!direct && !j.transpose) {
            st = cuda::LaunchConvertRows(j.from, j.to, scratch.get(), w_bytes / esize, h, j.out,
                                         j.piece_first_elem + dst_rel / esize, r.dst_pitch / esize, flag,
                                         static_cast<int>(j.output) + 1, stream);
          }
        });
        if (!st.ok()) return fail(st.WithContext("output '" + out_name + "'"));
      }
      if (j.transpose) {
        const auto& shape = j.layout->shape;
        const uint64_t rows = shape[0], cols = j.layout->nbytes / esize / std::max<uint64_t>(rows, 1);
        const uint64_t row0 = j.piece_first_elem / std::max<uint64_t>(cols, 1);
        Status st = cuda::LaunchTranspose(j.from, j.to, scratch.get(), rows, cols, j.out, j.out_rows, row0, flag,
                                          static_cast<int>(j.output) + 1, stream);
        if (!st.ok()) return fail(st.WithContext("output '" + out_name + "'"));
      }
    }
    cudaError_t err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) fail(CudaError("cudaStreamSynchronize", err));
  };
  std::vector<std::thread> threads;
  if (!abort) {
    for (int w = 0; w < nworkers; ++w) threads.emplace_back(worker, w);
  }
  for (auto& t : threads) t.join();
  if (!first_error.ok()) abort = true;
  cv.notify_all();
  for (auto& t : registrars) t.join();
  stats->register_seconds = do_register ? Since(r0) : 0;
  stats->registered_bytes = reg_bytes;
  // Every stream is idle now (workers synchronised, or are destroyed synchronising).
  for (auto& s : streams) s.Reset();
  auto u0 = Clock::now();
  registrations.clear();
  stats->unregister_seconds = Since(u0);
  if (!first_error.ok()) return first_error;

  for (int w = 0; w < nworkers; ++w) {
    int tag = 0;
    CKPT_CUDA_RETURN("reading the overflow flag", cudaMemcpy(&tag, overflow[w].get(), sizeof(int), cudaMemcpyDeviceToHost));
    if (tag != 0 && !options_.allow_overflow) {
      const size_t o = static_cast<size_t>(tag - 1);
      return InvalidArgument("output '" + outputs[o].name + "': values out of range of " + DTypeName(out_dtype[o]) +
                             " (converting from " + DTypeName(layouts[o].dtype) + "; set allow_overflow to accept inf)");
    }
  }

  stats->copied_bytes = copied;
  return Status::Ok();
}

}  // namespace ckpt

namespace ckpt {
namespace {

// This machine, so that ranks on different nodes never share (each reads its own node's
// shared memory): the host name and the kernel's boot id.
uint64_t NodeId() {
  std::string id(256, '\0');
  gethostname(id.data(), id.size() - 1);
  id.resize(std::strlen(id.c_str()));
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char buf[64] = {};
    size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    id.append(buf, n);
  }
  return XXH3_64bits(id.data(), id.size());
}

// What determines an output's bytes on the device: its name, shape, dtypes, transpose and
// whether an overflowing conversion is accepted, and for each piece the source tensor's
// checksum and size and the regions read.
uint64_t OutputKey(const ShardOutput& out, const OutputLayout& layout, DType to, bool allow_overflow,
                   const std::vector<TensorInfo>& tensors, const std::vector<size_t>& sources, uint64_t node) {
  std::string k = out.name;
  auto put = [&k](uint64_t v) { k.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  k.push_back('\0');
  put(node);
  put(static_cast<uint64_t>(to));
  put(static_cast<uint64_t>(layout.dtype));
  put(out.transpose ? 1 : 0);
  put(to != layout.dtype && allow_overflow ? 1 : 0);  // a conversion that may write inf
  for (int64_t d : layout.shape) put(static_cast<uint64_t>(d));
  for (size_t p = 0; p < layout.pieces.size(); ++p) {
    const TensorInfo& t = tensors[sources[p]];
    put(t.checksum);
    put(t.nbytes);
    put(layout.piece_offsets[p]);
    for (const CopyRegion& r : layout.pieces[p].regions) {
      for (uint64_t v : {r.src_offset, r.src_pitch, r.rows, r.row_bytes, r.dst_offset, r.dst_pitch}) put(v);
    }
  }
  return XXH3_64bits(k.data(), k.size());
}

// True unless this device lacks direct access to one of the other visible devices.
bool PeerAccessToAll(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return false;
  for (int d = 0; d < count; ++d) {
    int can = 0;
    if (d != device && (cudaDeviceCanAccessPeer(&can, device, d) != cudaSuccess || !can)) return false;
  }
  return true;
}

}  // namespace

Result<GpuStateDict> GpuLoaderImpl::LoadCollective(const std::vector<ShardOutput>& outputs, NcclGroup& group,
                                                   const CollectiveOptions& options) {
  const auto t0 = Clock::now();
  auto* ops = dynamic_cast<cuda::NcclGroupOps*>(&group);
  if (!ops) return InvalidArgument("the group was not made by NcclGroup::Create, Join or Borrow");
  if (group.broken()) return FailedPrecondition("the NCCL group is broken (a rank failed or timed out earlier)");
  cuda::CurrentDeviceGuard keep_callers_device;

  // 1. Plan locally and tell every rank what this one needs. A rank whose own checks or
  // plan fail still takes part, flagged, so that the others stop too instead of waiting.
  Result<Planned> planned =
      group.device() != device_
          ? Result<Planned>(FailedPrecondition("the NCCL group is on CUDA device " + std::to_string(group.device()) +
                                               ", the loader on " + std::to_string(device_)))
          : Plan(outputs);
  collective::RankDescriptor mine;
  mine.ok = planned.ok();
  mine.peer_access = PeerAccessToAll(device_);
  mine.mode = static_cast<uint64_t>(options.mode);
  mine.min_saved_bytes = options.min_saved_bytes;
  if (planned.ok()) {
    const uint64_t node = NodeId();
    for (size_t o = 0; o < outputs.size(); ++o) {
      mine.outputs.push_back({OutputKey(outputs[o], planned->layouts[o], planned->dtypes[o], options_.allow_overflow,
                                        *source_.tensors, planned->sources[o], node),
                              planned->bytes[o]});
    }
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> blobs, ops->AllGatherBytes(collective::EncodeDescriptor(mine)));
  std::vector<collective::RankDescriptor> ranks;
  for (size_t r = 0; r < blobs.size(); ++r) {
    CKPT_ASSIGN_OR_RETURN(collective::RankDescriptor d, collective::DecodeDescriptor(blobs[r]));
    ranks.push_back(std::move(d));
  }
  if (!planned.ok()) return planned.status();
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (!ranks[r].ok)
      return FailedPrecondition("rank " + std::to_string(r) + " of the group could not plan its load (its own error says why)");
    if (ranks[r].mode != ranks[0].mode || ranks[r].min_saved_bytes != ranks[0].min_saved_bytes)
      return InvalidArgument("the ranks of the group passed different CollectiveOptions (rank 0 and rank " +
                             std::to_string(r) + " differ in mode or min_saved_bytes); every rank must pass the same");
  }
  // (A plan that fails, fails alike on every rank: they all see the same descriptors.)
  CKPT_ASSIGN_OR_RETURN(collective::ExchangePlan plan,
                        collective::PlanExchange(ranks, group.rank(), options.mode, options.min_saved_bytes));

  // 2. Copy this rank's part from host memory; then all ranks learn whether everyone did
  // (every local failure from here on is reported through that verdict).
  GpuStateDict dict;
  Status copied;
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) copied = cuda::CudaError("cudaSetDevice", e);
  Result<std::shared_ptr<cuda::DeviceBuffer>> arena = copied.ok() ? AllocateArena(plan.allocation_bytes) : copied;
  if (copied.ok()) copied = arena.status();
  if (copied.ok()) {
    copied = Copy(outputs, *planned, plan.from_host, static_cast<std::byte*>((*arena)->get()), plan.offsets,
                  &dict.stats_);
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> verdicts, ops->AllGatherBytes(copied.ok() ? "1" : "0"));
  if (!copied.ok()) return copied;
  for (size_t r = 0; r < verdicts.size(); ++r) {
    if (verdicts[r] != "1")
      return FailedPrecondition("rank " + std::to_string(r) + " of the group failed to copy its part (its own error says why)");
  }

  // 3. Send and receive the shared outputs.
  const auto x0 = Clock::now();
  CKPT_RETURN_IF_ERROR(ops->Exchange(plan.transfers, static_cast<std::byte*>((*arena)->get())));
  dict.stats_.exchange_seconds = Since(x0);
  dict.stats_.collective = plan.collective;
  dict.stats_.received_bytes = plan.received_bytes;
  dict.stats_.sent_bytes = plan.sent_bytes;
  dict.stats_.total_seconds = Since(t0);
  Assemble(outputs, *planned, std::move(*arena), plan.offsets, &dict);
  return dict;
}

}  // namespace ckpt

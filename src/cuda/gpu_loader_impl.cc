#include "cuda/gpu_loader_impl.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "cuda/convert_kernels.h"
#include "cuda/copy_engine.h"
#include "cuda/copy_knobs.h"
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

}  // namespace

Result<std::unique_ptr<GpuLoaderImpl>> GpuLoaderImpl::Create(TensorSource source, int device,
                                                             const GpuLoadOptions& options) {
  if (!source.tensors || !source.data) return InvalidArgument("empty tensor source");
  if (options.streams < 1 || options.streams > 64) return InvalidArgument("streams must be in [1, 64]");
  if (options.chunk_bytes != 0 && options.chunk_bytes < (1u << 16))
    return InvalidArgument("chunk_bytes must be 0 (the default) or >= 64 KiB");
  if (options.float_dtype && !IsFloat(*options.float_dtype))
    return InvalidArgument(std::string("float_dtype must be F64, F32, F16 or BF16, not ") +
                           DTypeName(*options.float_dtype) + " (floating-point tensors are never converted to integers)");
  CKPT_RETURN_IF_ERROR(cuda::CheckDevice(device));
  cuda::CurrentDeviceGuard keep_callers_device;
  CKPT_CUDA_RETURN("cudaSetDevice", cudaSetDevice(device));
  CKPT_CUDA_RETURN("CUDA context", cudaFree(nullptr));
  GpuLoadOptions o = options;
  o.chunk_bytes &= ~uint64_t{255};
  std::unique_ptr<GpuLoaderImpl> loader(new GpuLoaderImpl(std::move(source), device, o));
  loader->resources_ = cuda::StartCopyResources(device, loader->options_);
  return loader;
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
    CKPT_ASSIGN_OR_RETURN(std::vector<ShardLayout> matrices, MatricesOf(out, layout));
    planned.matrices.push_back(std::move(matrices));
    planned.dtypes.push_back(to);
    planned.bytes.push_back(layout.nbytes / DTypeSize(layout.dtype) * DTypeSize(to));
    planned.layouts.push_back(std::move(layout));
    planned.sources.push_back(std::move(sources));
  }
  return planned;
}

Result<std::vector<ShardLayout>> GpuLoaderImpl::MatricesOf(const ShardOutput& out, const OutputLayout& layout) {
  const size_t nd = layout.shape.size();
  if (!out.transpose || nd <= 2) return std::vector<ShardLayout>{};
  if (layout.pieces.size() != 1 || !layout.pieces[0].contiguous() || layout.pieces[0].regions.empty())
    return Unsupported("output '" + out.name + "': a transpose of " + std::to_string(nd) +
                       " dims is loaded only from one whole tensor");
  const uint64_t esize = DTypeSize(layout.dtype);
  const auto rows = static_cast<uint64_t>(layout.shape[nd - 1]), cols = static_cast<uint64_t>(layout.shape[nd - 2]);
  const uint64_t bytes = rows * cols * esize;
  std::vector<ShardLayout> out_matrices;
  if (bytes == 0) return out_matrices;
  for (uint64_t m = 0; m < layout.nbytes / bytes; ++m) {
    ShardLayout s;
    s.dtype = layout.dtype;
    s.shape = {static_cast<int64_t>(rows), static_cast<int64_t>(cols)};
    s.nbytes = bytes;
    s.regions.push_back({layout.pieces[0].regions[0].src_offset + m * bytes, cols * esize, 0, cols * esize,
                         cols * esize, rows});
    out_matrices.push_back(std::move(s));
  }
  return out_matrices;
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
  const double plan_s = Since(t0);
  // The device memory is allocated by the copy run, once its workers have started
  // gathering (cuda::CopyDestination), so that the allocation overlaps their first copies.
  std::shared_ptr<cuda::DeviceBuffer> arena;
  double arena_s = 0;
  cuda::CopyDestination dest;
  dest.bytes = std::max<uint64_t>(arena_bytes, 256);
  dest.allocate = [&]() -> Result<std::byte*> {
    const auto a0 = Clock::now();
    CKPT_ASSIGN_OR_RETURN(arena, AllocateArena(arena_bytes));
    arena_s = Since(a0);
    return static_cast<std::byte*>(arena->get());
  };
  GpuStateDict dict;
  dict.stats_.setup_seconds = plan_s;
  const auto c0 = Clock::now();
  CKPT_RETURN_IF_ERROR(Copy(outputs, planned, all, dest, offsets, &dict.stats_));
  const double copy_s = Since(c0);
  dict.stats_.total_seconds = Since(t0);
  if (cuda::CurrentCopyKnobs().trace) {
    std::fprintf(stderr, "{\"what\":\"load_trace\",\"outputs\":%zu,\"plan_s\":%.4f,\"arena_s\":%.4f,\"arena_GiB\":%.3f,"
                 "\"setup_s\":%.4f,\"copy_s\":%.4f,\"total_s\":%.4f}\n",
                 outputs.size(), plan_s, arena_s, arena_bytes / 1073741824.0, dict.stats_.setup_seconds, copy_s,
                 dict.stats_.total_seconds);
  }
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
                           const std::vector<size_t>& which, const cuda::CopyDestination& dest,
                           const std::vector<uint64_t>& offsets, GpuLoadStats* stats) {
  std::vector<cuda::CopyJob> jobs;
  size_t pieces = 0;
  for (size_t o : which) pieces += planned.layouts[o].pieces.size();
  jobs.reserve(pieces);  // one allocation: the workers may be faulting their buffers in meanwhile
  for (size_t o : which) {
    const OutputLayout& L = planned.layouts[o];
    const uint64_t esize = DTypeSize(L.dtype);
    for (size_t p = 0; p < L.pieces.size(); ++p) {
      const ShardLayout& s = L.pieces[p];
      if (s.nbytes == 0) continue;
      if (!planned.matrices[o].empty()) {  // a batched transpose: one 2-d transpose per matrix
        const std::vector<ShardLayout>& ms = planned.matrices[o];
        for (size_t m = 0; m < ms.size(); ++m) {
          cuda::CopyJob j;
          j.layout = &ms[m];
          j.src = source_.data(planned.sources[o][p]);
          j.from = L.dtype;
          j.to = planned.dtypes[o];
          j.transpose = true;
          j.out_offset = offsets[o] + m * (ms[m].nbytes / esize * DTypeSize(j.to));
          j.out_rows = static_cast<uint64_t>(ms[m].shape[0]);
          j.name = &outputs[o].name;
          j.tag = static_cast<int>(o) + 1;
          jobs.push_back(j);
        }
        continue;
      }
      cuda::CopyJob j;
      j.layout = &s;
      j.src = source_.data(planned.sources[o][p]);
      j.from = L.dtype;
      j.to = planned.dtypes[o];
      j.transpose = outputs[o].transpose;
      j.out_offset = offsets[o];
      j.piece_first_elem = L.piece_offsets[p] / esize;
      j.out_rows = L.shape.empty() ? 0 : (j.transpose ? L.shape[1] : L.shape[0]);
      j.name = &outputs[o].name;
      j.tag = static_cast<int>(o) + 1;
      jobs.push_back(j);
    }
  }
  CKPT_ASSIGN_OR_RETURN(cuda::CopyResult result, cuda::RunCopyJobs(jobs, dest, device_, options_, stats, resources_.get()));
  if (result.overflow_tag != 0 && !options_.allow_overflow) {
    const size_t o = static_cast<size_t>(result.overflow_tag - 1);
    return InvalidArgument("output '" + outputs[o].name + "': values out of range of " + DTypeName(planned.dtypes[o]) +
                           " (converting from " + DTypeName(planned.layouts[o].dtype) +
                           "; set allow_overflow to accept inf)");
  }
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
    dict.stats_.setup_seconds = Since(t0);
    cuda::CopyDestination dest;
    dest.base = static_cast<std::byte*>((*arena)->get());
    copied = Copy(outputs, *planned, plan.from_host, dest, plan.offsets, &dict.stats_);
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

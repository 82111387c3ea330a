#include "ckpt/shard.h"

#include <cstring>
#include <string>

#include "ckpt/tensor.h"

namespace ckpt {

bool ShardLayout::contiguous() const {
  return padding_bytes == 0 && (regions.empty() || (regions.size() == 1 && regions[0].rows == 1));
}

namespace {

// The [begin, begin + length) part of `rank` when `n` items are split into `world`.
struct Part {
  int64_t begin;
  int64_t length;
};

Result<Part> PartOf(int64_t n, int rank, int world, bool allow_uneven, bool ceil_parts) {
  if (n % world != 0 && !allow_uneven) {
    return InvalidArgument("cannot split " + std::to_string(n) + " into " +
                           std::to_string(world) + " equal parts (allow_uneven not set)");
  }
  if (ceil_parts) {  // torch.chunk: ceil-sized parts, the last ones shorter or empty
    const int64_t size = (n + world - 1) / world;
    const int64_t begin = std::min<int64_t>(n, size * rank);
    return Part{begin, std::min<int64_t>(size, n - begin)};
  }
  int64_t base = n / world, extra = n % world;
  int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return Part{begin, base + (rank < extra ? 1 : 0)};
}

}  // namespace

namespace {

// OK if `dtype` is valid and no dimension of `shape` is negative.
Status CheckTensor(DType dtype, const std::vector<int64_t>& shape) {
  if (!IsValidDType(static_cast<uint32_t>(dtype))) return InvalidArgument("invalid dtype");
  for (int64_t d : shape) {
    if (d < 0) return InvalidArgument("negative dimension in shape");
  }
  return Status::Ok();
}

// `layout` (dtype and shape set) as the whole tensor in one region.
Result<ShardLayout> ReplicateLayout(ShardLayout layout) {
  auto bytes = TensorBytes(layout.dtype, NumElements(layout.shape));
  if (!bytes) return InvalidArgument(std::string("a ") + DTypeName(layout.dtype) + " tensor of that shape is not whole bytes");
  layout.nbytes = *bytes;
  if (layout.nbytes > 0) layout.regions.push_back({0, layout.nbytes, 0, layout.nbytes, layout.nbytes, 1});
  return layout;
}

// OK if a tensor of `dtype` can be cut (whole bytes per element) and spec's rank is in its world.
Status CheckCuttable(DType dtype, const ShardSpec& spec) {
  if (DTypeSize(dtype) == 0) {
    return Unsupported(std::string("a ") + DTypeName(dtype) + " tensor packs several elements per byte: " +
                       "it can only be taken whole (replicate), not split or partitioned");
  }
  if (spec.world < 1) return InvalidArgument("world must be >= 1, got " + std::to_string(spec.world));
  if (spec.rank < 0 || spec.rank >= spec.world) {
    return InvalidArgument("rank " + std::to_string(spec.rank) + " out of range for world " +
                           std::to_string(spec.world));
  }
  return Status::Ok();
}

// `layout` (dtype and shape set) as spec.rank's part of the flattened tensor, zero-padded.
ShardLayout FlatPartitionLayout(ShardLayout layout, const ShardSpec& spec) {
  // DeepSpeed ZeRO-3: every rank holds ceil(numel / world) elements; the tail of the
  // flattened tensor is padded with zeros up to world * that.
  const uint64_t elem = DTypeSize(layout.dtype);
  const uint64_t numel = NumElements(layout.shape);
  const uint64_t part = (numel + spec.world - 1) / spec.world;
  const uint64_t begin = std::min<uint64_t>(numel, part * spec.rank);
  const uint64_t taken = std::min<uint64_t>(part, numel - begin);
  layout.shape = {static_cast<int64_t>(part)};
  layout.nbytes = part * elem;
  layout.padding_bytes = (part - taken) * elem;
  if (taken > 0) layout.regions.push_back({begin * elem, taken * elem, 0, taken * elem, taken * elem, 1});
  return layout;
}

// `layout` (dtype and shape set) as spec.rank's part of every fused chunk along spec.dim.
Result<ShardLayout> SplitLayout(ShardLayout layout, const ShardSpec& spec) {
  if (spec.fused_chunks < 1) return InvalidArgument("fused_chunks must be >= 1");
  const std::vector<int64_t>& shape = layout.shape;
  const uint64_t elem = DTypeSize(layout.dtype);
  const int ndim = static_cast<int>(shape.size());
  const int dim = spec.dim < 0 ? spec.dim + ndim : spec.dim;
  if (dim < 0 || dim >= ndim) {
    return InvalidArgument("split dim " + std::to_string(spec.dim) + " out of range for a " +
                           std::to_string(ndim) + "-d tensor");
  }
  const int64_t dim_len = shape[dim];
  if (dim_len % spec.fused_chunks != 0) {
    return InvalidArgument("dimension " + std::to_string(dim) + " of length " +
                           std::to_string(dim_len) + " does not hold " +
                           std::to_string(spec.fused_chunks) + " equal fused chunks");
  }
  const int64_t chunk_len = dim_len / spec.fused_chunks;
  auto part = PartOf(chunk_len, spec.rank, spec.world, spec.allow_uneven, spec.ceil_parts);
  if (!part.ok()) return part.status();

  uint64_t outer = 1;
  for (int i = 0; i < dim; ++i) outer *= static_cast<uint64_t>(shape[i]);
  uint64_t inner_bytes = elem;
  for (int i = dim + 1; i < ndim; ++i) inner_bytes *= static_cast<uint64_t>(shape[i]);

  const uint64_t part_bytes = static_cast<uint64_t>(part->length) * inner_bytes;
  const uint64_t src_pitch = static_cast<uint64_t>(dim_len) * inner_bytes;
  const uint64_t dst_pitch = part_bytes * spec.fused_chunks;
  layout.shape[dim] = part->length * spec.fused_chunks;
  layout.nbytes = outer * dst_pitch;
  if (layout.nbytes == 0) return layout;

  for (int c = 0; c < spec.fused_chunks; ++c) {
    CopyRegion r;
    r.src_offset = (static_cast<uint64_t>(c) * chunk_len + part->begin) * inner_bytes;
    r.src_pitch = src_pitch;
    r.dst_offset = c * part_bytes;
    r.dst_pitch = dst_pitch;
    r.row_bytes = part_bytes;
    r.rows = outer;
    // Rows that follow each other in both source and destination form one run.
    if (r.rows > 1 && r.row_bytes == r.src_pitch && r.row_bytes == r.dst_pitch) {
      r.row_bytes *= r.rows;
      r.rows = 1;
    }
    if (r.rows == 1) r.src_pitch = r.dst_pitch = r.row_bytes;
    layout.regions.push_back(r);
  }
  return layout;
}

}  // namespace

// In named steps: check the tensor, then lay out the replica, or check it can be cut and lay
// out the flat partition or the split.
Result<ShardLayout> PlanShard(DType dtype, const std::vector<int64_t>& shape,
                              const ShardSpec& spec) {
  CKPT_RETURN_IF_ERROR(CheckTensor(dtype, shape));
  ShardLayout layout;
  layout.dtype = dtype;
  layout.shape = shape;
  if (spec.kind == ShardSpec::Kind::kReplicate) return ReplicateLayout(std::move(layout));
  CKPT_RETURN_IF_ERROR(CheckCuttable(dtype, spec));
  if (spec.kind == ShardSpec::Kind::kFlatPartition) return FlatPartitionLayout(std::move(layout), spec);
  if (spec.kind != ShardSpec::Kind::kSplit) return InvalidArgument("unknown shard kind");
  return SplitLayout(std::move(layout), spec);
}

Status GatherShard(const ShardLayout& layout, const void* tensor, void* dst, size_t dst_size) {
  if (dst_size < layout.nbytes) {
    return InvalidArgument("destination holds " + std::to_string(dst_size) +
                           " bytes, the shard needs " + std::to_string(layout.nbytes));
  }
  const auto* src = static_cast<const std::byte*>(tensor);
  auto* out = static_cast<std::byte*>(dst);
  if (layout.padding_bytes > 0) std::memset(out + layout.nbytes - layout.padding_bytes, 0, layout.padding_bytes);
  for (const CopyRegion& r : layout.regions) {
    for (uint64_t row = 0; row < r.rows; ++row) {
      std::memcpy(out + r.dst_offset + row * r.dst_pitch, src + r.src_offset + row * r.src_pitch,
                  r.row_bytes);
    }
  }
  return Status::Ok();
}

}  // namespace ckpt

// Tensor-parallel shard specifications and the byte regions that realise them.
//
// A shard of a row-major tensor is described by a few strided 2D copies (CopyRegion),
// the same description a host gather (GatherShard) and a GPU 2D copy use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/status.h"

namespace ckpt {

// Which part of a tensor a rank takes.
struct ShardSpec {
  enum class Kind : uint8_t {
    kReplicate,  // the whole tensor
    kSplit,      // part `rank` of `world` along `dim`
    kFlatPartition,  // ZeRO-3 / MiCS: part `rank` of `world` of the flattened tensor,
                     // ceil(numel / world) elements, zero-padded at the end as DeepSpeed does
  };
  Kind kind = Kind::kReplicate;
  int dim = 0;           // may be negative, counted from the last dimension
  int rank = 0;          // 0 <= rank < world
  int world = 1;         // >= 1
  int fused_chunks = 1;  // k >= 1: `dim` holds k equal chunks (fused QKV: 3), each split
  bool allow_uneven = false;  // if false, a chunk length not divisible by world is an error;
                              // if true, parts follow torch.tensor_split (first ranks +1)
  bool ceil_parts = false;    // with allow_uneven: parts follow torch.chunk / DTensor Shard
                              // instead (ceil(n / world) each, the last ones shorter or empty),
                              // as transformers' tensor parallelism splits

  static ShardSpec Replicate() { return {}; }
  static ShardSpec Split(int dim, int rank, int world, int fused_chunks = 1,
                         bool allow_uneven = false) {
    return {Kind::kSplit, dim, rank, world, fused_chunks, allow_uneven};
  }
  // For MiCS, pass rank % mics_shard_size and world = mics_shard_size: partitions are
  // taken within a shard group and replicated across groups.
  static ShardSpec FlatPartition(int rank, int world) { return {Kind::kFlatPartition, 0, rank, world, 1, true}; }
  // torch.chunk parts (see ceil_parts).
  static ShardSpec Chunk(int dim, int rank, int world, int fused_chunks = 1) {
    return {Kind::kSplit, dim, rank, world, fused_chunks, true, true};
  }
};

// One strided copy: `rows` rows of `row_bytes` bytes, row r read at
// src_offset + r * src_pitch (relative to the tensor's first byte) and written at
// dst_offset + r * dst_pitch (relative to the shard's first byte).
struct CopyRegion {
  uint64_t src_offset = 0;
  uint64_t src_pitch = 0;
  uint64_t dst_offset = 0;
  uint64_t dst_pitch = 0;
  uint64_t row_bytes = 0;
  uint64_t rows = 0;
};

// The shard a ShardSpec selects: its own dense row-major shape and the regions that fill
// it. The regions write every byte of the shard at most once; bytes no region writes
// (only the padding of a flat partition) are zero.
struct ShardLayout {
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  std::vector<CopyRegion> regions;
  uint64_t padding_bytes = 0;  // zero bytes at the end of the shard (flat partitions)

  // True if the shard is one contiguous run of the source tensor, so a zero-copy view
  // at source + regions[0].src_offset (or an empty shard) serves it.
  bool contiguous() const;
};

// Computes the shard of a tensor of `dtype` and `shape` selected by `spec`.
// Errors (InvalidArgument): rank/world out of range, dim out of range, fused_chunks that
// do not divide the dimension, a chunk not divisible by world unless allow_uneven.
Result<ShardLayout> PlanShard(DType dtype, const std::vector<int64_t>& shape,
                              const ShardSpec& spec);

// Copies the shard out of `tensor` (the whole source tensor) into `dst`, zeroing padding.
// Error (InvalidArgument) if dst_size < layout.nbytes; nothing is written then.
Status GatherShard(const ShardLayout& layout, const void* tensor, void* dst, size_t dst_size);

}  // namespace ckpt

// Output layouts (include/ckpt/tp_plan.h: PlanOutput, GatherOutput): the dense layout of a
// rank's output from its pieces' shards, and its gathering into host memory. What TpPlan,
// the CUDA engine, the libtorch adapter and the Python module lay outputs out with.
#include "plan/output_layout.h"

#include <algorithm>
#include <cstring>

namespace ckpt {

namespace {

// `layout`'s regions, laid out over a dense tensor of rows of `row_bytes`, moved onto the
// rows they stand for: dense row i is source row i * step (offsets relative to the piece's
// first row). A region must be whole dense rows or lie inside one row per region row (the
// shards of a whole tensor, of a dim-0 split and of a split of a later dim); Unsupported
// for any other.
Status SpreadRows(uint64_t row_bytes, int64_t step, ShardLayout* layout) {
  const uint64_t pitch = row_bytes * static_cast<uint64_t>(step);
  for (CopyRegion& r : layout->regions) {
    if (r.rows == 0 || r.row_bytes == 0) continue;
    const uint64_t row = r.src_offset / row_bytes, in_row = r.src_offset % row_bytes;
    if (r.rows == 1 && in_row == 0 && r.row_bytes % row_bytes == 0) {  // whole dense rows
      r.rows = r.row_bytes / row_bytes;
      r.row_bytes = row_bytes;
      r.src_pitch = pitch;
      r.dst_pitch = row_bytes;
    } else if ((r.rows == 1 || r.src_pitch == row_bytes) && in_row + r.row_bytes <= row_bytes) {  // a part of each row
      r.src_pitch = pitch;
    } else {
      return Unsupported("every " + std::to_string(step) + "th row of a tensor cannot be split this way");
    }
    r.src_offset = row * pitch + in_row;
  }
  return Status::Ok();
}

}  // namespace

Result<ShardLayout> PieceLayout(const ShardPiece& piece, const TensorInfo& info) {
  if (piece.flat_rows) {  // the rows of the source as 2-d [numel / last dim, last dim]
    if (info.shape.size() < 2) return InvalidArgument("flat rows of a tensor of fewer than 2 dims");
    TensorInfo flat = info;
    const int64_t last = info.shape.back();
    flat.shape = {last == 0 ? 0 : static_cast<int64_t>(NumElements(info.shape)) / last, last};
    ShardPiece rows = piece;
    rows.flat_rows = false;
    return PieceLayout(rows, flat);
  }
  if (piece.row_count < 0 && piece.row_begin == 0 && piece.row_step == 1)
    return PlanShard(info.dtype, info.shape, piece.spec);
  const int64_t step = piece.row_step;
  const int64_t rows = info.shape.empty() ? 0 : info.shape[0];
  const int64_t span = piece.row_count <= 0 || step < 1 ? piece.row_count : (piece.row_count - 1) * step + 1;
  if (info.shape.empty() || step < 1 || piece.row_begin < 0 || piece.row_count < 0 || piece.row_begin > rows ||
      span > rows - piece.row_begin)
    return InvalidArgument("rows [" + std::to_string(piece.row_begin) + ", +" + std::to_string(piece.row_count) +
                           (step == 1 ? "" : " every " + std::to_string(step)) + ") are outside the tensor");
  std::vector<int64_t> shape = info.shape;
  shape[0] = piece.row_count;
  CKPT_ASSIGN_OR_RETURN(ShardLayout layout, PlanShard(info.dtype, shape, piece.spec));
  const uint64_t row_bytes = info.shape[0] == 0 ? 0 : info.nbytes / static_cast<uint64_t>(info.shape[0]);
  if (step > 1 && row_bytes > 0) CKPT_RETURN_IF_ERROR(SpreadRows(row_bytes, step, &layout));
  const uint64_t offset = static_cast<uint64_t>(piece.row_begin) * row_bytes;
  for (CopyRegion& r : layout.regions) r.src_offset += offset;
  return layout;
}

Result<OutputLayout> PlanOutputWith(const ShardOutput& output, const TensorLookup& lookup) {
  if (output.pieces.empty()) return InvalidArgument("output '" + output.name + "' has no pieces");
  OutputLayout result;
  for (size_t i = 0; i < output.pieces.size(); ++i) {
    const ShardPiece& piece = output.pieces[i];
    const TensorInfo* info = lookup(piece.source);
    if (!info) return NotFound("output '" + output.name + "': no tensor '" + piece.source + "'");
    auto layout = PieceLayout(piece, *info);
    if (!layout.ok()) return layout.status().WithContext("tensor '" + piece.source + "'");
    if (i == 0) {
      result.dtype = layout->dtype;
      result.shape = layout->shape;
    } else {
      if (layout->dtype != result.dtype)
        return InvalidArgument("output '" + output.name + "': fused pieces differ in dtype ('" + piece.source + "')");
      if (layout->shape.size() != result.shape.size() || layout->shape.empty() ||
          !std::equal(layout->shape.begin() + 1, layout->shape.end(), result.shape.begin() + 1))
        return InvalidArgument("output '" + output.name + "': fused piece '" + piece.source +
                               "' does not match the others' shape after dim 0");
      result.shape[0] += layout->shape[0];
    }
    result.piece_offsets.push_back(result.nbytes);
    if (__builtin_add_overflow(result.nbytes, layout->nbytes, &result.nbytes))
      return InvalidArgument("output '" + output.name + "' is too large");
    result.pieces.push_back(std::move(*layout));
  }
  if (output.transpose) {
    if (result.shape.size() < 2) return InvalidArgument("output '" + output.name + "': transpose needs a 2-d or larger tensor");
    if (!output.shape.empty()) return InvalidArgument("output '" + output.name + "': transpose and a view exclude each other");
    std::swap(result.shape[result.shape.size() - 2], result.shape.back());
  }
  if (!output.shape.empty()) {
    for (int64_t d : output.shape) {
      if (d < 0) return InvalidArgument("output '" + output.name + "': negative dimension in its view");
    }
    if (NumElements(output.shape) != NumElements(result.shape))
      return InvalidArgument("output '" + output.name + "': a view of " + std::to_string(NumElements(output.shape)) +
                             " elements over " + std::to_string(NumElements(result.shape)));
    result.shape = output.shape;
  }
  return result;
}

Result<OutputLayout> PlanOutput(const ShardOutput& output, const std::vector<TensorInfo>& tensors) {
  return PlanOutputWith(output, [&](const std::string& name) -> const TensorInfo* {
    for (const TensorInfo& t : tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  });
}

Status GatherOutput(const ShardOutput& output, const OutputLayout& layout, const std::vector<const std::byte*>& sources,
                    void* dst, size_t dst_size) {
  if (dst_size < layout.nbytes)
    return InvalidArgument("output '" + output.name + "': destination holds " + std::to_string(dst_size) +
                           " bytes, it needs " + std::to_string(layout.nbytes));
  if (sources.size() != layout.pieces.size() || layout.pieces.size() != layout.piece_offsets.size())
    return InvalidArgument("output '" + output.name + "': one source pointer per piece is needed");
  auto* out = static_cast<std::byte*>(dst);
  if (!output.transpose) {
    for (size_t p = 0; p < layout.pieces.size(); ++p) {
      CKPT_RETURN_IF_ERROR(GatherShard(layout.pieces[p], sources[p], out + layout.piece_offsets[p],
                                       layout.nbytes - layout.piece_offsets[p]));
    }
    return Status::Ok();
  }
  // Transposed: gather untransposed, then write each [cols, rows] matrix (the last two dims;
  // the leading ones, if any, are a batch).
  std::vector<std::byte> tmp(layout.nbytes);
  for (size_t p = 0; p < layout.pieces.size(); ++p) {
    CKPT_RETURN_IF_ERROR(GatherShard(layout.pieces[p], sources[p], tmp.data() + layout.piece_offsets[p],
                                     layout.nbytes - layout.piece_offsets[p]));
  }
  const uint64_t esize = DTypeSize(layout.dtype);
  if (esize == 0) return Unsupported("cannot transpose a packed sub-byte dtype");
  const size_t nd = layout.shape.size();
  const uint64_t rows = static_cast<uint64_t>(layout.shape[nd - 1]), cols = static_cast<uint64_t>(layout.shape[nd - 2]);
  const uint64_t matrix = rows * cols * esize, batch = rows * cols == 0 ? 0 : layout.nbytes / matrix;
  for (uint64_t b = 0; b < batch; ++b) {
    std::byte* to = out + b * matrix;
    const std::byte* from = tmp.data() + b * matrix;
    for (uint64_t r = 0; r < rows; ++r)
      for (uint64_t c = 0; c < cols; ++c) std::memcpy(to + (c * rows + r) * esize, from + (r * cols + c) * esize, esize);
  }
  return Status::Ok();
}

}  // namespace ckpt

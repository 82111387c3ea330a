// FP8 block scales placed from their weights' shards (src/plan/block_scales.h).
#include "plan/block_scales.h"

#include <nlohmann/json.hpp>

#include "ckpt/shard.h"

namespace ckpt {

namespace {

using json = nlohmann::json;

// [begin, end) along one dimension.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
};

// "[a, b]" of a shape.
std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A block size [b0, b1] from `v` (named `what` in errors): two integers >= 1.
Result<std::array<int64_t, 2>> BlockPair(const json& v, const std::string& what) {
  if (!v.is_array() || v.size() != 2 || !v[0].is_number_integer() || !v[1].is_number_integer() ||
      v[0].get<int64_t>() < 1 || v[1].get<int64_t>() < 1 || v[0].get<int64_t>() > (int64_t{1} << 30) ||
      v[1].get<int64_t>() > (int64_t{1} << 30))
    return InvalidArgument(what + " must be [rows, cols], two integers >= 1");
  return std::array<int64_t, 2>{v[0].get<int64_t>(), v[1].get<int64_t>()};
}

// The ranges of a dimension of `length` that `spec` takes (as a split of dim 0 of a 1-d
// tensor), adjacent ones merged: PlanShard's arithmetic, the one source of it.
Result<std::vector<Range>> SpecRanges(const ShardSpec& spec, int64_t length) {
  ShardSpec s = spec;
  s.dim = 0;
  CKPT_ASSIGN_OR_RETURN(ShardLayout layout, PlanShard(DType::kU8, {length}, s));
  std::vector<Range> out;
  for (const CopyRegion& r : layout.regions) {
    const int64_t begin = static_cast<int64_t>(r.src_offset);
    const int64_t end = begin + static_cast<int64_t>(r.row_bytes * r.rows);
    if (!out.empty() && out.back().end == begin) out.back().end = end;
    else out.push_back({begin, end});
  }
  return out;
}

// What one weight piece takes: its split dim (-1: none) and its ranges along dims 0 and 1.
struct PieceRanges {
  int dim = -1;
  std::array<std::vector<Range>, 2> ranges;
};

Result<PieceRanges> WeightRanges(const ShardPiece& piece, const TensorInfo& weight) {
  PieceRanges p;
  const int64_t rows = piece.row_count < 0 ? weight.shape[0] : piece.row_count;
  p.ranges[0] = {{piece.row_begin, piece.row_begin + rows}};
  p.ranges[1] = {{0, weight.shape[1]}};
  if (piece.spec.kind == ShardSpec::Kind::kReplicate) return p;
  if (piece.spec.kind != ShardSpec::Kind::kSplit) return InvalidArgument("block scales follow splits only");
  p.dim = piece.spec.dim < 0 ? piece.spec.dim + 2 : piece.spec.dim;
  if (p.dim < 0 || p.dim > 1) return InvalidArgument("split dim out of range for a 2-d weight");
  CKPT_ASSIGN_OR_RETURN(p.ranges[p.dim], SpecRanges(piece.spec, p.dim == 0 ? rows : weight.shape[1]));
  if (p.dim == 0) {
    for (Range& r : p.ranges[0]) r = {r.begin + piece.row_begin, r.end + piece.row_begin};
  }
  return p;
}

// True if every range of `spec` (world replaced by `w`, every rank) keeps whole blocks.
bool WholeBlocksAt(ShardSpec spec, int w, int64_t length, int64_t block) {
  spec.world = w;
  for (int r = 0; r < w; ++r) {
    spec.rank = r;
    auto ranges = SpecRanges(spec, length);
    if (!ranges.ok()) return false;
    for (const Range& g : *ranges) {
      if (g.begin % block != 0 || (g.end % block != 0 && g.end != length)) return false;
    }
  }
  return true;
}

// The error for range `g` of dim `d` (of `length`) of piece `pr` cutting blocks of `block`,
// with the worlds at which the piece's split would keep whole blocks.
Status CutsBlock(const TensorInfo& weight, const TensorInfo& scale, const ShardPiece& piece, const PieceRanges& pr,
                 int d, Range g, int64_t block, int rank, int world) {
  const int64_t length = weight.shape[d];
  std::string msg = "FP8 block scales: rank " + std::to_string(rank) + " of world " + std::to_string(world) +
                    " takes " + (d == 0 ? "rows" : "columns") + " [" + std::to_string(g.begin) + ", " +
                    std::to_string(g.end) + ") of weight '" + weight.name + "' " + ShapeText(weight.shape) +
                    ", which cuts its blocks of " + std::to_string(block) + " along dim " + std::to_string(d) +
                    " (its scale '" + scale.name + "' " + ShapeText(scale.shape) +
                    " has one element per block): a rank's range must start at a multiple of " +
                    std::to_string(block) + " and end at one or at the dimension's end " + std::to_string(length);
  std::string worlds;
  const bool by_world = pr.dim == d && piece.spec.world == world && piece.row_begin == 0 && piece.row_count < 0;
  for (int w = 1; by_world && w <= std::max(8, 2 * world); ++w) {
    if (WholeBlocksAt(piece.spec, w, length, block)) worlds += (worlds.empty() ? "" : ", ") + std::to_string(w);
  }
  if (!worlds.empty()) msg += "; world sizes whose parts are whole blocks here: " + worlds;
  return InvalidArgument(msg + " (or the megatron convention, or a plan file whose split keeps whole blocks)");
}

// OK if the scale is the 2-d block grid of the 2-d weight.
Status CheckGrid(const TensorInfo& weight, const TensorInfo& scale, const std::array<int64_t, 2>& block) {
  if (weight.shape.size() != 2 || scale.shape.size() != 2)
    return InvalidArgument("FP8 block scales: '" + scale.name + "' " + ShapeText(scale.shape) + " scales weight '" +
                           weight.name + "' " + ShapeText(weight.shape) +
                           ", but block scales are placed for 2-d weights with 2-d scales only");
  const std::vector<int64_t> grid = {(weight.shape[0] + block[0] - 1) / block[0],
                                     (weight.shape[1] + block[1] - 1) / block[1]};
  if (scale.shape != grid)
    return InvalidArgument("FP8 block scales: '" + scale.name + "' has shape " + ShapeText(scale.shape) +
                           ", but weight '" + weight.name + "' " + ShapeText(weight.shape) + " in blocks of [" +
                           std::to_string(block[0]) + ", " + std::to_string(block[1]) + "] needs " + ShapeText(grid) +
                           " (another block size? the plan's \"block_scales\", or config.json's "
                           "quantization_config.weight_block_size)");
  return Status::Ok();
}

// The block range of weight range `g`.
Range Blocks(Range g, int64_t block) { return {g.begin / block, (g.end + block - 1) / block}; }

// The scale's piece for a weight piece split along dim 1: the weight's split applied to the
// scale's columns, checked to take exactly the blocks of the weight's columns.
Result<ShardPiece> ColumnPiece(const TensorInfo& scale, const ShardPiece& piece, const PieceRanges& pr,
                               const std::array<int64_t, 2>& block, int64_t in) {
  const Range rows = Blocks(pr.ranges[0][0], block[0]);
  ShardPiece s{scale.name, ShardSpec::Replicate(), rows.begin, rows.end - rows.begin};
  if (s.row_begin == 0 && s.row_count == scale.shape[0]) s.row_count = -1;
  const auto& cols = pr.ranges[1];
  if (cols.size() == 1 && cols[0].begin == 0 && cols[0].end == in) return s;
  s.spec = piece.spec;
  s.spec.dim = 1;
  auto taken = SpecRanges(s.spec, scale.shape[1]);
  bool same = taken.ok() && taken->size() == cols.size();
  for (size_t i = 0; same && i < cols.size(); ++i) {
    const Range want = Blocks(cols[i], block[1]);
    same = (*taken)[i].begin == want.begin && (*taken)[i].end == want.end;
  }
  if (!same)
    return InvalidArgument("FP8 block scales: the split of dim 1 of '" + scale.name +
                           "' cannot take exactly its weight's blocks (an unusual rule: use whole blocks per rank)");
  return s;
}

}  // namespace

Result<std::vector<ShardPiece>> ScalePieces(const TensorInfo& weight, const TensorInfo& scale,
                                            const std::vector<ShardPiece>& weight_pieces,
                                            const BlockScales& settings, int rank, int world) {
  CKPT_RETURN_IF_ERROR(CheckGrid(weight, scale, settings.block));
  std::vector<ShardPiece> out;
  for (const ShardPiece& piece : weight_pieces) {
    auto ranges = WeightRanges(piece, weight);
    if (!ranges.ok()) return ranges.status().WithContext("FP8 block scales of '" + weight.name + "'");
    for (int d = 0; d < 2; ++d) {
      for (const Range& g : ranges->ranges[d]) {
        if (g.begin % settings.block[d] != 0 || (g.end % settings.block[d] != 0 && g.end != weight.shape[d]))
          return CutsBlock(weight, scale, piece, *ranges, d, g, settings.block[d], rank, world);
      }
    }
    if (ranges->dim == 1) {
      CKPT_ASSIGN_OR_RETURN(ShardPiece s, ColumnPiece(scale, piece, *ranges, settings.block, weight.shape[1]));
      out.push_back(std::move(s));
      continue;
    }
    if (ranges->ranges[0].empty()) out.push_back({scale.name, ShardSpec::Replicate(), 0, 0});
    for (const Range& g : ranges->ranges[0]) {
      const Range b = Blocks(g, settings.block[0]);
      if (b.begin == 0 && b.end == scale.shape[0]) out.push_back({scale.name, ShardSpec::Replicate()});
      else out.push_back({scale.name, ShardSpec::Replicate(), b.begin, b.end - b.begin});
    }
  }
  return out;
}

Result<BlockScales> ParseBlockScales(const json& value) {
  BlockScales s;
  if (value.is_boolean()) {
    s.enabled = value.get<bool>();
    return s;
  }
  if (!value.is_object()) return InvalidArgument("plan \"block_scales\" is false or {\"suffix\": s, \"block\": [b0, b1]}");
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (it.key() == "suffix") {
      if (!it->is_string() || it->get<std::string>().empty())
        return InvalidArgument("plan \"block_scales\" \"suffix\" must be a non-empty string");
      s.suffix = it->get<std::string>();
    } else if (it.key() == "block") {
      CKPT_ASSIGN_OR_RETURN(s.block, BlockPair(*it, "plan \"block_scales\" \"block\""));
    } else if (it.key() != "comment") {
      return InvalidArgument("unknown key '" + it.key() + "' in plan \"block_scales\" (known: suffix, block)");
    }
  }
  return s;
}

Result<std::optional<std::array<int64_t, 2>>> ConfigBlockSize(const std::string& config_json) {
  std::optional<std::array<int64_t, 2>> none;
  if (config_json.empty()) return none;
  json j;
  try {
    j = json::parse(config_json);
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("config is not valid JSON: ") + e.what());
  }
  if (!j.is_object() || !j.contains("quantization_config") || j["quantization_config"].is_null()) return none;
  const json& q = j["quantization_config"];
  if (!q.is_object()) return InvalidArgument("config field 'quantization_config' must be an object");
  if (!q.contains("weight_block_size") || q["weight_block_size"].is_null()) return none;
  CKPT_ASSIGN_OR_RETURN(auto block, BlockPair(q["weight_block_size"], "config field 'quantization_config.weight_block_size'"));
  return std::optional<std::array<int64_t, 2>>(block);
}

std::optional<std::string> ScaleWeightName(const BlockScales& settings, const std::string& name) {
  const std::string& s = settings.suffix;
  if (!settings.enabled || name.size() <= s.size() || name.compare(name.size() - s.size(), s.size(), s) != 0)
    return std::nullopt;
  return name.substr(0, name.size() - s.size());
}

}  // namespace ckpt

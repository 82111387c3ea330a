// FP8 block scales (docs/tp-plans.md, "FP8 block scales"): a 2-d weight `P.weight` (e.g.
// F8_E4M3 [out, in]) stored with `P.weight_scale_inv` [ceil(out / b0), ceil(in / b1)],
// element [i, j] scaling the weight's block rows [b0 i, b0 (i + 1)), cols [b1 j, b1 (j + 1)).
// The plan engine places such a scale from its weight's shard: each rank's scale holds
// exactly the blocks of its weight shard (fused weights: TpPlan::Resolution::AddScale).
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "ckpt/status.h"
#include "ckpt/tensor.h"
#include "ckpt/tp_plan.h"

namespace ckpt {

// The one default block size (DeepSeek-V3, Qwen3 FP8; transformers' weight_block_size default).
inline constexpr int64_t kDefaultScaleBlock = 128;

// A plan's "block_scales" setting.
struct BlockScales {
  bool enabled = true;
  std::string suffix = "_scale_inv";  // scale name = weight name + suffix
  std::array<int64_t, 2> block = {kDefaultScaleBlock, kDefaultScaleBlock};
};

// The plan key "block_scales": false (off), or {"suffix": s, "block": [b0, b1]} (either key
// optional, defaults above). InvalidArgument naming the key for anything else.
Result<BlockScales> ParseBlockScales(const nlohmann::json& value);

// config.json's quantization_config.weight_block_size ([b0, b1]); nullopt when the config is
// empty or has none. InvalidArgument for a config that is not JSON or a malformed field.
Result<std::optional<std::array<int64_t, 2>>> ConfigBlockSize(const std::string& config_json);

// The weight name of `name` if it ends with the suffix (nullopt otherwise, or when off).
std::optional<std::string> ScaleWeightName(const BlockScales& settings, const std::string& name);

// The scale's pieces for one rank, from its weight's pieces (`weight_pieces`, as the plan
// placed the weight for rank/world). InvalidArgument naming the weight and scale when
// either is not 2-d, the scale's shape is not the weight's block grid, or a weight range cuts
// a block (a start that is not a multiple of the block, an end neither a multiple nor the
// dimension's end), with the rank, world, range, block and worlds that split evenly.
Result<std::vector<ShardPiece>> ScalePieces(const TensorInfo& weight, const TensorInfo& scale,
                                            const std::vector<ShardPiece>& weight_pieces,
                                            const BlockScales& settings, int rank, int world);

}  // namespace ckpt

// The parts of output layout (src/plan/output_layout.cc) that TpPlan::Resolve uses beyond
// the public PlanOutput (include/ckpt/tp_plan.h).
#pragma once

#include <functional>
#include <string>

#include "ckpt/shard.h"
#include "ckpt/status.h"
#include "ckpt/tensor.h"
#include "ckpt/tp_plan.h"

namespace ckpt {

// The layout of one piece: its spec applied to its rows of `info` (InvalidArgument for rows
// outside the tensor, Unsupported for a split of stepped rows other than whole rows or parts
// of each row, and PlanShard's errors).
Result<ShardLayout> PieceLayout(const ShardPiece& piece, const TensorInfo& info);

// A source tensor by name, or null when the checkpoint has none of that name.
using TensorLookup = std::function<const TensorInfo*(const std::string& name)>;
// PlanOutput with the source tensors found through `lookup`.
Result<OutputLayout> PlanOutputWith(const ShardOutput& output, const TensorLookup& lookup);

}  // namespace ckpt

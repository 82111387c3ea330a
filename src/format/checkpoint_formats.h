// Detects the format of a checkpoint path and builds its LoadPlan.
#pragma once

#include <string>

#include "ckpt/status.h"
#include "format/load_plan.h"

namespace ckpt::format {

// Plans the load of the checkpoint at `path` (a file). Detected by content:
// safetensors; anything else is Unsupported with the format named where it is known
// (PyTorch zip, legacy torch.save, ...). NotFound for a missing path.
Result<LoadPlan> PlanCheckpoint(const std::string& path);

}  // namespace ckpt::format

// Detects the format of a checkpoint path and builds its LoadPlan.
#pragma once

#include <functional>
#include <string>

#include "ckpt/status.h"
#include "format/load_plan.h"

namespace ckpt::format {

// Plans the load of the checkpoint at `path`, a file or a model folder.
// A file is detected by content: safetensors, PyTorch zip (torch.save), or a sharded
// checkpoint's `*.index.json` (shards beside it, each parsed by its own content). A folder
// is looked up in this order: model.safetensors, model.safetensors.index.json,
// pytorch_model.bin, pytorch_model.bin.index.json; NotFound listing those if none exists.
// plan.format is "safetensors", "safetensors-sharded", "pytorch" or "pytorch-sharded".
// Unsupported names the format when it is known but not handled (legacy non-zip
// torch.save, a zip that is not a PyTorch checkpoint, ...). NotFound for a missing path.
// `may_open`, when set, is asked about every file before it is opened or examined (the
// checkpoint file, a folder's chosen file, each shard an index names); its error is
// returned as is, so a refused file is never touched and its content never described.
using FileGate = std::function<Status(const std::string& path)>;
Result<LoadPlan> PlanCheckpoint(const std::string& path, const FileGate& may_open = nullptr);

}  // namespace ckpt::format

// Detects the format of a checkpoint and builds its LoadPlan, reading only through the
// descriptors its location holds.
#pragma once

#include <string>

#include "ckpt/status.h"
#include "common/opened_file.h"
#include "format/load_plan.h"

namespace ckpt::format {

// Plans the load of the checkpoint at `location` (ModelRoots::Open or LocateUnrestricted),
// a file or a model folder. A file is detected by content: safetensors, PyTorch zip
// (torch.save), or a sharded checkpoint's `*.index.json` (shards beside it, each parsed by
// its own content). A folder is looked up in this order: model.safetensors,
// model.safetensors.index.json, pytorch_model.bin, pytorch_model.bin.index.json; NotFound
// listing those if none exists. Every file (a folder's chosen file, each shard an index
// names) is opened beneath the folder's descriptor without following links, and only
// regular files are accepted. The folder's side files (kSideFileNames) are read too: one
// that is missing is ignored; one that is a symlink, not a regular file or larger than
// kMaxSideFileBytes is skipped with a line in plan.notes.
// plan.format is "safetensors", "safetensors-sharded", "pytorch" or "pytorch-sharded".
// The result has passed ValidatePlan (names, sizes). Unsupported names the format when
// it is known but not handled (legacy non-zip torch.save, a zip that is not a PyTorch
// checkpoint, ...). FailedPrecondition if a file changed while it was read.
Result<LoadPlan> PlanCheckpoint(const CheckpointLocation& location);

// PlanCheckpoint(LocateUnrestricted(path)): for tools and tests.
Result<LoadPlan> PlanCheckpoint(const std::string& path);

}  // namespace ckpt::format

// `ckptctl persist NAME DIR`: writes a loaded generation to a folder as safetensors
// (ckpt::Persist, run in ckptctl with the caller's own file permissions).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>

#include "ckpt/status.h"

namespace ckpt::ctl {

struct PersistArgs {
  std::string name;
  std::string dir;
  std::string max_shard_size = "5GB";
  bool replace = false;
  uint64_t generation = 0;
};

// Adds the `persist` subcommand to `app`, filling `args` (--json is ckptctl's global flag).
CLI::App* AddPersistCommand(CLI::App& app, PersistArgs* args);

// Runs it against the daemon at `socket`. `draw(done, total)` draws progress (may be empty;
// called only when stderr is a terminal and not --json); `end_progress` (may be empty)
// ends the drawn line before the result is printed. `interrupted()` true (ckptctl's
// Ctrl-C) cancels at the next tick: nothing is left behind. Errors are reported through `fail`
// (ckptctl's text or JSON error, returning the exit status). Returns the exit status: 0
// written, what `fail` returns on an error, 130 cancelled.
int RunPersist(const std::string& socket, bool json_output, const PersistArgs& args,
               const std::function<void(uint64_t, uint64_t)>& draw, const std::function<void()>& end_progress,
               const std::function<int(const Status&)>& fail, const std::function<bool()>& interrupted);

}  // namespace ckpt::ctl

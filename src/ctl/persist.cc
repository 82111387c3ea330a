#include "ctl/persist.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "ckpt/client.h"
#include "ckpt/persist.h"
#include "client/persist_json.h"
#include "ctl/table.h"

namespace ckpt::ctl {
namespace {

}  // namespace

CLI::App* AddPersistCommand(CLI::App& app, PersistArgs* args) {
  auto* persist = app.add_subcommand(
      "persist", "write a loaded checkpoint to a folder as safetensors (atomically; sharded above --max-shard-size)");
  persist->add_option("name", args->name, "checkpoint name")->required();
  persist->add_option("dir", args->dir, "folder to write (created; replaced as a whole with --replace)")->required();
  persist->add_option("--max-shard-size", args->max_shard_size,
                      "split into model-0000K-of-0000N.safetensors + model.safetensors.index.json above this size "
                      "(5GB = 5*10^9, 500MiB = 500*2^20, bytes)")
      ->capture_default_str();
  persist->add_flag("--replace", args->replace, "replace DIR if it exists and holds files (only regular files)");
  persist->add_option("--generation", args->generation, "persist only this generation (fail if another is current)");
  return persist;
}

int RunPersist(const std::string& socket, bool json_output, const PersistArgs& args,
               const std::function<void(uint64_t, uint64_t)>& draw, const std::function<void()>& end_progress,
               const std::function<int(const Status&)>& fail, const std::function<bool()>& interrupted) {
  auto max_shard = ParseByteSize(args.max_shard_size);
  if (!max_shard.ok()) return fail(max_shard.status().WithContext("--max-shard-size"));
  if (*max_shard == 0) return fail(InvalidArgument("--max-shard-size must be at least 1 byte"));
  auto client = Client::Connect(socket);
  if (!client.ok()) return fail(client.status());
  const bool show_progress = draw && !json_output && ::isatty(STDERR_FILENO);
  PersistOptions options;
  options.max_shard_bytes = *max_shard;
  options.replace = args.replace;
  options.expected_generation = args.generation;
  options.progress = [&](uint64_t done, uint64_t total) {
    if (interrupted()) return false;
    if (show_progress) draw(done, total);
    return true;
  };
  Result<PersistResult> result = Persist(**client, args.name, args.dir, options);
  if (end_progress) end_progress();
  if (!result.ok()) {
    if (result.status().code() == StatusCode::kCancelled) {
      fail(Cancelled("persist cancelled; '" + args.dir + "' is as it was"));
      return 130;
    }
    return fail(result.status());
  }
  const PersistResult& r = *result;
  if (json_output) {
    std::cout << EncodePersistResult(r).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return 0;
  }
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%.2f s", r.seconds);
  const bool indexed = r.files.size() > 1;
  const size_t tensor_files = indexed ? r.files.size() - 1 : r.files.size();
  std::printf("persisted '%s' (generation %llu) to %s: %llu tensors, %s in %zu file%s%s%s in %s (%s/s)\n",
              Printable(r.name).c_str(), static_cast<unsigned long long>(r.generation), Printable(r.dir).c_str(),
              static_cast<unsigned long long>(r.tensor_count), HumanBytes(r.data_bytes).c_str(),
              tensor_files, tensor_files == 1 ? "" : "s", indexed ? " + index" : "",
              r.side_files.empty() ? "" : (" + " + std::to_string(r.side_files.size()) + " side files").c_str(), secs,
              HumanBytes(static_cast<uint64_t>(r.bytes_written / std::max(r.seconds, 1e-9))).c_str());
  return 0;
}

}  // namespace ckpt::ctl

// Plans the load of a remote checkpoint with the same parsers as a local one: the small
// parts the parsers read (a safetensors header, an index, side files) are fetched with
// ranged GETs into sealed in-memory stand-ins of the objects (sparse memfds as long as the
// objects, holding only those bytes), parsed by format::PlanSafetensorsFile and
// PlanShardedCheckpoint, and each stand-in is paired with its object (URL, size, ETag as
// pinned by the first response) for HttpReader, which fetches the tensors' bytes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ckpt/status.h"
#include "format/load_plan.h"
#include "remote/http_reader.h"
#include "remote/remote_client.h"
#include "remote/remote_url.h"

namespace ckpt::remote {

struct RemotePlan {
  format::LoadPlan plan;           // plan.files: the stand-ins, never read by the loader
  std::vector<RemoteFile> files;   // parallel to plan.files
  std::shared_ptr<const RemoteClient> client;
  // "<display> <size> <etag or last-modified>" per file, for ensure's fingerprint.
  std::string Identity() const;
};

// Plans `url` (a file: safetensors or a sharded *.index.json; a folder: its
// model.safetensors.index.json, else model.safetensors, else (s3) the one index or the one
// safetensors file a listing of the prefix shows), with its folder's side files.
// `allowed(url_text)` says whether a member (a shard, a side file) may be fetched; a shard
// that may not is PermissionDenied, a side file is skipped. Errors: those of RemoteClient
// (NotFound, PermissionDenied, Unavailable, ...), Unsupported for a format other than
// safetensors ("PyTorch .bin files are not fetched remotely"), Corrupt, InvalidArgument
// from ValidatePlan; every message names the object.
Result<RemotePlan> PlanRemoteCheckpoint(const RemoteUrl& url, std::shared_ptr<const RemoteClient> client,
                                        const std::function<bool(const std::string&)>& allowed);

}  // namespace ckpt::remote

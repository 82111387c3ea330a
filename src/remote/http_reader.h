// HttpReader: the loader's FileReader engine for remote sources. Each ReadOp becomes a
// ranged GET whose body lands straight in the segment (pwrite to op.dst_fd where the op has
// it, else stores at op.dst, populated first; no temporary file, no bounce buffer);
// several threads each drive a libcurl multi handle with several transfers in flight.
// Every range carries If-Match (or If-Unmodified-Since) with the identity pinned when the
// object was planned, and its response is checked (RemoteClient::CheckResponse): a changed
// object fails the load. A failed or truncated transfer is retried with backoff for the
// bytes still missing, as RemoteClient::Classify says, within the options' bounds.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loader/file_reader.h"
#include "remote/remote_client.h"

namespace ckpt::remote {

// One plan file's remote object: op.file indexes these.
struct RemoteFile {
  ObjectRef ref;
  ObjectIdentity identity;  // pinned at plan time
};

class HttpReader : public loader::FileReader {
 public:
  // `files` parallel to the plan's files. InvalidArgument for bad options.
  static Result<std::unique_ptr<HttpReader>> Create(std::shared_ptr<const RemoteClient> client,
                                                    std::vector<RemoteFile> files,
                                                    const loader::ReaderOptions& options);

  // See FileReader::ReadAll. The SourceFiles' descriptors are not read (they stand for the
  // remote objects); on_done(i) runs on the thread whose transfer completed op i. Errors:
  // those of RemoteClient (NotFound, PermissionDenied, FailedPrecondition for a changed
  // object, Corrupt for a lying server, Unavailable once retries are exhausted), each
  // naming the object and the byte range; FailedPrecondition "load cancelled".
  Status ReadAll(const std::vector<loader::SourceFile>& files, const std::vector<loader::ReadOp>& ops,
                 const std::function<void(size_t)>& on_done, const std::function<void()>& tick) override;
  std::string Describe() const override;

 private:
  HttpReader(std::shared_ptr<const RemoteClient> client, std::vector<RemoteFile> files,
             const loader::ReaderOptions& options)
      : client_(std::move(client)), files_(std::move(files)), options_(options) {}

  std::shared_ptr<const RemoteClient> client_;
  std::vector<RemoteFile> files_;
  loader::ReaderOptions options_;
};

}  // namespace ckpt::remote

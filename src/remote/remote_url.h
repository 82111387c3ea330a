// Remote checkpoint sources (docs/remote-sources.md): the URLs a load or an ensure may
// name instead of a local path, parsed and checked before anything is fetched.
#pragma once

#include <string>
#include <vector>

#include "ckpt/status.h"

namespace ckpt::remote {

// Does `source` name a remote source (starts with a scheme "xxx://")? Such a source is
// never opened as a file; ParseRemoteUrl tells whether it is one ckptd fetches.
bool LooksRemote(const std::string& source);

// A parsed remote source.
struct RemoteUrl {
  enum class Scheme { kS3, kHttp, kHttps };
  Scheme scheme = Scheme::kS3;
  std::string bucket;     // s3 only
  std::string key;        // s3: the key or the prefix (no leading '/'); http(s): the path (leading '/')
  std::string authority;  // http(s): host[:port]
  bool folder = false;    // ends with '/': a model folder (index, shards, side files)
  std::string text;       // the source as given (checked to hold no credentials)

  // The URL of member `name` of a folder (text + name); for messages and allow checks.
  std::string Member(const std::string& name) const { return text + name; }
};

// Parses `source`: s3://bucket/key, s3://bucket/prefix/ (a folder), http(s)://host[:port]/path
// and http(s)://host[:port]/path/ (a folder). InvalidArgument for an unparseable URL (no
// bucket, no host, no path, spaces or control characters, a '..' or empty path segment),
// for credentials in it (user:password@, or any query string or fragment: presigned URLs
// would leave secrets in list and info; credentials are the daemon's, see
// docs/remote-sources.md); Unsupported for another scheme (ftp://, file://, ...).
Result<RemoteUrl> ParseRemoteUrl(const std::string& source);

// Is `source` beneath one of `allowed` (prefixes as the daemon's --remote-allow gives them:
// "s3://bucket/models/", "https://mirror.example/")? A prefix matches the source when the
// source starts with it; a prefix that does not end in '/' must also end at a '/' of the
// source or at its end ("s3://b/m" allows "s3://b/m/x" and "s3://b/m", not "s3://b/mx").
bool RemoteAllowed(const std::string& source, const std::vector<std::string>& allowed);

// The checkpoint name a load of `url` takes by default: the file name without its
// extension, or the folder's name (a folder's model.safetensors or index names the folder).
std::string DefaultRemoteName(const RemoteUrl& url);

}  // namespace ckpt::remote

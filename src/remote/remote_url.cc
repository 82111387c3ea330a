#include "remote/remote_url.h"

#include <cctype>

namespace ckpt::remote {
namespace {

bool StartsWith(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// Path segments: no empty ones (except a trailing '/'), no '.' or '..'.
Status CheckPath(const std::string& path, const std::string& source) {
  size_t at = 0;
  while (at < path.size()) {
    size_t end = path.find('/', at);
    if (end == std::string::npos) end = path.size();
    const std::string seg = path.substr(at, end - at);
    if (seg.empty() && end != path.size()) return InvalidArgument("remote source " + source + ": empty path segment");
    if (seg == "." || seg == "..") return InvalidArgument("remote source " + source + ": '.' or '..' in its path");
    at = end + 1;
  }
  return Status::Ok();
}

}  // namespace

bool LooksRemote(const std::string& source) {
  const size_t colon = source.find("://");
  if (colon == std::string::npos || colon == 0 || colon > 16) return false;
  for (size_t i = 0; i < colon; ++i) {
    if (!std::isalnum(static_cast<unsigned char>(source[i])) && source[i] != '+' && source[i] != '-' &&
        source[i] != '.') {
      return false;
    }
  }
  return true;
}

Result<RemoteUrl> ParseRemoteUrl(const std::string& source) {
  const std::string shown = source.substr(0, 512);
  if (source.size() > 4096) return InvalidArgument("remote source longer than 4096 bytes: " + shown + "...");
  for (unsigned char c : source) {
    if (c <= ' ' || c == 0x7f) return InvalidArgument("remote source with a space or control character: '" + shown + "'");
  }
  if (!LooksRemote(source)) return InvalidArgument("not a URL: '" + shown + "'");
  const size_t sep = source.find("://");
  std::string scheme = source.substr(0, sep);
  for (char& c : scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  RemoteUrl url;
  url.text = source;
  if (scheme == "s3") {
    url.scheme = RemoteUrl::Scheme::kS3;
  } else if (scheme == "https") {
    url.scheme = RemoteUrl::Scheme::kHttps;
  } else if (scheme == "http") {
    url.scheme = RemoteUrl::Scheme::kHttp;
  } else {
    return Unsupported("remote source " + shown + ": scheme '" + scheme + "' is not supported (s3://, https://, http://)");
  }
  if (source.find_first_of("?#") != std::string::npos) {
    return InvalidArgument("remote source " + shown.substr(0, shown.find_first_of("?#")) +
                           ": query strings and fragments are not accepted (a presigned URL's secrets would be shown "
                           "by list and info; the daemon signs requests with its own credentials)");
  }
  const std::string rest = source.substr(sep + 3);
  const size_t slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  if (authority.find('@') != std::string::npos) {
    return InvalidArgument("remote source " + scheme + "://...: credentials in the URL are not accepted (they are the "
                           "daemon's: see docs/remote-sources.md)");
  }
  if (authority.empty()) {
    return InvalidArgument("remote source " + shown + ": no " + (scheme == "s3" ? "bucket" : "host"));
  }
  const std::string path = slash == std::string::npos ? "" : rest.substr(slash);
  if (path.size() <= 1) {
    return InvalidArgument("remote source " + shown + ": no " + (scheme == "s3" ? "key" : "path") +
                           " (name the checkpoint file or its folder, ending with '/')");
  }
  CKPT_RETURN_IF_ERROR(CheckPath(path.substr(1), shown));
  url.folder = path.back() == '/';
  if (url.scheme == RemoteUrl::Scheme::kS3) {
    // Bucket names: 3-63 of [a-z0-9.-] (S3's rules, loosely: S3-compatible servers differ).
    if (authority.size() < 3 || authority.size() > 63) {
      return InvalidArgument("remote source " + shown + ": bucket name '" + authority + "' is not 3 to 63 characters");
    }
    for (char c : authority) {
      if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '.' ||
            c == '-' || c == '_')) {
        return InvalidArgument("remote source " + shown + ": bucket name '" + authority +
                               "' has a character other than a-z, 0-9, '.', '-', '_'");
      }
    }
    url.bucket = authority;
    url.key = path.substr(1);
  } else {
    for (char c : authority) {
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == ':' || c == '[' || c == ']' ||
            c == '_')) {
        return InvalidArgument("remote source " + shown + ": bad character in host '" + authority + "'");
      }
    }
    url.authority = authority;
    url.key = path;
  }
  return url;
}

bool RemoteAllowed(const std::string& source, const std::vector<std::string>& allowed) {
  for (const std::string& prefix : allowed) {
    if (prefix.empty() || !StartsWith(source, prefix)) continue;
    if (prefix.back() == '/' || source.size() == prefix.size() || source[prefix.size()] == '/') return true;
  }
  return false;
}

std::string DefaultRemoteName(const RemoteUrl& url) {
  std::string base = url.key;
  while (!base.empty() && base.back() == '/') base.pop_back();
  bool folder = url.folder;
  auto ends_with = [&](const std::string& suffix) {
    return base.size() >= suffix.size() && base.compare(base.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (!folder && (ends_with(".index.json") || ends_with("/model.safetensors"))) {
    if (auto slash = base.rfind('/'); slash != std::string::npos && slash > 0) {
      base.resize(slash);
      folder = true;
    }
  }
  if (auto slash = base.rfind('/'); slash != std::string::npos) base = base.substr(slash + 1);
  if (base.empty() && url.scheme == RemoteUrl::Scheme::kS3) base = url.bucket;
  if (auto dot = base.rfind('.'); !folder && dot != std::string::npos && dot > 0) base = base.substr(0, dot);
  return base;
}

}  // namespace ckpt::remote
